/**
 * The supervisor's bounded event stream (single logical reader).
 *
 * Invariants:
 * 1. `push()` never blocks and never throws: children must not be slowed down or broken by a
 *    slow or absent reader. When the buffer is full the oldest event is dropped and counted.
 * 2. A reader that fell behind first receives `{ type: 'lagged', missed }`, then the oldest
 *    event still buffered, so it knows its view has a gap.
 * 3. After `close()` the buffered events stay readable; `END_OF_EVENTS` comes only after them.
 * 4. Timeouts run on the injected clock, so tests can move time instead of sleeping.
 */
import type { Clock, TimerHandle } from '../base/clock.ts';
import { CorralError } from '../base/errors.ts';
import { END_OF_EVENTS, type EndOfEvents, type NextEventOptions, type SupervisorEvent } from './types.ts';

/** Largest timeout accepted: the 32-bit unsigned range timers are commonly limited to. */
export const MAX_TIMEOUT_MS = 4_294_967_295;

export type SupervisorEventErrorKind = 'timeout' | 'invalid_timeout';

/** Raised by `nextEvent()`; `kind` equals `code`, for callers that switch on either. */
export class SupervisorEventError extends CorralError {
  readonly kind: SupervisorEventErrorKind;

  constructor(kind: SupervisorEventErrorKind, message: string) {
    super(kind, message);
    this.name = 'SupervisorEventError';
    this.kind = kind;
  }
}

type Read = SupervisorEvent | EndOfEvents;

interface Waiter {
  resolve(value: Read): void;
  timer: TimerHandle | null;
}

export class EventStream {
  private readonly buffer: SupervisorEvent[] = [];
  private readonly waiters: Waiter[] = [];
  private missed = 0;
  private closed = false;
  private readonly capacity: number;
  private readonly clock: Clock;

  constructor(capacity: number, clock: Clock) {
    if (!Number.isInteger(capacity) || capacity < 1) {
      throw new CorralError('invalid_argument', `eventBufferSize must be a positive integer, got ${capacity}`);
    }
    this.capacity = capacity;
    this.clock = clock;
  }

  push(event: SupervisorEvent): void {
    if (this.closed) return;
    // A waiting reader has nothing buffered (otherwise it would not wait): hand it over directly.
    const waiter = this.waiters.shift();
    if (waiter) {
      waiter.timer?.cancel();
      waiter.resolve(event);
      return;
    }
    if (this.buffer.length >= this.capacity) {
      this.buffer.shift();
      this.missed++;
    }
    this.buffer.push(event);
  }

  /** No more events will be pushed; waiting readers get the end (nothing is buffered for them). */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const w of this.waiters.splice(0)) {
      w.timer?.cancel();
      w.resolve(END_OF_EVENTS);
    }
  }

  next(opts: NextEventOptions = {}): Promise<Read> {
    const { timeoutMs } = opts;
    if (timeoutMs !== undefined && !(Number.isInteger(timeoutMs) && timeoutMs >= 1 && timeoutMs <= MAX_TIMEOUT_MS)) {
      return Promise.reject(
        new SupervisorEventError('invalid_timeout', `timeoutMs must be an integer in 1..${MAX_TIMEOUT_MS}, got ${timeoutMs}`),
      );
    }
    const ready = this.take();
    if (ready) return Promise.resolve(ready);
    return new Promise<Read>((resolve, reject) => {
      const waiter: Waiter = { resolve, timer: null };
      if (timeoutMs !== undefined) {
        waiter.timer = this.clock.setTimeout(() => {
          const i = this.waiters.indexOf(waiter);
          if (i >= 0) this.waiters.splice(i, 1);
          reject(new SupervisorEventError('timeout', `no supervisor event within ${timeoutMs} ms`));
        }, timeoutMs);
      }
      this.waiters.push(waiter);
    });
  }

  /** Non-blocking read: the next event, the end, or `null` when nothing is buffered yet. */
  poll(): Read | null {
    return this.take();
  }

  /** Events buffered and not yet read (a pending `lagged` notice not included). */
  get size(): number {
    return this.buffer.length;
  }

  private take(): Read | null {
    if (this.missed > 0) {
      const missed = this.missed;
      this.missed = 0;
      return { type: 'lagged', missed };
    }
    const event = this.buffer.shift();
    if (event) return event;
    return this.closed ? END_OF_EVENTS : null;
  }
}
