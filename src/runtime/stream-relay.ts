/**
 * The stream relay: a running turn's `turn_chunk`s, judged against the turn this process runs and
 * written in groups to `corral.stream_chunks` (src/db/live/chunks.ts), from where any daemon's
 * watchers read them.
 *
 *  R1 A chunk is relayed only while its delivery is the live one this process runs, from the worker
 *     holding it (the in-memory fence, `holdsLiveTurn`); the insert checks the delivery row again
 *     (S1). A chunk of a stale, unknown or ended delivery is dropped and counted, never answered:
 *     chunks are fire-and-forget, and the turn's final message gets its own answer.
 *  R2 Per attempt, chunks are relayed in increasing `seq`; a repeated or older seq is dropped.
 *  R3 Bounded: a chunk frame above `chunkBytes`, chunks past `turnBytes` for one attempt, and
 *     chunks that would take the bytes waiting to be written past `backlogBytes` are dropped and
 *     counted. So a worker streaming without limit costs the daemon at most `backlogBytes`.
 *  R8 The first chunk of an attempt dropped for `turnBytes` closes its stream: the worker is told
 *     once (`turn_stream_closed`), so that it stops sending what could only be dropped, and every
 *     later chunk of the attempt is dropped unjudged.
 *  R4 A relayed chunk counts as progress: at most every `progressEveryMs` per attempt it extends
 *     the lease as a `turn_progress` would.
 *  R5 Inserts run in LANES lanes, each one at a time; an attempt's chunks always take the same lane,
 *     so they are stored and notified in seq order; the chunks that arrive while a lane writes go
 *     together in its next insert.
 *  R6 The chunks of an attempt that ended are deleted (S3), a few seconds after it ended.
 *  R7 A result waits for the chunks that came before it (`written`): they are stored before the
 *     commit ends the delivery, which would fail their insert's fence (S1) and lose them.
 */
import type { Clock } from '../base/clock.ts';
import type { DbOrTx } from '../db/client.ts';
import { deleteChunks, insertChunks, streamChannelOf, type ChunkRow } from '../db/live/chunks.ts';
import { errorMessage } from '../base/errors.ts';
import { unstorableReason } from '../base/json-safety.ts';
import type { Logger } from '../base/logger.ts';
import type { BrokerEvent } from '../fabric/broker.ts';
import { workerOf, type InFlightTurn } from './directory.ts';
import type { WireTurnRef } from './fence.ts';

type ChunkEvent = Extract<BrokerEvent, { kind: 'turn_chunk' }>;

export const CHUNK_OUTCOMES = [
  'relayed',
  'stale',
  'out_of_order',
  'too_large',
  'turn_limit',
  'backlog',
  'unstorable',
  'write_failed',
] as const;
export type ChunkOutcome = (typeof CHUNK_OUTCOMES)[number];

export interface StreamRelayOptions {
  db: DbOrTx;
  /** The turn this process runs for an event (the dispatcher's). */
  turnOf(eventId: string): InFlightTurn | undefined;
  /** R4: the lease extension of a `turn_progress`. */
  progress(workerId: string, ref: WireTurnRef): void;
  /** R8: tells the worker that the attempt's stream is closed (its budget, `limitBytes`, is spent). */
  closed(workerId: string, ref: WireTurnRef, limitBytes: number): void;
  clock: Clock;
  logger: Logger;
  chunkBytes: number;
  turnBytes: number;
  backlogBytes: number;
  progressEveryMs: number;
  /** Counts each chunk by what became of it. */
  counted?: (outcome: ChunkOutcome) => void;
}

/** R1: whether `ref` is the live attempt `turn` of this process, sent by the worker that holds it. */
export function holdsLiveTurn(turn: InFlightTurn | undefined, workerId: string, ref: WireTurnRef): turn is InFlightTurn {
  if (!turn || workerOf(turn) !== workerId) return false;
  const f = turn.fence;
  // a chunk sent just before a steer reached the worker carries the revision before it: same attempt
  return (
    f.deliveryId === ref.delivery_id &&
    f.activationUid === ref.activation_uid &&
    f.actorEpoch === ref.actor_epoch &&
    f.eventId === ref.event_id &&
    f.agentUid === ref.agent_uid &&
    f.sessionId === ref.session_id &&
    ref.revision <= f.revision
  );
}

