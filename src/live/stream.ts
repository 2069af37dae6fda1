/**
 * `corral.watch(actor)`, `corral watch`: the actor's live stream (src/live/events.ts), from the database and
 * its notifications alone, so it works against any daemon of the deployment.
 *
 *  V1 The database decides, notifications only wake: each wake-up reads where the followed turn
 *     stands (its row, its stored chunks after the last one yielded) and which turn came next. A
 *     chunk whose notification carries it and is the next one is yielded without a read.
 *  V2 Every turn that starts after the watch began is yielded: `turn_started`, its chunks in seq
 *     order (each once), then `turn_committed` or `turn_failed`. Chunks of an attempt are yielded
 *     only while it is the followed one: after its `turn_failed` nothing of it comes again, and
 *     the next attempt begins with `reset`.
 *  V3 An event id (`<delivery_id>:s|<seq>|e|r`) says where the stream was: `lastEventId` resumes
 *     right after it, on any daemon, while that turn's row is there. The id of another actor's
 *     turn is refused (`invalid_argument`): a stream never shows what is not its actor's.
 *  V4 A missed notification costs latency, never an event: the watch looks again after 2 s without
 *     news while a turn is followed, after 10 s otherwise, and after every reconnect (a gap). A
 *     turn that streams, and so is heard, is not read again meanwhile.
 *  V5 Bounded: a reader more than `maxBufferedBytes` behind gets an `error` (`overflow`) and the
 *     stream ends; nothing is held without limit.
 */
import { performance } from 'node:perf_hooks';
import type { ActorKey } from '../base/actor-key.ts';
import { formatActorKey } from '../base/actor-key.ts';
import { CorralError } from '../base/errors.ts';
import type { Queues } from '../db/boss/jobs.ts';
import type { DbOrTx } from '../db/client.ts';
import {
  actorOfDelivery,
  eventJobState,
  nextTurnAfter,
  parseChunkNotice,
  readChunks,
  streamChannelOf,
  turnMessages,
  turnOfDelivery,
  type WatchedTurn,
} from '../db/live/chunks.ts';
import type { TurnListener, TurnSubscription } from '../db/turns/turn-listener.ts';
import { turnChannelOf } from '../db/turns/turn-events.ts';
import {
  liveEventId,
  parseLiveEventId,
  type LiveAttempt,
  type LiveEvent,
  type LiveTurnFailed,
  type LiveWatch,
  type LiveWatchOptions,
} from './events.ts';

export const DEFAULT_MAX_BUFFERED_BYTES = 4 * 1024 * 1024;
const FOLLOWING_POLL_MS = 2_000;
const IDLE_POLL_MS = 10_000;
/** Most chunk notices held during a look; past it, the look after reads the table instead. */
const MAX_HELD = 1_000;

interface Followed {
  turn: WatchedTurn;
  startedSent: boolean;
  lastSeq: number;
  ended: boolean;
}

export interface LiveStreamDeps {
  db: DbOrTx;
  queues: Queues;
  listener: TurnListener;
}

export class LiveStream implements LiveWatch {
  readonly actor: ActorKey;
  private readonly text: string;
  private readonly deps: LiveStreamDeps;
  private readonly maxBytes: number;
  private readonly signal: AbortSignal | undefined;
  private readonly onEnd: (s: LiveStream) => void;
  private readonly lastEventId: string | undefined;
  private readonly buffer: { event: LiveEvent; bytes: number }[] = [];
  private bufferedBytes = 0;
  private waiting: ((r: IteratorResult<LiveEvent>) => void) | undefined;
  private subscriptions: TurnSubscription[] = [];
  private followed: Followed | undefined;
  /** Where the watch began: turns that started before it are not yielded (V2). */
  private since: string | undefined;
  private pendingReset = false;
  /** Chunk notices heard while a look runs, applied after it. */
  private held: { deliveryId: string; seq: number; data: string }[] = [];
  private syncing = false;
  private syncAgain = false;
  private timer: NodeJS.Timeout | undefined;
  /** When the followed turn was last heard of or read (V4). */
  private heardAtMs = 0;
  private ended = false;
  private readonly onAbort = () => void this.close();

  constructor(actor: ActorKey, deps: LiveStreamDeps, opts: LiveWatchOptions, onEnd: (s: LiveStream) => void) {
    this.actor = actor;
    this.text = formatActorKey(actor);
    this.deps = deps;
    this.maxBytes = opts.maxBufferedBytes ?? DEFAULT_MAX_BUFFERED_BYTES;
    this.signal = opts.signal;
    this.lastEventId = opts.lastEventId;
    this.onEnd = onEnd;
  }

