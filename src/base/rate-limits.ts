/**
 * Rate limits, in memory and bounded whatever peers do: a fixed-window counter per key (the
 * broker's log lines, `error` answers, challenges) and token buckets per key (registrations,
 * worker RPC, replies about unknown deliveries).
 */
import type { Clock } from './clock.ts';

/** Most keys either structure remembers; beyond it, the least useful entries are dropped. */
const MAX_KEYS = 4_096;

/** At most `limit` events per key per `windowMs`; the rest are refused (and counted by the caller). */
export class WindowCounter {
  private readonly windows = new Map<string, { startMs: number; n: number; refused: number }>();
  private readonly clock: Clock;
  private readonly limit: number;
  private readonly windowMs: number;

  constructor(clock: Clock, limit: number, windowMs: number) {
    this.clock = clock;
    this.limit = limit;
    this.windowMs = windowMs;
  }

  /**
   * Counts one event of `key`. `ok`: within the limit; `refusedBefore`: how many were refused
   * since the last one allowed (for a "… suppressed" field on the next log line).
   */
  take(key: string): { ok: boolean; refusedBefore: number } {
    const now = this.clock.nowMs();
    let w = this.windows.get(key);
    let carried = 0;
    if (!w || now - w.startMs >= this.windowMs) {
      carried = w?.refused ?? 0;
      // a flood of fresh keys cannot grow the map without limit
      if (!w && this.windows.size >= MAX_KEYS) this.windows.clear();
      w = { startMs: now, n: 0, refused: carried };
      this.windows.set(key, w);
    }
    w.n++;
    if (w.n > this.limit) {
      w.refused++;
      return { ok: false, refusedBefore: 0 };
    }
    const refusedBefore = w.refused;
    w.refused = 0;
    return { ok: true, refusedBefore };
  }

  /** While `key` is at its limit in the current window: how long until the window ends (ms); else undefined. Counts nothing. */
  blockedFor(key: string): number | undefined {
    const w = this.windows.get(key);
    if (!w) return undefined;
    const left = w.startMs + this.windowMs - this.clock.nowMs();
    return left > 0 && w.n >= this.limit ? left : undefined;
  }

  delete(key: string): void {
    this.windows.delete(key);
  }
}

/**
 * One token bucket per key: `burst` tokens, refilled at `perSecond`. A key's bucket that is full
 * again is the same as none, so those are the ones dropped when the map is full.
 */
export class TokenBuckets {
  private readonly buckets = new Map<string, { tokens: number; atMs: number }>();
  private readonly clock: Clock;
  readonly perSecond: number;
  readonly burst: number;

  constructor(clock: Clock, perSecond: number, burst: number) {
    this.clock = clock;
    this.perSecond = perSecond;
    this.burst = burst;
  }

  /** Takes one token of `key`; false when its bucket is empty. */
  take(key: string): boolean {
    const now = this.clock.nowMs();
    const b = this.buckets.get(key);
    if (!b) {
      if (this.buckets.size >= MAX_KEYS) this.prune(now);
      this.buckets.set(key, { tokens: this.burst - 1, atMs: now });
      return true;
    }
    b.tokens = Math.min(this.burst, b.tokens + ((now - b.atMs) / 1000) * this.perSecond);
    b.atMs = now;
    if (b.tokens < 1) return false;
    b.tokens--;
    return true;
  }

  /** Forgets `key` (its next take starts a full bucket). */
  delete(key: string): void {
    this.buckets.delete(key);
  }

  private prune(now: number): void {
    for (const [key, b] of this.buckets) {
      if (b.tokens + ((now - b.atMs) / 1000) * this.perSecond >= this.burst) this.buckets.delete(key);
    }
    // every bucket in use: forgetting them all only lets each key start a new burst
    if (this.buckets.size >= MAX_KEYS) this.buckets.clear();
  }
}
