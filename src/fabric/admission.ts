/**
 * Which key each connection was admitted with, so that connections are limited per key (a small
 * number each) and overall, and one key can never hold the connections another needs.
 *
 * What libzmq gives (docs/protocol.md §13 "Connection limits"): the ZAP request carries the
 * client's CURVE key but not the routing id its connection will have; a ROUTER with
 * ZMQ_ROUTER_NOTIFY(connect) delivers `[routing_id, '']` as the first message of each new
 * connection, and with ZMQ_DISCONNECT_MSG a message of our choosing as the last. A ROUTER cannot
 * close one peer's connection, so a connection counts until its peer closes it.
 *
 * How keys are tied to routing ids: admissions are made one at a time. A ZAP request that may be
 * admitted is queued (per key, served round-robin across keys) and answered only when no earlier
 * admission is still waiting for its connection; the next new routing id is that admission's.
 *
 * Invariants:
 * 1. Every admission is charged to its key from the moment it is queued until its connection is
 *    seen to end (the disconnect message), or the reply is known not to have reached the peer.
 *    So a key's charge is never lower than the number of its live connections, and a key at
 *    `maxPerKey` (or the daemon at `maxConnections`) is refused at the handshake.
 * 2. An admission whose connection does not appear within `attachWaitMs` (its peer reused a
 *    routing id that is still live, which libzmq then never shows, or it vanished in the instant
 *    after the reply) stays charged to its key as *unattributed*, until the daemon restarts: it
 *    may be a live connection we cannot see, so releasing it would let a key exceed its limit.
 *    A connection that shows up late takes over the most recent unattributed charge.
 * 3. Everything is synchronous and in memory: the ZAP handler and the broker's receive loop call
 *    in, and neither waits for the other.
 * 4. Connections without a CURVE key (`--insecure`) share one key with no per-key limit: only
 *    `maxConnections` applies.
 */
import type { Clock, TimerHandle } from '../base/clock.ts';
import type { Logger } from '../base/logger.ts';
import type { ZapAnswer, ZapDecision } from './zap.ts';

/** The key of connections made without CURVE (`--insecure`): not limited per key. */
export const NO_KEY = '';

export interface AdmissionOptions {
  maxConnections: number;
  maxPerKey: number;
  /** How long an admitted connection has to appear before it is counted unattributed. */
  attachWaitMs: number;
  clock: Clock;
  log: Logger;
  /** Names a key in log lines (its worker ids); the key itself is public. */
  describe?: (key: string) => string;
}

export type AdmissionRefusal = { ok: false; status: 400; reason: string; perKey: boolean };

interface Waiting {
  key: string;
  answer: ZapAnswer;
}

export class ConnectionBook {
  private readonly opts: AdmissionOptions;
  /** routing id (hex) → the key its connection was admitted with. */
  private readonly live = new Map<string, string>();
  /** key → admissions charged to it: live + queued + waiting + unattributed. */
  private readonly charged = new Map<string, number>();
  private total = 0;
  /** Queued admissions per key; the Map's order is the round-robin order. */
  private readonly queues = new Map<string, Waiting[]>();
  private queued = 0;
  /** The admission answered and waiting for its connection, if any. */
  private waiting: { key: string; timer: TimerHandle | null } | null = null;
  /** Keys of admissions that never appeared (invariant 2), most recent last. */
  private readonly unattributed: string[] = [];
  private stopped = false;

  constructor(opts: AdmissionOptions) {
    this.opts = opts;
  }

  /** A ZAP request of `key` that passed the allow-list: refused now, or queued and answered in turn. */
  request(key: string, answer: ZapAnswer): AdmissionRefusal | undefined {
    const mine = this.charged.get(key) ?? 0;
    if (key !== NO_KEY && mine >= this.opts.maxPerKey) {
      return { ok: false, status: 400, reason: `connection limit per key reached (${this.opts.maxPerKey})`, perKey: true };
    }
    if (this.total >= this.opts.maxConnections) {
      return { ok: false, status: 400, reason: 'connection limit reached', perKey: false };
    }
    this.charged.set(key, mine + 1);
    this.total++;
    let q = this.queues.get(key);
    if (!q) this.queues.set(key, (q = []));
    q.push({ key, answer });
    this.queued++;
    this.pump();
    return undefined;
  }

