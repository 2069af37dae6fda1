/**
 * Turn tracing with OpenTelemetry: the daemon's `TurnTracer` (src/base/turn-tracer.ts) on the
 * trace SDK and the OTLP/HTTP exporters, and the set-up a worker process uses to export its own
 * spans. Imported only when tracing is configured (src/observability/tracing-settings.ts).
 *
 * Span names and attributes follow the OpenTelemetry GenAI semantic conventions, v1.41.0 (status
 * Development): `invoke_agent {gen_ai.agent.name}` for a turn's attempt, `execute_tool
 * {gen_ai.tool.name}` for a worker's tool call; corral's own attributes are under `corral.*`.
 */
import { readFileSync } from 'node:fs';
import {
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  context as otelContext,
  trace,
  type Attributes,
  type Context,
  type Span,
  type Tracer,
} from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { OTLPTraceExporter as OtlpJsonExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { OTLPTraceExporter as OtlpProtoExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { defaultResource, resourceFromAttributes } from '@opentelemetry/resources';
import {
  AlwaysOffSampler,
  AlwaysOnSampler,
  BatchSpanProcessor,
  ParentBasedSampler,
  RandomIdGenerator,
  TraceIdRatioBasedSampler,
  TracerProvider,
  type IdGenerator,
  type Sampler,
} from '@opentelemetry/sdk-trace';
import { formatActorKey } from '../base/actor-key.ts';
import type { TraceCarrier } from '../base/trace-context.ts';
import { carrierOf, contextOf } from '../base/otel-span-context.ts';
import type {
  AttemptEnd,
  AttemptFenceFields,
  AttemptTrace,
  AttemptTraceStart,
  OutboxTrace,
  OutboxTraceStart,
  TurnTracer,
} from '../base/turn-tracer.ts';
import type { SamplerSetting, TracingSettings } from './tracing-settings.ts';

/** The GenAI semantic conventions' version the span names and attributes follow. */
export const GEN_AI_SEMCONV_VERSION = '1.41.0';
const SCOPE = '@corral/runtime';
const CORRAL_VERSION = (JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }).version;

/**
 * Root spans take the trace id they are asked for (`nextTraceId`), else a random one: every
 * attempt of an event sent without a context then shares one trace, named by the event's id.
 * The SDK asks for a trace id synchronously inside `startSpan`, so setting it just before is exact.
 */
class EventTraceIds implements IdGenerator {
  nextTraceId: string | undefined;
  private readonly random = new RandomIdGenerator();
  generateTraceId(): string {
    const id = this.nextTraceId ?? this.random.generateTraceId();
    this.nextTraceId = undefined;
    return id;
  }
  generateSpanId(): string {
    return this.random.generateSpanId();
  }
}

function samplerOf(s: SamplerSetting): Sampler {
  switch (s.kind) {
    case 'always_on':
      return new AlwaysOnSampler();
    case 'always_off':
      return new AlwaysOffSampler();
    case 'traceidratio':
      return new TraceIdRatioBasedSampler(s.ratio);
    case 'parentbased_always_on':
      return new ParentBasedSampler({ root: new AlwaysOnSampler() });
    case 'parentbased_always_off':
      return new ParentBasedSampler({ root: new AlwaysOffSampler() });
    case 'parentbased_traceidratio':
      return new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(s.ratio) });
  }
}

function providerOf(settings: TracingSettings, ids: IdGenerator): TracerProvider {
  // the request timeout is the exporter's own (OTEL_EXPORTER_OTLP_(TRACES_)TIMEOUT, 10 s), read by it
  const exporterOptions = { url: settings.url, headers: settings.headers };
  const exporter = settings.protocol === 'http/json' ? new OtlpJsonExporter(exporterOptions) : new OtlpProtoExporter(exporterOptions);
  return new TracerProvider({
    resource: defaultResource().merge(resourceFromAttributes({ 'service.name': settings.serviceName, 'service.version': CORRAL_VERSION })),
    sampler: samplerOf(settings.sampler),
    idGenerator: ids,
    spanProcessors: [new BatchSpanProcessor({ exporter, ...settings.batch })],
  });
}

