/**
 * One turn running inside a worker: the handler's context, steering, cancellation, periodic
 * progress, and turning the handler's outcome into exactly one final message.
 *
 * Invariants:
 * 1. The final message (turn_result or turn_error) carries the CURRENT turn_ref, i.e. the one
 *    from the latest turn_steer; an older ref would be rejected as stale_revision.
 * 2. A cancelled turn (turn_cancel, or a terminal turn_rejected) sends nothing more: the
 *    daemon has already written it off, and a late result would only be rejected.
 * 3. At most one final message per turn; progress stops before it is sent.
 * 4. The turn leaves the worker's in-flight set before its final message is queued, so the
 *    heartbeat and the capacity check never count a turn the daemon may already have settled.
 */
import { traceLogFields, type TraceCarrier } from '../base/trace-context.ts';
import { HandlerSpan } from './tracing.ts';
import type { Clock, TimerHandle } from '../base/clock.ts';
import { toError } from '../base/errors.ts';
import type { Logger } from '../base/logger.ts';
import {
  PROTOCOL_VERSION,
  encodeFrame,
  frameBytesAbove,
  resultValuesProblem,
  turnResultBodySchema,
  type JsonValue,
  type TurnErrorBody,
  type TurnRef,
  type TurnContextWire,
  type TurnStart,
  type TranscriptMessage,
  type WorkerMessage,
} from '../fabric/protocol.ts';

/** One event a turn answers. */
export interface TurnEvent {
  id: string;
  data: JsonValue;
  enqueuedAt: string;
}

/** Called with each steer's input and the new turn_ref (already current when called). */
export type SteerListener = (input: JsonValue, turnRef: TurnRef) => void;

/** What a handler sees for one turn. */
export interface TurnContext {
  /** The current fence; replaced by every turn_steer. */
  readonly turnRef: TurnRef;
  readonly event: TurnEvent;
  /**
   * Every event this turn answers, in enqueue order, `event` first: more than one when the actor's
   * input policy coalesced events that waited (`coalesce`), else just `[event]`.
   */
  readonly events: readonly TurnEvent[];
  /** 1 for the first try of this event, then 2, 3, … */
  readonly attempt: number;
  /** Lease expiry as sent by the daemon at turn_start (progress extends it daemon-side). */
  readonly leaseExpiresAt: string;
  /**
   * The W3C trace context of this turn, for the handler's outgoing calls: the handler's own span
   * when the process traces with OpenTelemetry (docs/observability.md), else the context
   * `turn_start.trace` carried (the daemon's attempt span, or the sender's); undefined without one.
   */
  readonly trace: { readonly traceparent: string; readonly tracestate?: string | undefined } | undefined;
  /**
   * Runs a tool call: `fn`'s result, in an `execute_tool {name}` span (GenAI semantic
   * conventions) under the handler's span when the process traces; just `fn` otherwise. A
   * thrown error is recorded on the span and thrown on. `name`: 1–128 characters.
   */
  tool<T>(name: string, fn: () => Promise<T> | T, attributes?: Record<string, string | number | boolean>): Promise<T>;
  /** Aborted by turn_cancel, by a terminal turn_rejected, or by `worker.stop()`. */
  readonly signal: AbortSignal;
  readonly logger: Logger;
  /**
   * Subscribe to steering input. Steers that arrived before the first subscription are
   * replayed to it, so a handler that subscribes late loses nothing. Returns an unsubscribe.
   */
  onSteer(cb: SteerListener): () => void;
  /** Send a turn_progress now (extends the lease); the SDK also sends one periodically. */
  progress(note?: string): void;
  /**
   * Streams `data` (any JSON value, e.g. `{ delta: 'Hel' }`) to whoever watches the actor
   * (`corral watch`, `corral.watch`, the HTTP API), in order, as a `turn_chunk` (docs/protocol.md
   * §5.2). Fire and forget: the daemon shows it only while this attempt is the live one, and it
   * counts as progress. Returns false when nothing was sent: the turn is over, the chunk is
   * larger than the daemon relays (`stream_chunk_bytes`, 64 KiB by default), or the attempt's
   * stream budget is spent (`stream_turn_bytes`, 8 MiB by default, or the daemon's
   * `turn_stream_closed`): from then on every call returns false, and the SDK logs it once.
   */
  stream(data: unknown): boolean;
  /**
   * The conversation this turn continues, as sent with turn_start: its latest messages (oldest
   * first, bounded by the daemon's count and byte budget). Undefined from a daemon that sends none.
   */
  readonly context: TurnContextWire | undefined;
  /** A worker RPC for this turn (fenced by its current turn_ref); rejects with an error carrying `code`. */
  rpc(method: string, params?: unknown): Promise<unknown>;
  /** One page of older messages (`history.read`), going back from `beforeSeq` (exclusive). */
  history(opts?: { beforeSeq?: number; limit?: number }): Promise<HistoryPage>;
}

