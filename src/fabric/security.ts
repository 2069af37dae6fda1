/**
 * The daemon's side of fabric security: loads (or creates) its CURVE keypair, keeps the worker
 * allow-list in memory, notices changes to the allow-list file without a restart, and revokes
 * registered workers whose entry disappeared, was re-issued or changed its agent scope (a
 * revoked worker whose key is still listed registers again, under its new scope).
 *
 * Invariants:
 * 1. The in-memory allow-list is only replaced by a complete, valid file; a file that fails to
 *    parse keeps the previous list (and is logged), so a half-edited file admits nobody new
 *    and drops nobody.
 * 2. Checks are synchronous and cheap (`stat`, then a read only when the file changed), so
 *    the ZAP handler may call `refreshIfChanged` for an unknown key: a key added a moment ago
 *    is admitted on its first handshake.
 * 3. Secrets are never logged: only worker ids and counts.
 */
import type { Clock, TimerHandle } from '../base/clock.ts';
import { toError } from '../base/errors.ts';
import type { Logger } from '../base/logger.ts';
import { KeyAuthenticator } from './auth.ts';
import type { BrokerOptions } from './broker-types.ts';
import { ensureDaemonKey, fileStamp, keyPaths, readAllowlist, type AllowEntry, type KeyPair, type KeyPaths } from './keys.ts';

export interface FabricSecurityOptions {
  homeDir: string;
  daemonKeyFile?: string;
  allowlistFile?: string;
  pollMs: number;
  clock: Clock;
  logger: Logger;
}

export class FabricSecurity {
  readonly paths: KeyPaths;
  readonly keys: KeyPair;
  readonly authenticator: KeyAuthenticator;
  private readonly opts: FabricSecurityOptions;
  private readonly log: Logger;
  private stamp: string | null = null;
  private entries = new Map<string, AllowEntry>();
  private timer: TimerHandle | null = null;
  private lastRefreshMs = 0;
  private onRevoked: (workerId: string, reason: string) => void = () => undefined;

  constructor(opts: FabricSecurityOptions) {
    this.opts = opts;
    this.log = opts.logger.child({ component: 'fabric-security' });
    this.paths = keyPaths(opts.homeDir, {
      ...(opts.daemonKeyFile ? { daemonKeyFile: opts.daemonKeyFile } : {}),
      ...(opts.allowlistFile ? { allowlistFile: opts.allowlistFile } : {}),
    });
    const { keys, created } = ensureDaemonKey(this.paths);
    this.keys = keys;
    this.authenticator = new KeyAuthenticator({ daemonSecretKey: keys.secretKey });
    if (created) this.log.info({ file: this.paths.daemonKey, publicKey: keys.publicKey }, 'created the daemon CURVE keypair');
    this.refresh();
  }

  /** Starts polling the allow-list; `onRevoked` is called for each worker that lost its entry. */
  start(onRevoked: (workerId: string, reason: string) => void): void {
    this.onRevoked = onRevoked;
    this.timer ??= this.opts.clock.setInterval(() => {
      try {
        this.refresh();
      } catch (e) {
        this.log.error({ err: toError(e) }, 'allow-list check failed');
      }
    }, this.opts.pollMs);
  }

  stop(): void {
    this.timer?.cancel();
    this.timer = null;
  }

  /** The broker's options for this security: its authenticator, and CURVE with the allow-list's check. */
  brokerOptions(): Required<Pick<BrokerOptions, 'authenticator' | 'curve'>> {
    return {
      authenticator: this.authenticator,
      curve: {
        publicKey: this.keys.publicKey,
        secretKey: this.keys.secretKey,
        isKeyAllowed: (k) => this.isKeyAllowed(k),
        describeKey: (k) => this.describeKey(k),
      },
    };
  }

  isKeyAllowed(publicKey: string): boolean {
    if (this.authenticator.isKeyAllowed(publicKey)) return true;
    // invariant 2, at most every 50 ms: a flood of unknown keys costs one stat per window
    const now = this.opts.clock.nowMs();
    if (now - this.lastRefreshMs < 50) return false;
    this.lastRefreshMs = now;
    this.refresh();
    return this.authenticator.isKeyAllowed(publicKey);
  }

  /** A key as log lines name it: the worker ids it is listed for, or the start of the key. */
  describeKey(publicKey: string): string {
    const ids = this.authenticator.idsOfKey(publicKey);
    return ids.length > 0 ? ids.slice(0, 4).join(',') : `key ${publicKey.slice(0, 8)}…`;
  }

  /** Re-reads the allow-list if its file changed. Returns the ids revoked by the change. */
  refresh(): string[] {
    const stamp = fileStamp(this.paths.allowlist);
    if (stamp === this.stamp) return [];
    let list: AllowEntry[];
    try {
      list = readAllowlist(this.paths.allowlist);
    } catch (e) {
      this.log.error({ file: this.paths.allowlist, err: toError(e).message }, 'allow-list unreadable; keeping the previous one');
      this.stamp = stamp;
      return [];
    }
    this.stamp = stamp;
    const next = new Map(list.map((e) => [e.worker_id, e]));
    const revoked: string[] = [];
    const reasons = new Map<string, string>();
    for (const [id, old] of this.entries) {
      const now = next.get(id);
      if (!now || now.token_sha256 !== old.token_sha256 || now.public_key !== old.public_key) {
        revoked.push(id);
        reasons.set(id, 'key revoked or re-issued');
      } else if (!sameScope(now.agents, old.agents)) {
        revoked.push(id);
        reasons.set(id, 'agent scope changed');
      }
    }
    this.entries = next;
    this.authenticator.update(list);
    this.log.info({ workers: list.length, revoked: revoked.length }, 'allow-list loaded');
    for (const id of revoked) {
      try {
        this.onRevoked(id, reasons.get(id)!);
      } catch (e) {
        this.log.error({ err: toError(e), workerId: id }, 'revocation handler failed');
      }
    }
    return revoked;
  }
}

function sameScope(a: readonly string[] | undefined, b: readonly string[] | undefined): boolean {
  if (a === undefined || b === undefined) return a === b;
  return a.length === b.length && a.every((p, i) => p === b[i]);
}
