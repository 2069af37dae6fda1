/**
 * Between a W3C carrier (src/base/trace-context.ts) and an OpenTelemetry span context, for the
 * daemon's tracer (src/observability/tracing.ts) and the worker's spans (src/worker/tracing.ts).
 * Imported only by those two: the rest of corral does not load `@opentelemetry/api`.
 */
import { ROOT_CONTEXT, createTraceState, trace, type Context, type Span } from '@opentelemetry/api';
import { formatTraceparent, traceIdsOf, type TraceCarrier } from './trace-context.ts';

/** `base` with the (remote) span `carrier` names as its active span; `base` itself without one. */
export function contextOf(carrier: TraceCarrier | undefined, base: Context = ROOT_CONTEXT): Context {
  if (!carrier) return base;
  const { traceId, spanId, sampled } = traceIdsOf(carrier.traceparent);
  return trace.setSpanContext(ROOT_CONTEXT, {
    traceId,
    spanId,
    traceFlags: sampled ? 1 : 0,
    isRemote: true,
    ...(carrier.tracestate ? { traceState: createTraceState(carrier.tracestate) } : {}),
  });
}

/** `span`'s context as W3C headers write it. */
export function carrierOf(span: Span): TraceCarrier {
  const sc = span.spanContext();
  const traceparent = formatTraceparent(sc.traceId, sc.spanId, sc.traceFlags);
  const tracestate = sc.traceState?.serialize();
  return tracestate ? { traceparent, tracestate } : { traceparent };
}