  /** Listens first, then reads where the actor stands: nothing that happens from then on is missed. */
  async start(): Promise<void> {
    if (this.signal?.aborted) return this.finish();
    // wake-ups before the first look only ask for it (one look at a time)
    this.syncing = true;
    const wake = () => this.wake();
    const mine = (agent: string, session: string) => agent === this.actor.agentUid && session === this.actor.sessionId;
    this.subscriptions.push(
      await this.deps.listener.subscribe(turnChannelOf(this.text), {
        notices: (ns) => {
          if (ns.some((n) => mine(n.agentUid, n.sessionId))) wake();
        },
        gap: wake,
      }),
      await this.deps.listener.subscribe(streamChannelOf(this.text), {
        payload: (p) => {
          const n = parseChunkNotice(p);
          if (n && mine(n.agentUid, n.sessionId) && !this.chunkNoticed(n.deliveryId, n.seq, n.data)) wake();
        },
        gap: wake,
      }),
    );
    this.signal?.addEventListener('abort', this.onAbort, { once: true });
    try {
      await this.resumeFrom(this.lastEventId);
    } finally {
      this.syncing = false;
    }
    await this.sync();
  }

  /** V3: the followed turn of `lastEventId`, or none (then the live turn, if any, from its start). */
  private async resumeFrom(lastEventId: string | undefined): Promise<void> {
    const at = lastEventId === undefined ? undefined : parseLiveEventId(lastEventId);
    // V3: an id is a place in this actor's stream only: another actor's is refused, never followed
    const owner = at && (await actorOfDelivery(this.deps.db, at.deliveryId));
    if (owner !== undefined && owner !== this.text) {
      throw new CorralError('invalid_argument', `last event id ${lastEventId} is not an event of the stream of ${this.text}`);
    }
    const turn = at && (await turnOfDelivery(this.deps.db, this.deps.queues, at.deliveryId));
    if (at && turn) {
      this.followed = { turn, startedSent: at.at !== 'r', lastSeq: typeof at.at === 'number' ? at.at : 0, ended: at.at === 'e' };
      this.since = turn.startedAt;
      return;
    }
    // a fresh watch takes up the live turn from its start, and every later one
    const live = await nextTurnAfter(this.deps.db, this.deps.queues, this.actor, undefined);
    if (live && live.status === 'started') this.followed = { turn: live, startedSent: false, lastSeq: 0, ended: false };
    this.since = live?.startedAt ?? '-infinity';
  }

  /**
   * V1: the chunk notified is yielded here when it is the next one; false: look in the database.
   * One heard during a look waits for its end (up to MAX_HELD of them), so a busy stream is not
   * read again for each chunk that arrives meanwhile.
   */
  private chunkNoticed(deliveryId: string, seq: number, data: string | undefined): boolean {
    if (this.syncing) {
      if (data === undefined || this.held.length >= MAX_HELD) return false;
      this.held.push({ deliveryId, seq, data });
      return true;
    }
    return this.applyChunk(deliveryId, seq, data);
  }

  private applyChunk(deliveryId: string, seq: number, data: string | undefined): boolean {
    const f = this.followed;
    if (data === undefined || !f || f.ended || !f.startedSent || f.turn.deliveryId !== deliveryId) return false;
    if (seq <= f.lastSeq) return true;
    if (seq !== f.lastSeq + 1) return false;
    this.emitChunk(f, seq, data);
    this.heardAtMs = performance.now();
    return true;
  }

  private wake(): void {
    if (this.ended) return;
    if (this.syncing) {
      this.syncAgain = true;
      return;
    }
    void this.sync();
  }

  /** V1, V2: yields what happened since the last look. One at a time; a wake-up meanwhile looks again after. */
  private async sync(): Promise<void> {
    if (this.ended) return;
    this.syncing = true;
    try {
      do {
        this.syncAgain = false;
        await this.look();
        const held = this.held;
        this.held = [];
        for (const n of held) if (!this.applyChunk(n.deliveryId, n.seq, n.data)) this.syncAgain = true;
      } while (this.syncAgain && !this.ended);
    } catch {
      // a database away for a moment: the next wake-up or poll looks again
      this.syncAgain = false;
    } finally {
      this.syncing = false;
      this.schedulePoll();
    }
  }

  private async look(): Promise<void> {
    for (let turns = 0; turns < 100 && !this.ended; turns++) {
      const f = this.followed;
      if (f && !f.ended) {
        await this.follow(f);
        if (!f.ended) return;
      }
      const next = await nextTurnAfter(this.deps.db, this.deps.queues, this.actor, f?.turn.startedAt ?? this.since);
      if (!next) return;
      if (this.pendingReset || (f && f.turn.eventId === next.eventId)) {
        this.pendingReset = false;
        this.push({ id: liveEventId(next.deliveryId, 'r'), type: 'reset', data: attemptOf(next) });
        this.followed = { turn: next, startedSent: false, lastSeq: 0, ended: false };
      } else {
        this.followed = { turn: next, startedSent: false, lastSeq: 0, ended: false };
      }
    }
  }

