/**
 * Worker authentication, called by the broker on every `worker_ready`.
 *
 * Today only `AllowAll` exists. The planned scheme (docs/protocol.md, "Security"): CURVE on
 * the transport with a ZAP allow-list of worker public keys, plus a per-worker credential in
 * `worker_ready.auth`. Both are needed because zeromq.js cannot tell the broker which CURVE key
 * sent a given message, so identity must also be proven inside the registration message.
 *
 * `verify` is synchronous on purpose: the broker's receive loop never awaits (a slow check
 * would stall every worker). An implementation consults in-memory state only, e.g. a key map
 * refreshed elsewhere.
 */
import { timingSafeEqual } from 'node:crypto';

export interface WorkerAuth {
  scheme: string;
  credential: string;
}

export type AuthDecision = { ok: true } | { ok: false; reason: string };

export interface Authenticator {
  /**
   * Decide whether `workerId` (already checked to equal `routingId`) may register.
   * Must not throw; a throw is treated as a refusal by the broker.
   */
  verify(workerId: string, auth: WorkerAuth | undefined, routingId: string): AuthDecision;
}

/** Accepts every worker. The default while the daemon listens on loopback only. */
export class AllowAll implements Authenticator {
  verify(): AuthDecision {
    return { ok: true };
  }
}

/**
 * Shared-secret check per worker id (`scheme: 'token'`). A stepping stone towards CURVE, and a
 * working example of the interface; compares in constant time so a refusal leaks no prefix.
 */
export class StaticTokenAuthenticator implements Authenticator {
  private readonly tokens: ReadonlyMap<string, string>;

  constructor(tokens: ReadonlyMap<string, string> | Record<string, string>) {
    this.tokens = tokens instanceof Map ? tokens : new Map(Object.entries(tokens));
  }

  verify(workerId: string, auth: WorkerAuth | undefined): AuthDecision {
    const expected = this.tokens.get(workerId);
    if (expected === undefined) return { ok: false, reason: 'unknown worker id' };
    if (!auth || auth.scheme !== 'token') return { ok: false, reason: 'token credential required' };
    const a = Buffer.from(auth.credential, 'utf8');
    const b = Buffer.from(expected, 'utf8');
    if (a.length !== b.length || !timingSafeEqual(a, b)) return { ok: false, reason: 'bad credential' };
    return { ok: true };
  }
}