  /** The first message of a routing id not seen before (the connect notification, or data). */
  connected(rid: string): void {
    if (this.live.has(rid)) return;
    let key: string;
    if (this.waiting) {
      key = this.waiting.key;
      this.waiting.timer?.cancel();
      this.waiting = null;
    } else if (this.unattributed.length > 0) {
      // invariant 2: a late connection takes the most recent charge that lost it
      key = this.unattributed.pop()!;
    } else {
      // cannot happen while every connection passes the ZAP handler; counted all the same
      this.opts.log.error({ routingId: rid.slice(0, 32) }, 'a connection appeared that no admission accounts for');
      key = NO_KEY;
      this.charged.set(key, (this.charged.get(key) ?? 0) + 1);
      this.total++;
    }
    this.live.set(rid, key);
    this.pump();
  }

  /** The disconnect message of `rid`: its charge is released. */
  disconnected(rid: string): void {
    const key = this.live.get(rid);
    if (key !== undefined) {
      this.live.delete(rid);
      this.release(key);
      return;
    }
    // a connection whose first message we never saw: the one waiting, or a late one
    if (this.waiting) {
      const w = this.waiting;
      w.timer?.cancel();
      this.waiting = null;
      this.release(w.key);
      this.pump();
    } else if (this.unattributed.length > 0) {
      this.release(this.unattributed.pop()!);
    }
  }

  /** True when `rid`'s connection was seen to start and not yet to end. */
  isLive(rid: string): boolean {
    return this.live.has(rid);
  }

  keyOf(rid: string): string | undefined {
    return this.live.get(rid);
  }

  stats(): { connections: number; queued: number; unattributed: number } {
    return { connections: this.total, queued: this.queued, unattributed: this.unattributed.length };
  }

  /** Ends the waiting timer; queued requests stay unanswered (their handshakes time out). */
  stop(): void {
    this.stopped = true;
    this.waiting?.timer?.cancel();
  }

  private release(key: string): void {
    const n = (this.charged.get(key) ?? 1) - 1;
    if (n <= 0) this.charged.delete(key);
    else this.charged.set(key, n);
    this.total = Math.max(0, this.total - 1);
  }

  /** Answers the next queued admission when none is waiting for its connection. */
  private pump(): void {
    while (!this.waiting && this.queued > 0 && !this.stopped) {
      const next = this.dequeue();
      const w: { key: string; timer: TimerHandle | null } = { key: next.key, timer: null };
      this.waiting = w;
      const ok: ZapDecision = { ok: true };
      void next.answer(ok).then((delivered) => {
        if (this.waiting !== w) return; // its connection appeared already
        if (!delivered) {
          // the peer gave up before the reply: no connection will come (invariant 1)
          this.waiting = null;
          this.release(w.key);
          this.pump();
          return;
        }
        w.timer = this.opts.clock.setTimeout(() => this.expire(w, true), this.opts.attachWaitMs);
      });
    }
  }

  private expire(w: { key: string; timer: TimerHandle | null }, first: boolean): void {
    if (this.waiting !== w) return;
    if (first) {
      // one more short wait, so a connection that is already readable (the event loop was busy
      // past the deadline) is taken in before the admission is given up on
      w.timer = this.opts.clock.setTimeout(() => this.expire(w, false), 20);
      return;
    }
    this.waiting = null;
    this.unattributed.push(w.key);
    this.opts.log.warn(
      { key: this.opts.describe?.(w.key) ?? w.key.slice(0, 40), waitedMs: this.opts.attachWaitMs },
      'an admitted connection never appeared; it stays counted against its key until the daemon restarts',
    );
    this.pump();
  }

  private dequeue(): Waiting {
    const [key, q] = this.queues.entries().next().value as [string, Waiting[]];
    const next = q.shift()!;
    this.queues.delete(key);
    // round-robin: a key with more queued goes to the back
    if (q.length > 0) this.queues.set(key, q);
    this.queued--;
    return next;
  }
}