/** A page of `history.read`. */
export interface HistoryPage {
  conversation_id: string;
  /** Oldest first. */
  messages: Array<TranscriptMessage & { truncated?: true }>;
  /** Older messages exist: ask again with `beforeSeq: messages[0].seq`. */
  has_more: boolean;
  total: number;
}

/** An event to enqueue exactly once with the commit: to any actor (`agent/session`), after `delay_ms`. */
export interface Emit {
  actor: string;
  data: unknown;
  delay_ms?: number;
}

/**
 * A message to send once the turn commits (the outbox): `body` is POSTed as JSON to the sink
 * named `sink`, signed; its `webhook-id` is `<agent_uid>/<session_id>/<key>` (or, without a key,
 * one derived from the turn): the receiver's idempotency key.
 */
export interface Deliver {
  sink: string;
  body: unknown;
  /** The message's key, unique per actor and sink: its `webhook-id` ends with it, and the request carries it as `corral-key`. */
  key?: string;
}

/** What a handler resolves with; validated against the protocol before sending. */
export interface TurnOutcome {
  messages: Array<{ role: 'assistant' | 'tool'; content: unknown }>;
  output?: unknown;
  /** Durable effects: events enqueued in the commit transaction (at most 32). */
  emit?: Emit[];
  /** Outbound messages written with the commit, sent after it (at most 16). */
  deliver?: Deliver[];
}

export type TurnHandler = (ctx: TurnContext) => Promise<TurnOutcome>;

/** An error a handler may throw to choose the wire `code` and `retryable` flag. */
export interface HandlerError extends Error {
  code?: unknown;
  retryable?: unknown;
}

export interface TurnDeps {
  handler: TurnHandler;
  /** This worker's id (the handler span's `corral.worker.id`). */
  workerId: string;
  clock: Clock;
  logger: Logger;
  /** Queues `msg`; `frame` is its encoded text when the caller has it already. */
  send(msg: WorkerMessage, frame?: string): void;
  progressIntervalMs(): number;
  maxMessageBytes: number;
  /** The largest turn_chunk frame the daemon relays. */
  streamChunkBytes(): number;
  /** The most turn_chunk frame bytes the daemon relays per attempt (undefined: a daemon that does not say). */
  streamTurnBytes(): number | undefined;
  /** A worker RPC on the worker's connection. */
  rpc(turnRef: TurnRef, method: string, params: unknown): Promise<unknown>;
  /** Called once, just before the final message is queued (invariant 4). */
  finished(turn: RunningTurn): void;
}

const MAX_ERROR_MESSAGE = 4096;

/**
 * Where a turn stands in the worker. Only `moveTo` changes it:
 *  W1 `running`: its handler runs; progress and chunks go out.
 *  W2 `cancelled`: the daemon wrote it off (`turn_cancel`, a terminal `turn_rejected`): the
 *     handler is aborted and nothing more is sent (invariant 2). From `running` or `stopping`.
 *  W3 `stopping`: the worker stops: the handler is aborted, and its failure is reported as the
 *     retryable `worker_stopping`; progress still goes out. From `running`.
 *  W4 `settled` / `settled_silent`: the handler ended; the final message is queued, unless the
 *     turn was cancelled (silent). Nothing more is sent. From any of the above, once.
 */
type TurnState = 'running' | 'cancelled' | 'stopping' | 'settled' | 'settled_silent';

const TURN_MOVES: Record<TurnState, readonly TurnState[]> = {
  running: ['cancelled', 'stopping', 'settled'],
  stopping: ['cancelled', 'settled'],
  cancelled: ['settled_silent'],
  settled: [],
  settled_silent: [],
};

