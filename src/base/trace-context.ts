/**
 * W3C Trace Context (https://www.w3.org/TR/trace-context/) as corral carries it: an event may be
 * sent with the `traceparent` (and `tracestate`) of the caller's span; it is stored with the
 * event's job and travels in the turn's `turn_start` (`trace`), so the worker's spans continue
 * the caller's trace. The same rules are checked by `corral.send_events` in SQL
 * (src/db/enqueue/send-event.ts) and by the worker SDK on the wire.
 */
import { CorralError } from './errors.ts';

/** A span's context as the W3C headers write it. */
export interface TraceCarrier {
  traceparent: string;
  tracestate?: string | undefined;
}

/**
 * Version 00 as sent (lower-case hex; trace id and parent id not all zeros); a later version is
 * accepted by its first four fields, as the recommendation asks of version-00 parsers.
 */
export const TRACEPARENT_PATTERN = /^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-[0-9a-zA-Z._-]*)?$/;
/** A traceparent as corral stores and sends it: version 00, exactly four fields. */
export const STORED_TRACEPARENT_PATTERN = /^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/;
const ZERO_TRACE_ID = '0'.repeat(32);
const ZERO_SPAN_ID = '0'.repeat(16);

/** The recommendation's limit for propagating `tracestate` (longer values may be dropped). */
export const MAX_TRACESTATE_LENGTH = 512;
/** Printable ASCII but for a few list separators kept by members: `tracestate` has no other characters. */
export const TRACESTATE_PATTERN = /^[\x20-\x7e]*$/;

/** Why `traceparent` is not a W3C traceparent corral can carry; undefined when it is one. */
export function traceparentProblem(traceparent: unknown): string | undefined {
  if (typeof traceparent !== 'string') return 'a traceparent is a string';
  if (traceparent.length > 256) return 'a traceparent is at most 256 characters';
  if (!TRACEPARENT_PATTERN.test(traceparent))
    return `not a W3C traceparent (version-traceid-parentid-flags in lower-case hex): ${JSON.stringify(traceparent)}`;
  const [version, traceId, spanId] = traceparent.split('-') as [string, string, string];
  if (version === 'ff') return 'traceparent version ff is invalid';
  if (version === '00' && traceparent.length !== 55) return 'a version-00 traceparent has exactly four fields';
  if (traceId === ZERO_TRACE_ID) return 'a traceparent trace id of all zeros is invalid';
  if (spanId === ZERO_SPAN_ID) return 'a traceparent parent id of all zeros is invalid';
  return undefined;
}

/** Why `tracestate` cannot be carried; undefined when it can. */
export function tracestateProblem(tracestate: unknown): string | undefined {
  if (typeof tracestate !== 'string') return 'a tracestate is a string';
  if (tracestate.length > MAX_TRACESTATE_LENGTH) return `a tracestate is at most ${MAX_TRACESTATE_LENGTH} characters`;
  if (!TRACESTATE_PATTERN.test(tracestate)) return 'a tracestate holds printable ASCII only';
  return undefined;
}

/**
 * `carrier` checked, as corral stores it (a version-00 traceparent: later versions keep their
 * first four fields); an `invalid_argument` CorralError when it cannot be carried.
 */
export function checkTraceCarrier(carrier: TraceCarrier): TraceCarrier {
  const problem =
    traceparentProblem(carrier.traceparent) ?? (carrier.tracestate === undefined ? undefined : tracestateProblem(carrier.tracestate));
  if (problem) throw new CorralError('invalid_argument', problem);
  const traceparent = carrier.traceparent.startsWith('00-') ? carrier.traceparent : `00-${carrier.traceparent.slice(3, 55)}`;
  return carrier.tracestate === undefined || carrier.tracestate === '' ? { traceparent } : { traceparent, tracestate: carrier.tracestate };
}

/**
 * Headers as a receiver of W3C Trace Context reads them: an invalid `traceparent` is ignored
 * (with its `tracestate`), not refused, as the recommendation says; a repeated header is not one.
 */
