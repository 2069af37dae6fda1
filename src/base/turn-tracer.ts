/**
 * What the daemon tells a tracer about its turns, as spans (docs/observability.md "Spans"). No
 * OpenTelemetry import here: the OpenTelemetry implementation (src/observability/tracing.ts) is
 * loaded only when an OTLP endpoint is configured, and a daemon without one holds no tracer, so
 * its turn path does no tracing work (each hook is one `undefined` check).
 */
import type { ActorKey } from './actor-key.ts';
import type { TraceCarrier } from './trace-context.ts';

/** One attempt of an event, as the daemon begins it (one `invoke_agent` span). */
export interface AttemptTraceStart {
  key: ActorKey;
  eventId: string;
  /** 1 for the first try, then 2, 3, … */
  attempt: number;
  /** The sender's context (the event's `trace`); without one, every attempt of the event shares a trace named by its id. */
  parent: TraceCarrier | undefined;
  /** When the event was enqueued (epoch ms): the first attempt's span starts there, with its queue wait. */
  enqueuedAtMs: number | undefined;
  /** How many events the turn takes (a coalesced batch: more than 1). */
  batchSize: number;
}

/** How an attempt ended in this daemon. */
export type AttemptEnd =
  | { outcome: 'committed' | 'duplicate' }
  /** Failed and retried, or dead-lettered; `fencedOut`: the fence was taken from it (lease, maximum turn time), its worker's late reply is refused. */
  | { outcome: 'retry' | 'dead_letter'; why: string; fencedOut: boolean }
  /** Let go without a failure of its own: cancelled by an operator, interrupted by a newer event, or its begin failed. */
  | { outcome: 'cancelled' | 'interrupted' | 'not_begun'; why: string };

/** The fence an attempt was begun under (for the span's attributes). */
export interface AttemptFenceFields {
  actorEpoch: number;
  activationUid: string;
  deliveryId: string;
}

/** One attempt's span and its children; every method is cheap and never throws. */
export interface AttemptTrace {
  /** The attempt span's context: sent to the worker (`turn_start.trace`), stored with its emits and outbox messages. */
  readonly carrier: TraceCarrier;
  /** The begin transaction is done (fence taken): the dispatch span (turn_start → turn_accepted) starts. */
  begun(fence: AttemptFenceFields, workerId: string | null): void;
  /** turn_start was sent to `workerId`. */
  sent(workerId: string): void;
  /** The worker said turn_accepted (or its result came first). */
  accepted(workerId: string): void;
  /** The turn went to another delivery under the same fence (its worker was lost or handed it back). */
  redirected(deliveryId: string, workerId: string | null, reason: string): void;
  /** The fenced commit starts; the returned function ends its span. */
  commit(workerId: string): (outcome: 'committed' | 'duplicate' | 'rejected' | 'failed', detail?: string) => void;
  /** The attempt is over in this daemon; the first call counts. */
  end(end: AttemptEnd): void;
}

/** One POST of an outbox message to its sink. */
export interface OutboxTraceStart {
  /** The message's stored context (the committing attempt's span, or the sender's). */
  parent: TraceCarrier | undefined;
  sink: string;
  url: URL;
  messageId: string;
  /** 1 for the first POST, then 2, 3, … */
  attempt: number;
  key: ActorKey;
}

export interface OutboxTrace {
  /** The POST's span context: sent as the request's `traceparent`. */
  readonly carrier: TraceCarrier;
  end(result: { status?: number | undefined; outcome: string; error?: string | undefined }): void;
}

export interface TurnTracer {
  attempt(start: AttemptTraceStart): AttemptTrace;
  outboxAttempt(start: OutboxTraceStart): OutboxTrace;
  /** Exports what is buffered and stops (bounded by the exporter's timeout). */
  shutdown(): Promise<void>;
}
