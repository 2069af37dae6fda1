/**
 * The live stream of an actor (`corral.watch`, `corral watch`, the HTTP API's
 * `GET /v1/actors/{agent_uid}/{session_id}/stream`): one sequence of events, the same in all
 * three. For each turn, in order: `turn_started`, its `chunk`s (what the worker streamed with
 * `ctx.stream`), then `turn_committed` (the turn's messages, from the transcript) or
 * `turn_failed`. A retry after a failed attempt begins with `reset`: drop what the failed attempt
 * showed. The stream stays open across turns until it is closed; with no live turn it waits for
 * the next one. docs/client.md ("Live turns") has the rules and an example.
 */
import type { ActorKey } from '../base/actor-key.ts';

export const LIVE_EVENT_TYPES = ['turn_started', 'chunk', 'turn_committed', 'turn_failed', 'reset', 'error'] as const;
export type LiveEventType = (typeof LIVE_EVENT_TYPES)[number];

/** The attempt an event belongs to. */
export interface LiveAttempt {
  /** The event the turn answers (the first of its batch). */
  event_id: string;
  /** The actor's epoch the attempt runs under. */
  epoch: number;
  /** 1 for the first attempt of the event. */
  attempt: number;
}

export interface LiveTurnStarted extends LiveAttempt {
  /** Every event the turn answers, in order (one, or a batch under `coalesce` / `interrupt`). */
  events: { id: string; data: unknown; enqueued_at: string }[];
  /**
   * The attempt's W3C traceparent, when it has one: the daemon's `invoke_agent` span when it
   * traces, else the context the event was sent with (docs/observability.md).
   */
  traceparent?: string;
}

export interface LiveChunk extends LiveAttempt {
  /** 1, 2, 3 … within the attempt. */
  seq: number;
  /** What the worker streamed (any JSON value). */
  data: unknown;
}

export interface LiveTurnCommitted extends LiveAttempt {
  /** The turn's messages as the transcript holds them: its events' `user` messages, then the result's. */
  messages: { seq: number; role: string; content: unknown }[];
  output: unknown;
}

export interface LiveTurnFailed extends LiveAttempt {
  /** `failed`: it will be retried (a `reset` comes first); `dead_lettered`, `cancelled`: it ends here; `interrupted`: its events are in the next turn. */
  reason: 'failed' | 'dead_lettered' | 'cancelled' | 'interrupted';
}

/** The stream ends after this: `overflow` (the reader fell too far behind), `closed`. */
export interface LiveError {
  code: string;
  message: string;
}

export type LiveEvent =
  | { id: string; type: 'turn_started'; data: LiveTurnStarted }
  | { id: string; type: 'chunk'; data: LiveChunk }
  | { id: string; type: 'turn_committed'; data: LiveTurnCommitted }
  | { id: string; type: 'turn_failed'; data: LiveTurnFailed }
  | { id: string; type: 'reset'; data: LiveAttempt }
  | { id: string; type: 'error'; data: LiveError };

export interface LiveWatchOptions {
  /**
   * Resume after this event (its `id`, e.g. an SSE `Last-Event-ID`): the events after it, with no
   * gap and no duplicate, as long as its turn is live or just ended; otherwise from the live turn's start.
   */
  lastEventId?: string | undefined;
  /** Ends the stream. */
  signal?: AbortSignal | undefined;
  /** Most bytes of events held for a slow reader before it gets an `error` (`overflow`) and the stream ends (default 4 MiB). */
  maxBufferedBytes?: number | undefined;
}

/** `for await (const e of stream) …`; `close()` ends it. */
export interface LiveWatch extends AsyncIterable<LiveEvent> {
  readonly actor: ActorKey;
  close(): Promise<void>;
}

/**
 * V3 of src/live/stream.ts: an event's id, `<delivery_id>:<at>`: `s` its turn's start, a chunk's
 * seq, `e` its end, `r` the reset before a retry. Any daemon resumes a stream after any of them.
 */
export function liveEventId(deliveryId: string, at: 's' | 'e' | 'r' | number): string {
  return `${deliveryId}:${at}`;
}

/** The parts of an event id (`liveEventId`); undefined for any other text. */
export function parseLiveEventId(id: string): { deliveryId: string; at: 's' | 'e' | 'r' | number } | undefined {
  const m = /^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}):(s|e|r|[1-9]\d{0,9})$/.exec(id);
  if (!m) return undefined;
  const at = m[2]!;
  return { deliveryId: m[1]!, at: at === 's' || at === 'e' || at === 'r' ? at : Number(at) };
}