/** An event id (a UUID) as a trace id: 32 lower-case hex digits; undefined when it is not one. */
function traceIdOfEvent(eventId: string): string | undefined {
  const hex = eventId.replace(/-/g, '').toLowerCase();
  return /^[0-9a-f]{32}$/.test(hex) && !/^0+$/.test(hex) ? hex : undefined;
}

class OtelAttemptTrace implements AttemptTrace {
  readonly carrier: TraceCarrier;
  private readonly tracer: Tracer;
  private readonly span: Span;
  private readonly ctx: Context;
  private beginSpan: Span | undefined;
  private dispatchSpan: Span | undefined;
  private ended = false;

  constructor(tracer: Tracer, ids: EventTraceIds, start: AttemptTraceStart) {
    this.tracer = tracer;
    const now = Date.now();
    const enqueued = start.attempt === 1 && start.enqueuedAtMs !== undefined ? Math.min(start.enqueuedAtMs, now) : undefined;
    const agent = start.key.agentUid;
    const attributes: Attributes = {
      'gen_ai.operation.name': 'invoke_agent',
      'gen_ai.agent.id': agent,
      'gen_ai.agent.name': agent,
      'gen_ai.conversation.id': formatActorKey(start.key),
      'corral.agent_uid': agent,
      'corral.session_id': start.key.sessionId,
      'corral.event.id': start.eventId,
      'corral.attempt': start.attempt,
      'corral.batch.size': start.batchSize,
    };
    if (!start.parent) ids.nextTraceId = traceIdOfEvent(start.eventId);
    this.span = tracer.startSpan(
      `invoke_agent ${agent}`,
      { kind: SpanKind.SERVER, attributes, ...(enqueued !== undefined ? { startTime: enqueued } : {}) },
      contextOf(start.parent),
    );
    ids.nextTraceId = undefined;
    this.ctx = trace.setSpan(ROOT_CONTEXT, this.span);
    this.carrier = carrierOf(this.span);
    if (enqueued !== undefined) {
      tracer.startSpan('corral.queue_wait', { startTime: enqueued }, this.ctx).end(now);
    }
    this.beginSpan = tracer.startSpan('corral.begin', { startTime: now }, this.ctx);
  }

  begun(fence: AttemptFenceFields, workerId: string | null): void {
    this.span.setAttributes({
      'corral.actor_epoch': fence.actorEpoch,
      'corral.activation.uid': fence.activationUid,
      'corral.delivery.id': fence.deliveryId,
      ...(workerId ? { 'corral.worker.id': workerId } : {}),
    });
    this.beginSpan?.end();
    this.beginSpan = undefined;
    this.dispatchSpan = this.tracer.startSpan(
      'corral.dispatch',
      { attributes: workerId ? { 'corral.worker.id': workerId } : { 'corral.parked': true } },
      this.ctx,
    );
  }

  sent(workerId: string): void {
    this.dispatchSpan?.addEvent('turn_start sent', { 'corral.worker.id': workerId });
  }

  accepted(workerId: string): void {
    if (!this.dispatchSpan) return;
    this.dispatchSpan.setAttribute('corral.worker.id', workerId);
    this.dispatchSpan.end();
    this.dispatchSpan = undefined;
    this.span.setAttribute('corral.worker.id', workerId);
  }

  redirected(deliveryId: string, workerId: string | null, reason: string): void {
    this.span.addEvent('redirected', {
      'corral.delivery.id': deliveryId,
      'corral.reason': reason,
      ...(workerId ? { 'corral.worker.id': workerId } : {}),
    });
    this.span.setAttribute('corral.delivery.id', deliveryId);
  }

  commit(workerId: string): (outcome: 'committed' | 'duplicate' | 'rejected' | 'failed', detail?: string) => void {
    if (this.dispatchSpan) this.accepted(workerId);
    const span = this.tracer.startSpan('corral.commit', { attributes: { 'corral.worker.id': workerId } }, this.ctx);
    return (outcome, detail) => {
      span.setAttribute('corral.outcome', outcome);
      if (outcome === 'rejected' || outcome === 'failed')
        span.setStatus({ code: SpanStatusCode.ERROR, ...(detail ? { message: detail } : {}) });
      span.end();
    };
  }