interface Streaming {
  eventId: string;
  seq: number;
  bytes: number;
  channel: string;
  lastProgressMs: number;
  /** R8: its budget is spent and its worker told. */
  closed: boolean;
  /** R5: the lane its chunks take. */
  lane: Lane;
  /** R7: its chunks not written yet, and who waits for them. */
  unwritten: number;
  waiters: (() => void)[];
}

/** R5: most chunk bytes in one insert (its JSON text, the driver's buffer and the server's copy each hold them). */
const GROUP_BYTES = 1024 * 1024;

type PendingChunk = ChunkRow & { bytes: number };

/** R5: inserts in flight at once (PostgreSQL takes them on as many cores). */
const LANES = 2;

interface Lane {
  pending: PendingChunk[];
  writing: Promise<void> | undefined;
}

/** R6: how often ended attempts' chunks are looked for and deleted. */
const SWEEP_MS = 2_000;

export class StreamRelay {
  private readonly opts: StreamRelayOptions;
  private readonly log: Logger;
  private readonly streaming = new Map<string, Streaming>();
  private readonly lanes: Lane[] = Array.from({ length: LANES }, () => ({ pending: [], writing: undefined }));
  private pendingBytes = 0;
  private nextLane = 0;
  private sweepTimer: ReturnType<Clock['setInterval']> | undefined;
  private stopped = false;

  constructor(opts: StreamRelayOptions) {
    this.opts = opts;
    this.log = opts.logger.child({ component: 'stream' });
  }

  /** Called from the broker's receive loop: judges the chunk now, writes it later. Never throws. */
  chunk(e: ChunkEvent): void {
    const ref = e.turnRef;
    const turn = this.opts.turnOf(ref.event_id);
    if (this.stopped || !holdsLiveTurn(turn, e.workerId, ref)) return this.count('stale');
    if (e.bytes > this.opts.chunkBytes) return this.count('too_large');
    let s = this.streaming.get(ref.delivery_id);
    if (s?.closed) return this.count('turn_limit');
    if (s && e.seq <= s.seq) return this.count('out_of_order');
    if ((s?.bytes ?? 0) + e.bytes > this.opts.turnBytes) {
      s ??= this.track(ref);
      s.closed = true;
      this.opts.closed(e.workerId, ref, this.opts.turnBytes);
      return this.count('turn_limit');
    }
    if (this.pendingBytes + e.bytes > this.opts.backlogBytes) return this.count('backlog');
    if (unstorableReason(e.data) !== null) return this.count('unstorable');
    s ??= this.track(ref);
    s.seq = e.seq;
    s.bytes += e.bytes;
    s.unwritten++;
    s.lane.pending.push({
      deliveryId: ref.delivery_id,
      seq: e.seq,
      agentUid: ref.agent_uid,
      sessionId: ref.session_id,
      epoch: ref.actor_epoch,
      attempt: turn.started.attempt,
      data: JSON.stringify(e.data),
      channel: s.channel,
      bytes: e.bytes,
    });
    this.pendingBytes += e.bytes;
    this.count('relayed');
    const now = this.opts.clock.nowMs();
    if (now - s.lastProgressMs >= this.opts.progressEveryMs) {
      s.lastProgressMs = now;
      this.opts.progress(e.workerId, ref);
    }
    s.lane.writing ??= this.write(s.lane);
  }