export class RunningTurn {
  readonly deliveryId: string;
  /** Resolves when the handler has settled and the final message (if any) is queued. */
  readonly done: Promise<void>;
  private ref: TurnRef;
  private readonly start: TurnStart;
  private readonly deps: TurnDeps;
  private turnLog: Logger | undefined;
  private readonly controller = new AbortController();
  private readonly listeners = new Set<SteerListener>();
  private pendingSteers: Array<{ input: JsonValue; ref: TurnRef }> = [];
  private progressTimer: TimerHandle | null = null;
  /** Where the turn stands (W1–W4, `moveTo`). */
  private state: TurnState = 'running';
  /** The last turn_chunk's seq. */
  private chunkSeq = 0;
  /** The turn_chunk frame bytes sent for this attempt. */
  private streamedBytes = 0;
  /** The stream budget is spent (counted here, or told by the daemon): no chunk is sent any more. */
  private streamClosed = false;
  /** The handler's span, when the process traces (src/worker/tracing.ts). */
  private readonly span: HandlerSpan | undefined;

  constructor(start: TurnStart, deps: TurnDeps) {
    this.start = start;
    this.deps = deps;
    this.span = HandlerSpan.start(start, deps.workerId);
    this.ref = start.turn_ref;
    this.deliveryId = start.turn_ref.delivery_id;
    this.done = this.run();
  }

  /** The turn's logger, made on first use: most turns log nothing, and a child logger costs a serialisation of its fields. */
  private get log(): Logger {
    this.turnLog ??= this.deps.logger.child({
      deliveryId: this.deliveryId,
      eventId: this.start.turn_ref.event_id,
      epoch: this.start.turn_ref.actor_epoch,
      attempt: this.start.attempt,
      ...traceLogFields(this.span?.carrier ?? this.start.trace),
    });
    return this.turnLog;
  }

  get turnRef(): TurnRef {
    return this.ref;
  }

  /** Adopt the steered turn_ref and hand the input to the handler. */
  steer(newRef: TurnRef, input: JsonValue): void {
    if (this.state === 'settled' || this.state === 'settled_silent') return;
    this.ref = newRef;
    this.log.debug({ revision: newRef.revision }, 'turn steered');
    // Acknowledge promptly with the new ref so the daemon knows the worker follows it.
    this.sendProgress('steered');
    if (this.listeners.size === 0) {
      this.pendingSteers.push({ input, ref: newRef });
      return;
    }
    this.notify(input, newRef);
  }

  /**
   * The handler span's context while the turn's final message awaits the daemon's answer (a
   * refusal is then recorded under it); undefined when not traced or nothing was sent.
   */
  get tracedFinal(): TraceCarrier | undefined {
    return this.state === 'settled' ? this.span?.carrier : undefined;
  }

  /** Abort and stay silent (invariant 2). `fencedOut`: the daemon refused the attempt's current fence. */
  cancel(reason: string, fencedOut = false): void {
    if (fencedOut) this.span?.fencedOut(reason);
    if (!this.moveTo('cancelled')) return;
    this.log.info({ reason }, 'turn cancelled');
    this.controller.abort(abortError(`turn cancelled: ${reason}`, 'cancelled'));
  }

  /** The daemon relays no more of this attempt's chunks (`turn_stream_closed`): stop sending them. */
  closeStream(reason: string, limitBytes: number): void {
    if (this.streamClosed) return;
    this.streamClosed = true;
    this.log.warn(
      { reason, limitBytes, sentBytes: this.streamedBytes },
      'the daemon closed the turn’s stream; ctx.stream sends nothing more',
    );
  }

  /** Abort because the worker is stopping; the handler's failure is reported as retryable. */
  abortForStop(): void {
    if (!this.moveTo('stopping')) return;
    this.controller.abort(abortError('worker stopping', 'worker_stopping'));
  }

  /** The one transition (W1–W4): false, changing nothing, when the turn cannot move there from where it is. */
  private moveTo(next: TurnState): boolean {
    if (!TURN_MOVES[this.state].includes(next)) return false;
    this.state = next;
    return true;
  }

  /** Whether anything but the final message may still go out for this turn (progress, chunks). */
  private sends(): boolean {
    return this.state === 'running' || this.state === 'stopping';
  }