  end(end: AttemptEnd): void {
    if (this.ended) return;
    this.ended = true;
    this.beginSpan?.end();
    this.dispatchSpan?.end();
    this.span.setAttribute('corral.outcome', end.outcome);
    if (end.outcome === 'retry' || end.outcome === 'dead_letter') {
      this.span.setAttributes({ 'corral.fenced_out': end.fencedOut, 'error.type': end.fencedOut ? 'fenced_out' : 'turn_error' });
      const message = end.outcome === 'dead_letter' ? `dead-lettered: ${end.why}` : end.why;
      this.span.setStatus({ code: SpanStatusCode.ERROR, message: message.slice(0, 512) });
    } else if ('why' in end) {
      this.span.setAttribute('corral.reason', end.why.slice(0, 512));
    }
    this.span.end();
  }
}

class OtelOutboxTrace implements OutboxTrace {
  readonly carrier: TraceCarrier;
  private readonly span: Span;

  constructor(tracer: Tracer, start: OutboxTraceStart) {
    this.span = tracer.startSpan(
      'POST',
      {
        kind: SpanKind.CLIENT,
        attributes: {
          'http.request.method': 'POST',
          'server.address': start.url.hostname,
          'server.port': Number(start.url.port || (start.url.protocol === 'https:' ? 443 : 80)),
          'url.scheme': start.url.protocol.replace(':', ''),
          'url.path': start.url.pathname,
          'http.request.resend_count': start.attempt - 1,
          'corral.outbox.sink': start.sink,
          'corral.outbox.message_id': start.messageId,
          'corral.outbox.attempt': start.attempt,
          'gen_ai.conversation.id': formatActorKey(start.key),
        },
      },
      contextOf(start.parent),
    );
    this.carrier = carrierOf(this.span);
  }

  end(result: { status?: number | undefined; outcome: string; error?: string | undefined }): void {
    if (result.status !== undefined) this.span.setAttribute('http.response.status_code', result.status);
    this.span.setAttribute('corral.outcome', result.outcome);
    if (result.outcome !== 'delivered') {
      this.span.setAttribute('error.type', result.status !== undefined ? String(result.status) : 'connection');
      this.span.setStatus({ code: SpanStatusCode.ERROR, ...(result.error ? { message: result.error.slice(0, 512) } : {}) });
    }
    this.span.end();
  }
}

class OtelTurnTracer implements TurnTracer {
  private readonly provider: TracerProvider;
  private readonly tracer: Tracer;
  private readonly ids: EventTraceIds;

  constructor(settings: TracingSettings) {
    this.ids = new EventTraceIds();
    this.provider = providerOf(settings, this.ids);
    this.tracer = this.provider.getTracer(SCOPE, CORRAL_VERSION);
  }

  attempt(start: AttemptTraceStart): AttemptTrace {
    return new OtelAttemptTrace(this.tracer, this.ids, start);
  }

  outboxAttempt(start: OutboxTraceStart): OutboxTrace {
    return new OtelOutboxTrace(this.tracer, start);
  }

  async shutdown(): Promise<void> {
    await this.provider.shutdown();
  }
}

/** The daemon's tracer for `settings` (its own provider: the process's global one is left alone). */
export function createTurnTracer(settings: TracingSettings): TurnTracer {
  return new OtelTurnTracer(settings);
}

/**
 * A worker process's export: a provider for `settings` registered as the global one (the worker
 * SDK's handler and tool spans use it, as does the application's own instrumentation), with an
 * AsyncLocalStorage context manager so the handler's code runs inside its turn's span. Returns
 * what flushes and unregisters it.
 */
export function registerProcessTracing(settings: TracingSettings): { shutdown(): Promise<void> } {
  const provider = providerOf(settings, new RandomIdGenerator());
  const contextManager = new AsyncLocalStorageContextManager().enable();
  otelContext.setGlobalContextManager(contextManager);
  trace.setGlobalTracerProvider(provider);
  return {
    async shutdown() {
      await provider.shutdown();
      trace.disable();
      otelContext.disable();
    },
  };
}