  /** Starts following an attempt's stream (forgotten by the sweep once the attempt ended, R6). */
  private track(ref: WireTurnRef): Streaming {
    const s: Streaming = {
      eventId: ref.event_id,
      seq: 0,
      bytes: 0,
      channel: streamChannelOf(`${ref.agent_uid}/${ref.session_id}`),
      lastProgressMs: 0,
      closed: false,
      lane: this.lanes[this.nextLane++ % LANES]!,
      unwritten: 0,
      waiters: [],
    };
    this.streaming.set(ref.delivery_id, s);
    this.sweepTimer ??= this.opts.clock.setInterval(() => this.sweep(), SWEEP_MS);
    return s;
  }

  /** R5: writes what is pending in `lane`, a group at a time, until nothing is. */
  private async write(lane: Lane): Promise<void> {
    try {
      // let the rest of this round of socket reads join the first group
      await new Promise<void>((resolve) => setImmediate(resolve));
      while (lane.pending.length > 0) {
        const rows = takeGroup(lane.pending);
        const bytes = rows.reduce((n, r) => n + r.bytes, 0);
        try {
          await insertChunks(this.opts.db, rows);
        } catch (err) {
          // a lost chunk is a gap the watchers fill from the transcript at the commit: never a retry loop here
          for (let i = 0; i < rows.length; i++) this.count('write_failed');
          this.log.warn({ err: errorMessage(err).slice(0, 300), chunks: rows.length }, 'stream chunks not written');
        } finally {
          this.pendingBytes -= bytes;
          this.markWritten(rows);
        }
      }
    } finally {
      lane.writing = undefined;
    }
  }

  /**
   * R7: undefined when every chunk of `deliveryId` received so far is written (the common case,
   * and every turn that streams nothing: no promise, no wait), else a promise of that.
   */
  written(deliveryId: string): Promise<void> | undefined {
    const s = this.streaming.get(deliveryId);
    if (!s || s.unwritten === 0) return undefined;
    return new Promise((resolve) => s.waiters.push(resolve));
  }

  private markWritten(rows: readonly PendingChunk[]): void {
    for (const r of rows) {
      const s = this.streaming.get(r.deliveryId);
      if (!s) continue;
      s.unwritten--;
      if (s.unwritten === 0 && s.waiters.length > 0) for (const w of s.waiters.splice(0)) w();
    }
  }

  /** R6: forgets the attempts that ended here and deletes their chunks. */
  private sweep(): void {
    const ended: string[] = [];
    for (const [deliveryId, s] of this.streaming) {
      if (this.opts.turnOf(s.eventId)?.fence.deliveryId !== deliveryId) ended.push(deliveryId);
    }
    if (ended.length === 0) {
      if (this.streaming.size === 0) this.stopSweeping();
      return;
    }
    for (const id of ended) {
      for (const w of this.streaming.get(id)?.waiters.splice(0) ?? []) w();
      this.streaming.delete(id);
    }
    void deleteChunks(this.opts.db, ended).catch((err: unknown) =>
      // the retention sweep deletes them later (S3)
      this.log.debug({ err: errorMessage(err).slice(0, 300) }, 'ended turns’ chunks not deleted yet'),
    );
  }

  private stopSweeping(): void {
    this.sweepTimer?.cancel();
    this.sweepTimer = undefined;
  }

  private count(outcome: ChunkOutcome): void {
    this.opts.counted?.(outcome);
  }

  /** Attempts streaming now (tests, diagnostics). */
  get streamingTurns(): number {
    return this.streaming.size;
  }

  /** Resolves once the chunks relayed so far are written (or given up). */
  async flushed(): Promise<void> {
    await Promise.all(this.lanes.map((l) => l.writing));
  }

  /** Stops relaying (shutdown); `flushed` waits for the write in progress. */
  stop(): void {
    this.stopped = true;
    this.stopSweeping();
  }
}

/** R5: the oldest pending chunks, at most GROUP_BYTES of them (at least one): a statement's text holds them all. */
function takeGroup(pending: PendingChunk[]): PendingChunk[] {
  let bytes = 0;
  let n = 0;
  while (n < pending.length && (n === 0 || bytes + pending[n]!.bytes <= GROUP_BYTES)) bytes += pending[n++]!.bytes;
  return pending.splice(0, n);
}