export function traceCarrierFromHeaders(headers: Record<string, string | string[] | undefined>): TraceCarrier | undefined {
  const traceparent = typeof headers.traceparent === 'string' ? headers.traceparent.trim() : undefined;
  if (traceparent === undefined || traceparentProblem(traceparent) !== undefined) return undefined;
  const ts = headers.tracestate;
  const tracestate = (Array.isArray(ts) ? ts.join(',') : ts)?.trim();
  return checkTraceCarrier({
    traceparent,
    tracestate: tracestate !== undefined && tracestateProblem(tracestate) === undefined ? tracestate : undefined,
  });
}

/** The trace id and span id a traceparent names. */
export function traceIdsOf(traceparent: string): { traceId: string; spanId: string; sampled: boolean } {
  return {
    traceId: traceparent.slice(3, 35),
    spanId: traceparent.slice(36, 52),
    sampled: (parseInt(traceparent.slice(53, 55), 16) & 1) === 1,
  };
}

/**
 * A stored carrier (an event job's `trace`) as corral wrote it, or undefined: a job written by
 * other means with a malformed one must not fail its begin (the turn row checks the pattern).
 */
export function storedTraceCarrier(value: unknown): TraceCarrier | undefined {
  const c = value as Partial<TraceCarrier> | null | undefined;
  if (typeof c?.traceparent !== 'string' || !STORED_TRACEPARENT_PATTERN.test(c.traceparent)) return undefined;
  return typeof c.tracestate === 'string' && tracestateProblem(c.tracestate) === undefined
    ? { traceparent: c.traceparent, tracestate: c.tracestate }
    : { traceparent: c.traceparent };
}

/** A traced turn's log fields: its trace, and the span the line belongs to (the carrier's). */
export function traceLogFields(carrier: TraceCarrier | undefined): { trace_id: string; span_id: string } | Record<string, never> {
  if (!carrier) return {};
  const { traceId, spanId } = traceIdsOf(carrier.traceparent);
  return { trace_id: traceId, span_id: spanId };
}

/** A version-00 traceparent for a span context's ids and flags. */
export function formatTraceparent(traceId: string, spanId: string, traceFlags: number): string {
  return `00-${traceId}-${spanId}-${(traceFlags & 0xff).toString(16).padStart(2, '0')}`;
}

/** Where `@opentelemetry/api` (major version 1) keeps what an application registered. */
const OTEL_API_GLOBAL = Symbol.for('opentelemetry.js.api.1');

/** What the process registered with `@opentelemetry/api` 1.x (its `context` manager, its `trace` provider), if anything. */
export function otelRegistration(): { context?: { active?: () => unknown }; trace?: unknown } | undefined {
  return (globalThis as Record<symbol, { context?: { active?: () => unknown }; trace?: unknown } | undefined>)[OTEL_API_GLOBAL];
}
/** The context key `@opentelemetry/api` keeps the active span under (its `createContextKey` is `Symbol.for`). */
const OTEL_SPAN_KEY = Symbol.for('OpenTelemetry Context Key SPAN');

interface OtelSpanContext {
  traceId: string;
  spanId: string;
  traceFlags: number;
  traceState?: { serialize(): string };
}

/**
 * The caller's active OpenTelemetry span as a carrier, when the process registered an
 * OpenTelemetry context manager and a valid span is active; undefined otherwise. Read through
 * the API's global registration (the contract every copy of `@opentelemetry/api` 1.x shares),
 * synchronously, so the context is the caller's own; a process without OpenTelemetry pays one
 * global lookup and loads nothing.
 */
export function activeTraceCarrier(): TraceCarrier | undefined {
  const active = otelRegistration()?.context?.active?.() as { getValue?: (key: symbol) => unknown } | undefined;
  const span = active?.getValue?.(OTEL_SPAN_KEY) as { spanContext?: () => OtelSpanContext } | undefined;
  const sc = span?.spanContext?.();
  if (!sc || typeof sc.traceId !== 'string' || typeof sc.spanId !== 'string') return undefined;
  const traceparent = formatTraceparent(sc.traceId, sc.spanId, sc.traceFlags ?? 0);
  if (traceparentProblem(traceparent) !== undefined) return undefined;
  const tracestate = sc.traceState?.serialize();
  return tracestate && tracestateProblem(tracestate) === undefined ? { traceparent, tracestate } : { traceparent };
}
