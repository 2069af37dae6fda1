/**
 * The injected clock. Everything that schedules work takes a `Clock`, so tests can move time
 * instead of sleeping. Lease validity is never decided here: PostgreSQL's `now()` is the lease
 * clock (see src/db/turns/activations.ts); this clock only drives local scheduling.
 */

export interface TimerHandle {
  cancel(): void;
}

export interface Clock {
  /** Milliseconds since the epoch. */
  nowMs(): number;
  /** Resolves after `ms`; rejects with the signal's reason if aborted first. */
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
  setTimeout(fn: () => void, ms: number): TimerHandle;
  setInterval(fn: () => void, ms: number): TimerHandle;
}

function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException('aborted', 'AbortError');
}

/**
 * The longest delay Node's timers honour (2^31 − 1 ms, ~24.8 days): a longer one fires after
 * ~1 ms instead (with a warning). Longer delays are chained from timers of at most this length.
 */
export const MAX_TIMER_MS = 2_147_483_647;

/** `setTimeout` for any delay: chains timers of at most `maxMs` until `ms` has passed. */
export function longTimeout(fn: () => void, ms: number, maxMs = MAX_TIMER_MS): TimerHandle {
  let remaining = Math.max(0, ms);
  let timer: ReturnType<typeof setTimeout>;
  const arm = (): void => {
    const step = Math.min(remaining, maxMs);
    remaining -= step;
    timer = setTimeout(() => (remaining > 0 ? arm() : fn()), step);
  };
  arm();
  return { cancel: () => clearTimeout(timer) };
}

export const systemClock: Clock = {
  nowMs: () => Date.now(),
  sleep(ms, signal) {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(abortReason(signal));
      const t = longTimeout(() => {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      }, ms);
      const onAbort = (): void => {
        t.cancel();
        reject(abortReason(signal!));
      };
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  },
  setTimeout(fn, ms) {
    return longTimeout(fn, ms);
  },
  setInterval(fn, ms) {
    if (ms <= MAX_TIMER_MS) {
      const t = setInterval(fn, ms);
      return { cancel: () => clearInterval(t) };
    }
    let current: TimerHandle;
    const again = (): void => {
      current = longTimeout(() => {
        again();
        fn();
      }, ms);
    };
    again();
    return { cancel: () => current.cancel() };
  },
};

/**
 * Waits for `work` for at most `ms` of `clock`'s time: true when it settled (resolved or
 * rejected) within it, false when the time ran out first. Never rejects; the timer is cancelled
 * when the work settles, so it cannot hold the process open. For the steps of a stop, each of
 * which must end whatever the database or a peer does.
 */
export async function settlesWithin(clock: Clock, ms: number, work: Promise<unknown>): Promise<boolean> {
  const timer = new AbortController();
  const settled = work.then(
    () => true,
    () => true,
  );
  try {
    return await Promise.race([settled, clock.sleep(ms, timer.signal).then(() => false)]);
  } finally {
    timer.abort();
  }
}

interface ManualTimer {
  id: number;
  at: number;
  every: number | null;
  fn: () => void;
}

/**
 * A clock that only moves when told to. `advance(ms)` fires due timers in time order and lets
 * promise continuations run between them, so code awaiting `sleep()` observes the new time.
 */
export class ManualClock implements Clock {
  private current: number;
  private timers = new Map<number, ManualTimer>();
  private nextId = 1;

  constructor(startMs = Date.UTC(2026, 0, 1)) {
    this.current = startMs;
  }

  nowMs(): number {
    return this.current;
  }

  sleep(ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(abortReason(signal));
      const handle = this.setTimeout(() => {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      }, ms);
      const onAbort = (): void => {
        handle.cancel();
        reject(abortReason(signal!));
      };
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  setTimeout(fn: () => void, ms: number): TimerHandle {
    return this.add(fn, ms, null);
  }

  setInterval(fn: () => void, ms: number): TimerHandle {
    return this.add(fn, ms, Math.max(1, ms));
  }

  /** Number of timers waiting to fire. */
  pending(): number {
    return this.timers.size;
  }

  async advance(ms: number): Promise<void> {
    const target = this.current + ms;
    await flushMicrotasks();
    for (;;) {
      const due = [...this.timers.values()].filter((t) => t.at <= target).sort((a, b) => a.at - b.at || a.id - b.id)[0];
      if (!due) break;
      this.current = Math.max(this.current, due.at);
      if (due.every === null) this.timers.delete(due.id);
      else due.at += due.every;
      due.fn();
      await flushMicrotasks();
    }
    this.current = target;
    await flushMicrotasks();
  }

  private add(fn: () => void, ms: number, every: number | null): TimerHandle {
    const id = this.nextId++;
    this.timers.set(id, { id, at: this.current + Math.max(0, ms), every, fn });
    return { cancel: () => void this.timers.delete(id) };
  }
}

async function flushMicrotasks(): Promise<void> {
  for (let i = 0; i < 20; i++) await Promise.resolve();
  await new Promise<void>((r) => setImmediate(r));
}