  private context(): TurnContext {
    const self = this;
    const ev = this.start.event;
    return {
      get turnRef() {
        return self.ref;
      },
      event: { id: ev.id, data: ev.data, enqueuedAt: ev.enqueued_at },
      events: (this.start.events ?? [ev]).map((e) => ({ id: e.id, data: e.data, enqueuedAt: e.enqueued_at })),
      attempt: this.start.attempt,
      leaseExpiresAt: this.start.lease_expires_at,
      trace: this.span?.carrier ?? this.start.trace,
      tool(name, fn, attributes) {
        if (typeof name !== 'string' || name.length === 0 || name.length > 128) {
          return Promise.reject(new TypeError('ctx.tool: the name is a string of 1 to 128 characters'));
        }
        if (typeof fn !== 'function') return Promise.reject(new TypeError('ctx.tool: fn is a function'));
        return self.span ? self.span.tool(name, fn, attributes) : Promise.resolve().then(fn);
      },
      signal: this.controller.signal,
      get logger() {
        return self.log;
      },
      onSteer(cb) {
        self.listeners.add(cb);
        const replay = self.pendingSteers;
        self.pendingSteers = [];
        for (const s of replay) self.notifyOne(cb, s.input, s.ref);
        return () => void self.listeners.delete(cb);
      },
      progress(note) {
        self.sendProgress(note);
      },
      stream(data) {
        return self.sendChunk(data);
      },
      context: this.start.context,
      rpc(method, params) {
        return self.deps.rpc(self.ref, method, params ?? null);
      },
      async history(opts = {}) {
        const params: Record<string, number> = {};
        if (opts.beforeSeq !== undefined) params.before_seq = opts.beforeSeq;
        if (opts.limit !== undefined) params.limit = opts.limit;
        return (await self.deps.rpc(self.ref, 'history.read', params)) as HistoryPage;
      },
    };
  }

  private async run(): Promise<void> {
    // Yield once so the constructor returns (and the turn is registered) before the handler runs.
    await Promise.resolve();
    this.progressTimer = this.deps.clock.setInterval(() => this.sendProgress(), this.deps.progressIntervalMs());
    let final: WorkerMessage;
    let frame: string | undefined;
    try {
      const ctx = this.context();
      const outcome = await (this.span ? this.span.run(() => this.deps.handler(ctx)) : this.deps.handler(ctx));
      ({ msg: final, frame } = this.resultMessage(outcome));
    } catch (e) {
      final = { v: PROTOCOL_VERSION, type: 'turn_error', turn_ref: this.ref, error: this.errorBody(e) };
    }
    this.moveTo(this.state === 'cancelled' ? 'settled_silent' : 'settled');
    if (this.span) {
      const error = final.type === 'turn_error' ? final.error : undefined;
      this.span.end(this.state === 'settled_silent' ? 'cancelled' : error ? 'turn_error' : 'turn_result', error);
    }
    this.progressTimer.cancel();
    this.progressTimer = null;
    this.deps.finished(this);
    if (this.state === 'settled_silent') {
      this.log.debug({ outcome: final.type }, 'turn was cancelled; outcome not sent');
      return;
    }
    if (final.type === 'turn_error') this.log.info({ error: final.error }, 'turn failed');
    this.deps.send(final, frame);
  }

  /** The turn_result for `outcome`, with its frame (encoded once, to measure it), or the turn_error that replaces it. */
  private resultMessage(outcome: TurnOutcome): { msg: WorkerMessage; frame?: string } {
    const candidate: Record<string, unknown> = {
      v: PROTOCOL_VERSION,
      type: 'turn_result',
      turn_ref: this.ref,
      messages: (outcome as Partial<TurnOutcome> | undefined)?.messages,
    };
    if (outcome?.output !== undefined) candidate.output = outcome.output;
    if (outcome?.emit !== undefined && outcome.emit.length > 0) candidate.emit = outcome.emit;
    if (outcome?.deliver !== undefined && outcome.deliver.length > 0) candidate.deliver = outcome.deliver;
    const checked = turnResultBodySchema.safeParse(candidate);
    if (!checked.success) {
      return {
        msg: this.invalidOutcome('invalid_result', `handler outcome is not a valid turn_result: ${checked.error.issues[0]?.message ?? ''}`),
      };
    }
    // The daemon would refuse it (and encoding a value nested thousands deep would overflow the
    // stack): the attempt fails here, retried per the daemon's policy, as after its refusal.
    const unstorable = resultValuesProblem(checked.data);
    if (unstorable) {
      const code = unstorable.field === 'emit' ? 'emit_limit' : unstorable.field === 'deliver' ? 'deliver_limit' : 'unstorable_result';
      this.log.error({ code }, unstorable.why);
      return {
        msg: {
          v: PROTOCOL_VERSION,
          type: 'turn_error',
          turn_ref: this.ref,
          error: { code, message: unstorable.why.slice(0, 1000), retryable: true },
        },
      };
    }
    // Send what the handler gave (not the parsed copy): turn_ref must stay verbatim.
    const msg = candidate as unknown as WorkerMessage;
    const frame = encodeFrame(msg);
    const bytes = frameBytesAbove(frame, this.deps.maxMessageBytes);
    if (bytes !== undefined) {
      return { msg: this.invalidOutcome('result_too_large', `turn_result is ${bytes} bytes, limit ${this.deps.maxMessageBytes}`) };
    }
    return { msg, frame };
  }

