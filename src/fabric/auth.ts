/**
 * Worker authentication, called by the broker on every `worker_ready`.
 *
 * With CURVE on (the default), the ZAP handler admits only allow-listed public keys and
 * `KeyAuthenticator` checks the per-worker token in `worker_ready.auth`. Both are needed because
 * zeromq.js cannot tell the broker which CURVE key sent a given message, so identity must also
 * be proven inside the registration message (which travels encrypted). `AllowAll` is for
 * `--insecure` only.
 *
 * `verify` is synchronous on purpose: the broker's receive loop never awaits (a slow check
 * would stall every worker). An implementation consults in-memory state only, e.g. a key map
 * refreshed elsewhere.
 */
import { timingSafeEqual } from 'node:crypto';
import { tokenMatches, type AllowEntry } from './keys.ts';

export interface WorkerAuth {
  scheme: string;
  credential: string;
}

/** `maxCapacity`: the worker's advertised capacity is clamped to it. */
export type AuthDecision = { ok: true; maxCapacity?: number } | { ok: false; reason: string };

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

/**
 * The allow-list check (`scheme: 'token'`): the id must be listed and the token must hash to the
 * listed SHA-256 (constant-time compare). `update` swaps in a reloaded list; `publicKeys` is
 * what the ZAP handler admits.
 */
export class KeyAuthenticator implements Authenticator {
  private byId = new Map<string, AllowEntry>();
  private keys = new Set<string>();

  constructor(entries: AllowEntry[] = []) {
    this.update(entries);
  }

  update(entries: AllowEntry[]): void {
    this.byId = new Map(entries.map((e) => [e.worker_id, e]));
    this.keys = new Set(entries.map((e) => e.public_key));
  }

  isKeyAllowed(publicKey: string): boolean {
    return this.keys.has(publicKey);
  }

  has(workerId: string): boolean {
    return this.byId.has(workerId);
  }

  entry(workerId: string): AllowEntry | undefined {
    return this.byId.get(workerId);
  }

  verify(workerId: string, auth: WorkerAuth | undefined): AuthDecision {
    const entry = this.byId.get(workerId);
    if (!entry) return { ok: false, reason: 'worker id not on the allow-list' };
    if (!auth || auth.scheme !== 'token') return { ok: false, reason: 'token credential required' };
    if (!tokenMatches(auth.credential, entry.token_sha256)) return { ok: false, reason: 'bad credential' };
    return entry.capacity === undefined ? { ok: true } : { ok: true, maxCapacity: entry.capacity };
  }
}
