/**
 * Worker authentication, called by the broker on every `worker_ready`.
 *
 * With CURVE on (the default), the ZAP handler admits only allow-listed public keys and
 * `KeyAuthenticator` binds the worker id to its own key: `worker_ready.auth` must carry the
 * per-worker token (scheme `key`) and a key proof over a nonce the broker sent to that connection
 * (src/fabric/proof.ts), which only the holder of the id's secret key (or the daemon) can compute.
 * The proof is needed because zeromq.js cannot tell the broker which CURVE key sent a given
 * message; the token stays as a second factor. `AllowAll` is for `--insecure` only.
 *
 * `verify` is synchronous on purpose: the broker's receive loop never awaits (a slow check
 * would stall every worker). An implementation consults in-memory state only, e.g. a key map
 * refreshed elsewhere.
 */
import { timingSafeEqual } from 'node:crypto';
import { toError } from '../base/errors.ts';
import { tokenMatches, type AllowEntry } from './keys.ts';
import { curveSharedSecret, proofMatches } from './proof.ts';

export interface WorkerAuth {
  scheme: string;
  credential: string;
  /** The nonce of the connection's `worker_challenge`, and the key proof over it. */
  nonce?: string;
  proof?: string;
}

/** What the broker tells `verify` about the connection a `worker_ready` came on. */
export interface VerifyContext {
  routingId: string;
  /**
   * The nonce the broker challenged this connection with for this worker id, when the message
   * answers one (already taken: each is good for one attempt); undefined when none is outstanding.
   */
  nonce?: string;
}

/**
 * `maxCapacity`: the worker's advertised capacity is clamped to it; `agents`: the agent scope of
 * its key (src/base/agent-scope.ts), absent = every agent; `key`: what registrations are counted by
 * (the key's public key). A refusal with `challenge` asks the broker to send a `worker_challenge`.
 */
export type AuthDecision =
  { ok: true; maxCapacity?: number; agents?: readonly string[]; key?: string } | { ok: false; reason: string; challenge?: boolean };

export interface Authenticator {
  /** Decide whether `workerId` may register. Must not throw; a throw is treated as a refusal by the broker. */
  verify(workerId: string, auth: WorkerAuth | undefined, ctx: VerifyContext): AuthDecision;
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
 * The allow-list check (scheme `key`, docs/protocol.md §13): the id must be listed, the token must
 * hash to the listed SHA-256, and the proof must be the one the id's listed public key and the
 * daemon's secret key give for the nonce the broker issued to this connection (all compared in
 * constant time). Without a proof the answer is a challenge. `update` swaps in a reloaded list;
 * `isKeyAllowed` is what the ZAP handler admits.
 */
export class KeyAuthenticator implements Authenticator {
  private byId = new Map<string, AllowEntry>();
  private keys = new Set<string>();
  /** public key → X25519 shared secret with the daemon's key (computed on first use). */
  private secrets = new Map<string, Buffer | Error>();
  private readonly daemonSecretKey: string;

  constructor(opts: { daemonSecretKey: string }, entries: AllowEntry[] = []) {
    this.daemonSecretKey = opts.daemonSecretKey;
    this.update(entries);
  }

  update(entries: AllowEntry[]): void {
    this.byId = new Map(entries.map((e) => [e.worker_id, e]));
    this.keys = new Set(entries.map((e) => e.public_key));
    for (const k of this.secrets.keys()) if (!this.keys.has(k)) this.secrets.delete(k);
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

  /** The worker ids listed with `publicKey` (for log lines). */
  idsOfKey(publicKey: string): string[] {
    return [...this.byId.values()].filter((e) => e.public_key === publicKey).map((e) => e.worker_id);
  }

  verify(workerId: string, auth: WorkerAuth | undefined, ctx: VerifyContext): AuthDecision {
    const entry = this.byId.get(workerId);
    if (!entry) return { ok: false, reason: 'worker id not on the allow-list' };
    if (auth?.scheme === 'token') {
      return { ok: false, reason: 'the token alone no longer registers: prove the key too (scheme "key", docs/protocol.md §13)' };
    }
    if (!auth || auth.scheme !== 'key') return { ok: false, reason: 'scheme "key" credentials required (docs/protocol.md §13)' };
    if (!tokenMatches(auth.credential, entry.token_sha256)) return { ok: false, reason: 'bad credential' };
    if (auth.proof === undefined && auth.nonce === undefined) return { ok: false, reason: 'key proof required', challenge: true };
    if (auth.proof === undefined || auth.nonce === undefined || auth.nonce !== ctx.nonce) {
      return { ok: false, reason: 'the nonce is not the one this connection was challenged with (expired or used?)' };
    }
    const secret = this.sharedSecret(entry.public_key);
    if (secret instanceof Error) return { ok: false, reason: `no key proof possible for this entry: ${secret.message}` };
    if (!proofMatches(secret, workerId, auth.nonce, auth.proof)) return { ok: false, reason: 'bad key proof' };
    return {
      ok: true,
      key: entry.public_key,
      ...(entry.capacity === undefined ? {} : { maxCapacity: entry.capacity }),
      ...(entry.agents === undefined ? {} : { agents: entry.agents }),
    };
  }

  private sharedSecret(publicKey: string): Buffer | Error {
    let s = this.secrets.get(publicKey);
    if (s === undefined) {
      try {
        s = curveSharedSecret(this.daemonSecretKey, publicKey);
      } catch (e) {
        s = toError(e);
      }
      this.secrets.set(publicKey, s);
    }
    return s;
  }
}
