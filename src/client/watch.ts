/**
 * `corral.watch(actor)`: an actor's turn events as they happen, as an async iterable, driven by
 * the daemon's notifications (src/db/turns/turn-events.ts) and nothing else.
 *
 *  W1 The watch LISTENs before `watch()` resolves: every event committed after that is yielded.
 *  W2 A lost connection is made again; the iterator then yields a `gap` event: events committed
 *     between `since` and `until` may be missing (read `transcript` / `actor` to catch up).
 *  W3 Bounded: a consumer that falls more than `maxBuffered` events behind gets the buffered
 *     events dropped and one `gap` (`reason: 'overflow'`) instead, never unbounded memory.
 *  W4 It ends (`done`) when `signal` aborts, when `close()` (or `return()`, i.e. `break` in a
 *     `for await`) is called, or when the client closes.
 */
import type { ActorKey } from '../base/actor-key.ts';
import { formatActorKey } from '../base/actor-key.ts';
import type { TurnListener, TurnSubscription } from '../db/turns/turn-listener.ts';
import { turnChannelOf } from '../db/turns/turn-events.ts';
import { DEFAULT_MAX_BUFFERED, type TurnWatch, type WatchEvent, type WatchOptions } from './api.ts';

export { DEFAULT_MAX_BUFFERED };
export type { TurnEvent, TurnWatch, WatchEvent, WatchGap, WatchOptions } from './api.ts';

export class ActorWatch implements TurnWatch {
  readonly actor: ActorKey;
  private readonly text: string;
  private readonly maxBuffered: number;
  private readonly buffer: WatchEvent[] = [];
  private waiting: ((r: IteratorResult<WatchEvent>) => void) | undefined;
  private subscription: TurnSubscription | undefined;
  private ended = false;
  private readonly signal: AbortSignal | undefined;
  private readonly onAbort = () => void this.close();
  private readonly onEnd: (w: ActorWatch) => void;

  constructor(actor: ActorKey, opts: WatchOptions, onEnd: (w: ActorWatch) => void) {
    this.actor = actor;
    this.text = formatActorKey(actor);
    this.maxBuffered = opts.maxBuffered ?? DEFAULT_MAX_BUFFERED;
    this.signal = opts.signal;
    this.onEnd = onEnd;
  }

  /** W1: resolves once the actor's channel is listened on. */
  async start(listener: TurnListener): Promise<void> {
    if (this.signal?.aborted) {
      this.ended = true;
      this.onEnd(this);
      return;
    }
    this.subscription = await listener.subscribe(turnChannelOf(this.text), {
      notices: (notices) => {
        const receivedAt = new Date();
        for (const n of notices) {
          if (n.agentUid !== this.actor.agentUid || n.sessionId !== this.actor.sessionId) continue;
          this.push({ kind: n.kind, actor: this.actor, eventId: n.eventId, epoch: n.epoch, attempt: n.attempt, receivedAt });
        }
      },
      gap: (since, until) => this.push({ kind: 'gap', reason: 'reconnected', since, until }),
    });
    this.signal?.addEventListener('abort', this.onAbort, { once: true });
    if (this.signal?.aborted) await this.close();
  }

  private push(e: WatchEvent): void {
    if (this.ended) return;
    if (this.waiting) {
      const w = this.waiting;
      this.waiting = undefined;
      w({ value: e, done: false });
      return;
    }
    if (this.buffer.length >= this.maxBuffered) {
      const first = this.buffer[0]!;
      const since = first.kind === 'gap' ? first.since : first.receivedAt;
      this.buffer.length = 0;
      this.buffer.push({ kind: 'gap', reason: 'overflow', since, until: new Date() });
    }
    this.buffer.push(e);
  }

  next(): Promise<IteratorResult<WatchEvent>> {
    const e = this.buffer.shift();
    if (e) return Promise.resolve({ value: e, done: false });
    if (this.ended) return Promise.resolve({ value: undefined, done: true });
    if (this.waiting) return Promise.reject(new Error('a watch is read by one consumer at a time'));
    return new Promise((resolve) => (this.waiting = resolve));
  }

  async return(): Promise<IteratorResult<WatchEvent>> {
    await this.close();
    return { value: undefined, done: true };
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  /** W4: ends the watch; events already buffered are dropped. */
  async close(): Promise<void> {
    if (this.ended && !this.subscription) return;
    this.ended = true;
    this.buffer.length = 0;
    this.signal?.removeEventListener('abort', this.onAbort);
    const w = this.waiting;
    this.waiting = undefined;
    w?.({ value: undefined, done: true });
    const sub = this.subscription;
    this.subscription = undefined;
    this.onEnd(this);
    await sub?.close();
  }
}