  /** The followed turn: its start, its chunks after the last yielded, and its end once it ended. */
  private async follow(f: Followed): Promise<void> {
    const row = await turnOfDelivery(this.deps.db, this.deps.queues, f.turn.deliveryId);
    if (!f.startedSent) {
      f.startedSent = true;
      const trace = f.turn.traceparent === null ? {} : { traceparent: f.turn.traceparent };
      this.push({
        id: liveEventId(f.turn.deliveryId, 's'),
        type: 'turn_started',
        data: { ...attemptOf(f.turn), events: f.turn.events, ...trace },
      });
    }
    for (;;) {
      const chunks = await readChunks(this.deps.db, f.turn.deliveryId, f.lastSeq, 500);
      for (const c of chunks) if (c.seq > f.lastSeq && !this.ended) this.emitChunk(f, c.seq, c.data);
      if (chunks.length < 500 || this.ended) break;
    }
    if (row && row.status === 'started') return;
    f.ended = true;
    if (row?.status === 'succeeded') {
      const messages = await turnMessages(this.deps.db, row.turnId);
      this.push({
        id: liveEventId(f.turn.deliveryId, 'e'),
        type: 'turn_committed',
        data: { ...attemptOf(row), messages, output: row.output },
      });
      return;
    }
    const reason = await this.failureOf(row ?? f.turn);
    if (reason === 'failed' || reason === 'interrupted') this.pendingReset = true;
    this.push({ id: liveEventId(f.turn.deliveryId, 'e'), type: 'turn_failed', data: { ...attemptOf(row ?? f.turn), reason } });
  }

  private async failureOf(turn: WatchedTurn): Promise<LiveTurnFailed['reason']> {
    if (turn.status === 'cancelled') return 'cancelled';
    if (turn.status === 'interrupted') return 'interrupted';
    const job = await eventJobState(this.deps.db, this.deps.queues, turn.eventId);
    if (job === 'cancelled') return 'cancelled';
    if (job === undefined || job === 'failed') return 'dead_lettered';
    return 'failed';
  }

  private emitChunk(f: Followed, seq: number, data: string): void {
    f.lastSeq = seq;
    this.push(
      { id: liveEventId(f.turn.deliveryId, seq), type: 'chunk', data: { ...attemptOf(f.turn), seq, data: JSON.parse(data) as unknown } },
      data.length,
    );
  }

  /** V4 */
  private schedulePoll(): void {
    if (this.ended) return;
    clearTimeout(this.timer);
    this.heardAtMs = performance.now();
    const following = this.followed !== undefined && !this.followed.ended;
    this.timer = setTimeout(() => this.pollDue(), following ? FOLLOWING_POLL_MS : IDLE_POLL_MS);
    this.timer.unref?.();
  }

  /** V4: a look, unless the followed turn was heard of lately; then later. */
  private pollDue(): void {
    const quietMs = performance.now() - this.heardAtMs;
    const following = this.followed !== undefined && !this.followed.ended;
    if (following && quietMs < FOLLOWING_POLL_MS) {
      this.timer = setTimeout(() => this.pollDue(), FOLLOWING_POLL_MS - quietMs);
      this.timer.unref?.();
      return;
    }
    this.wake();
  }

  /** V5 */
  private push(event: LiveEvent, dataBytes = 0): void {
    if (this.ended) return;
    if (this.waiting) {
      const w = this.waiting;
      this.waiting = undefined;
      w({ value: event, done: false });
      return;
    }
    const bytes = 200 + dataBytes;
    if (this.bufferedBytes + bytes > this.maxBytes) {
      this.buffer.length = 0;
      this.bufferedBytes = 0;
      this.buffer.push({
        event: {
          id: event.id,
          type: 'error',
          data: { code: 'overflow', message: `the reader fell more than ${this.maxBytes} bytes behind; watch again to resume` },
        },
        bytes: 0,
      });
      void this.close({ keepBuffer: true });
      return;
    }
    this.buffer.push({ event, bytes });
    this.bufferedBytes += bytes;
  }

  next(): Promise<IteratorResult<LiveEvent>> {
    const head = this.buffer.shift();
    if (head) {
      this.bufferedBytes -= head.bytes;
      return Promise.resolve({ value: head.event, done: false });
    }
    if (this.ended) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve) => (this.waiting = resolve));
  }

  async return(): Promise<IteratorResult<LiveEvent>> {
    await this.close();
    return { value: undefined, done: true };
  }

  [Symbol.asyncIterator](): AsyncIterator<LiveEvent> {
    return this;
  }

  /** Ends the stream: the iterator yields what it holds (after an overflow, the `error`), then finishes. */
  async close(opts: { keepBuffer?: boolean } = {}): Promise<void> {
    if (this.ended) return;
    this.ended = true;
    if (!opts.keepBuffer) {
      this.buffer.length = 0;
      this.bufferedBytes = 0;
    }
    clearTimeout(this.timer);
    this.signal?.removeEventListener('abort', this.onAbort);
    const w = this.waiting;
    this.waiting = undefined;
    w?.({ value: undefined, done: true });
    const subs = this.subscriptions;
    this.subscriptions = [];
    await Promise.all(subs.map((s) => s.close().catch(() => undefined)));
    this.onEnd(this);
  }

  private finish(): void {
    this.ended = true;
    this.onEnd(this);
  }
}

function attemptOf(t: Pick<WatchedTurn, 'eventId' | 'epoch' | 'attempt'>): LiveAttempt {
  return { event_id: t.eventId, epoch: t.epoch, attempt: t.attempt };
}
