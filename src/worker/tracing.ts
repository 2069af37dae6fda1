/**
 * The worker's spans, through `@opentelemetry/api`: made only when the process registered a
 * tracer provider (its own OpenTelemetry set-up, or `corral worker`'s when an OTLP endpoint is
 * set); otherwise a turn costs one global lookup. A turn's handler runs inside its span, a child
 * of the daemon's attempt span (`turn_start.trace`), and `ctx.tool(name, fn)` makes an
 * `execute_tool {name}` span (GenAI semantic conventions, docs/observability.md).
 */
import { SpanKind, SpanStatusCode, context, trace, type Attributes, type Context, type Span } from '@opentelemetry/api';
import { otelRegistration, type TraceCarrier } from '../base/trace-context.ts';
import { carrierOf, contextOf } from '../base/otel-span-context.ts';
import type { TurnStart } from '../fabric/protocol.ts';

const SCOPE = '@corral/worker';
/** Whether this process registered an OpenTelemetry tracer provider (the API sets `trace` once one is). */
export function tracingRegistered(): boolean {
  return otelRegistration()?.trace !== undefined;
}

/** One turn's handler span, and the tool spans under it. */
export class HandlerSpan {
  readonly carrier: TraceCarrier;
  private readonly span: Span;
  private readonly ctx: Context;
  private ended = false;

  private constructor(span: Span) {
    this.span = span;
    this.ctx = trace.setSpan(context.active(), span);
    this.carrier = carrierOf(span);
  }

  /** The span of a turn starting now, when the process traces; undefined otherwise. */
  static start(start: TurnStart, workerId: string): HandlerSpan | undefined {
    if (!tracingRegistered()) return undefined;
    const ref = start.turn_ref;
    const span = trace.getTracer(SCOPE).startSpan(
      'corral.handler',
      {
        kind: SpanKind.CONSUMER,
        attributes: {
          'gen_ai.agent.name': ref.agent_uid,
          'gen_ai.conversation.id': `${ref.agent_uid}/${ref.session_id}`,
          'corral.event.id': ref.event_id,
          'corral.attempt': start.attempt,
          'corral.actor_epoch': ref.actor_epoch,
          'corral.delivery.id': ref.delivery_id,
          'corral.worker.id': workerId,
        },
      },
      contextOf(start.trace, context.active()),
    );
    return new HandlerSpan(span);
  }

  /** Runs `fn` with this span active, so the handler's own spans are its children. */
  run<T>(fn: () => T): T {
    return context.with(this.ctx, fn);
  }

  /** `execute_tool {name}` around `fn`, a child of this span: its error is recorded and thrown on. */
  async tool<T>(name: string, fn: () => Promise<T> | T, attributes: Attributes = {}): Promise<T> {
    const span = trace
      .getTracer(SCOPE)
      .startSpan(
        `execute_tool ${name}`,
        { kind: SpanKind.INTERNAL, attributes: { ...attributes, 'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': name } },
        this.ctx,
      );
    try {
      return await context.with(trace.setSpan(this.ctx, span), fn);
    } catch (e) {
      const err = e instanceof Error ? e : new Error(String(e));
      span.recordException(err);
      span.setAttribute('error.type', err.name || 'Error');
      span.setStatus({ code: SpanStatusCode.ERROR, message: err.message.slice(0, 512) });
      throw e;
    } finally {
      span.end();
    }
  }

  /** The daemon took the fence from this attempt (`turn_rejected`): what it still sends is refused. */
  fencedOut(reason: string): void {
    this.span.setAttributes({ 'corral.fenced_out': true, 'corral.reason': reason });
  }

  /** The handler settled: `outcome` is the message sent for it (or `cancelled`: nothing was). */
  end(outcome: 'turn_result' | 'turn_error' | 'cancelled', error?: { code: string; message: string }): void {
    if (this.ended) return;
    this.ended = true;
    this.span.setAttribute('corral.outcome', outcome);
    if (error) {
      this.span.setAttribute('error.type', error.code);
      this.span.setStatus({ code: SpanStatusCode.ERROR, message: error.message.slice(0, 512) });
    }
    this.span.end();
  }
}

/**
 * The daemon refused a final message after its handler span ended (`turn_rejected` of a result:
 * the attempt was fenced out meanwhile): a short child span says so, marked like the attempt.
 */
export function recordRejection(handler: TraceCarrier, reason: string, detail: string | undefined): void {
  if (!tracingRegistered()) return;
  const span = trace
    .getTracer(SCOPE)
    .startSpan(
      'corral.turn_rejected',
      { attributes: { 'corral.fenced_out': reason !== 'stale_revision', 'corral.reason': reason } },
      contextOf(handler),
    );
  span.setStatus({ code: SpanStatusCode.ERROR, message: `${reason}${detail ? `: ${detail}` : ''}`.slice(0, 512) });
  span.end();
}

/**
 * The handler spans of traced turns whose final message awaits the daemon's answer: a refusal
 * (`turn_rejected`) is recorded under its span (`recordRejection`); any other answer forgets it.
 */
export class TracedFinals {
  private readonly byDelivery = new Map<string, TraceCarrier>();

  keep(deliveryId: string, handler: TraceCarrier | undefined): void {
    if (handler) this.byDelivery.set(deliveryId, handler);
  }

  answered(deliveryId: string): void {
    this.byDelivery.delete(deliveryId);
  }

  rejected(deliveryId: string, reason: string, detail: string | undefined): void {
    const handler = this.byDelivery.get(deliveryId);
    if (!handler) return;
    this.byDelivery.delete(deliveryId);
    recordRejection(handler, reason, detail);
  }
}