  private invalidOutcome(code: string, message: string): WorkerMessage {
    this.log.error({ code }, message);
    // Not retryable: the same handler would produce the same unusable outcome.
    return { v: PROTOCOL_VERSION, type: 'turn_error', turn_ref: this.ref, error: { code, message, retryable: false } };
  }

  private errorBody(e: unknown): TurnErrorBody {
    const err = toError(e) as HandlerError;
    if (this.state === 'stopping' && this.controller.signal.aborted) {
      return { code: 'worker_stopping', message: 'worker stopped before the turn finished', retryable: true };
    }
    const code = typeof err.code === 'string' && err.code.length > 0 ? err.code.slice(0, 128) : 'handler_error';
    const retryable = typeof err.retryable === 'boolean' ? err.retryable : true;
    return { code, message: (err.message || String(e)).slice(0, MAX_ERROR_MESSAGE), retryable };
  }

  private sendProgress(note?: string): void {
    if (!this.sends()) return;
    this.deps.send({
      v: PROTOCOL_VERSION,
      type: 'turn_progress',
      turn_ref: this.ref,
      ...(note === undefined ? {} : { note: note.slice(0, 4096) }),
    });
  }

  private sendChunk(data: unknown): boolean {
    if (!this.sends() || this.streamClosed) return false;
    const msg = {
      v: PROTOCOL_VERSION,
      type: 'turn_chunk',
      turn_ref: this.ref,
      seq: this.chunkSeq + 1,
      data: data ?? null,
    } as WorkerMessage;
    let frame: string;
    try {
      frame = encodeFrame(msg);
    } catch (e) {
      this.log.warn({ err: toError(e).message }, 'stream chunk is not JSON; not sent');
      return false;
    }
    const bytes = frameBytesAbove(frame, this.deps.streamChunkBytes());
    if (bytes !== undefined) {
      this.log.warn({ bytes, limit: this.deps.streamChunkBytes() }, 'stream chunk too large; not sent');
      return false;
    }
    // counted as the daemon counts them (the frame's UTF-8 bytes): the chunk that would pass the
    // budget is never sent, where the daemon could only drop it
    const frameBytes = Buffer.byteLength(frame, 'utf8');
    const budget = this.deps.streamTurnBytes();
    if (budget !== undefined && this.streamedBytes + frameBytes > budget) {
      this.streamClosed = true;
      this.log.warn(
        { limitBytes: budget, sentBytes: this.streamedBytes },
        'the turn’s stream budget is spent; ctx.stream sends nothing more',
      );
      return false;
    }
    this.streamedBytes += frameBytes;
    this.chunkSeq++;
    this.deps.send(msg, frame);
    return true;
  }

  private notify(input: JsonValue, ref: TurnRef): void {
    for (const cb of this.listeners) this.notifyOne(cb, input, ref);
  }

  private notifyOne(cb: SteerListener, input: JsonValue, ref: TurnRef): void {
    try {
      cb(input, ref);
    } catch (e) {
      this.log.error({ err: toError(e) }, 'onSteer callback threw');
    }
  }
}

function abortError(message: string, code: string): Error {
  const err = new Error(message) as Error & { code: string; retryable: boolean };
  err.name = 'AbortError';
  err.code = code;
  err.retryable = code !== 'cancelled';
  return err;
}
