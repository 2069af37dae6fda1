/**
 * One trace per turn (docs/observability.md): an application span → `corral.send` → the daemon's
 * `invoke_agent` attempt span (queue wait, begin, dispatch, commit) → the SDK worker's handler
 * span with an `execute_tool` span → the outbox POST, received by a real webhook receiver with the
 * POST's `traceparent`. Real daemon, ZeroMQ, PostgreSQL, HTTP API and a real OTLP/HTTP receiver:
 * the daemon exports OTLP/JSON, the test process (application and worker) OTLP/protobuf.
 */
import { trace } from '@opentelemetry/api';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { connect, type Corral } from '../../src/client/index.ts';
import { addSink } from '../../src/outbox/sinks.ts';
import { createTurnTracer, registerProcessTracing } from '../../src/observability/tracing.ts';
import { tracingSettings } from '../../src/observability/tracing-settings.ts';
import type { TurnTracer } from '../../src/base/turn-tracer.ts';
import type { TraceCarrier } from '../../src/base/trace-context.ts';
import { actorEventJob } from '../../src/queue/event-job.ts';
import { createWorker } from '../../src/worker/index.ts';
import type { Worker } from '../../src/worker/types.ts';
import { startTestDaemon, testLogger, type TestDaemon } from '../helpers/daemon.ts';
import { OtlpReceiver, SPAN_KIND, STATUS_CODE, type ReceivedSpan } from '../helpers/otlp-receiver.ts';
import { WebhookReceiver } from '../helpers/webhook-receiver.ts';
import { waitFor } from '../helpers/wait.ts';
import { startApi, type Api } from '../http/helpers.ts';
import { errorCodeOf } from '../helpers/capture.ts';
import { loadConfig } from '../../src/config.ts';
import { runTurnCommand } from '../../src/cli/commands/status.ts';
import { PassThrough } from 'node:stream';

const AGENT = 'otel';
const TP = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
const LIVE_TP = '00-5cf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';

describe('one trace per turn, exported over OTLP', () => {
  const otlp = new OtlpReceiver();
  const hooks = new WebhookReceiver();
  let appTracing: { shutdown(): Promise<void> };
  let daemonTracer: TurnTracer;
  let t: TestDaemon;
  let worker: Worker;
  let corral: Corral;
  let api: Api;
  let raw: pg.Client;
  /** What the handler saw as the active span, by the event's `n` and attempt. */
  const seen = new Map<string, { handlerSpan?: string; toolSpan?: string; trace?: string }>();

  beforeAll(async () => {
    await otlp.start();
    await hooks.start();
    const env = { OTEL_EXPORTER_OTLP_ENDPOINT: otlp.endpoint, OTEL_BSP_SCHEDULE_DELAY: '50' };
    appTracing = registerProcessTracing(tracingSettings({ ...env, OTEL_SERVICE_NAME: 'test-app' }, 'unused')!);
    daemonTracer = createTurnTracer(tracingSettings({ ...env, OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json' }, 'corral-daemon')!);
    t = await startTestDaemon({ drainMs: 0, retryDelaySeconds: 1, watchdogIntervalMs: 100, maxTurnMs: 1_500 }, { tracer: daemonTracer });
    await addSink(t.daemon.database.db, { name: 'otel', url: hooks.url('/otel'), allowPrivate: true });
    worker = createWorker({
      endpoint: t.daemon.broker.endpoint,
      insecure: true,
      workerId: 'otel-worker',
      capacity: 4,
      logger: testLogger,
      handler: async (ctx) => {
        const data = ctx.event.data as { n: string; fail?: boolean; hang?: boolean; deliver?: boolean };
        if (data.fail && ctx.attempt === 1) throw Object.assign(new Error('the tool was flaky'), { code: 'flaky' });
        if (data.hang && ctx.attempt === 1) {
          // holds the turn until the daemon's maximum turn time takes its fence away
          await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
          throw new Error('aborted');
        }
        const handlerSpan = trace.getActiveSpan()?.spanContext().spanId;
        const toolSpan = await ctx.tool('lookup', async () => trace.getActiveSpan()?.spanContext().spanId, { 'lookup.kind': 'test' });
        seen.set(`${data.n}#${ctx.attempt}`, { handlerSpan, toolSpan, trace: ctx.trace?.traceparent });
        return {
          messages: [{ role: 'assistant', content: 'ok' }],
          ...(data.deliver ? { deliver: [{ sink: 'otel', body: { n: data.n } }] } : {}),
        };
      },
    });
    await worker.start();
    corral = await connect({ databaseUrl: t.db.url, env: {} });
    api = await startApi(t.db.url, { corral });
    raw = new pg.Client({ connectionString: t.db.url });
    await raw.connect();
  });

  afterAll(async () => {
    await raw?.end();
    await api?.stop();
    await corral?.close();
    await worker?.stop();
    await t?.stop();
    await daemonTracer?.shutdown();
    await appTracing?.shutdown();
    await hooks.stop();
    await otlp.stop();
  });

  const named = (spans: ReceivedSpan[], name: string) => spans.filter((s) => s.name === name);
  const only = (spans: ReceivedSpan[], name: string) => {
    const found = named(spans, name);
    expect(
      found.map((s) => s.name),
      `exactly one ${name}`,
    ).toEqual([name]);
    return found[0]!;
  };
  /** The spans of the trace once it holds `names` (with `count` invoke_agent spans). */
  const traceOnceItHas = (traceId: string, names: string[], attempts = 1) =>
    otlp.waitFor(
      (spans) => {
        const mine = spans.filter((s) => s.traceId === traceId);
        const has = names.every((n) => mine.some((s) => s.name === n)) && named(mine, `invoke_agent ${AGENT}`).length >= attempts;
        return has && mine;
      },
      `the spans of trace ${traceId}: ${names.join(', ')}`,
    );
  const turnTraceparents = async (eventId: string) =>
    (
      await raw.query<{ traceparent: string | null }>(`select traceparent from corral.turns where event_id = $1 order by attempt`, [
        eventId,
      ])
    ).rows.map((r) => r.traceparent);

  it('app span → send → invoke_agent → handler → execute_tool → commit → outbox POST: one trace, its tree and attributes', async () => {
    const app = trace.getTracer('test-app');
    let appSpanId = '';
    let traceId = '';
    const sent = await app.startActiveSpan('app request', async (span) => {
      appSpanId = span.spanContext().spanId;
      traceId = span.spanContext().traceId;
      try {
        return await corral.send(`${AGENT}/client`, { n: 'client', deliver: true });
      } finally {
        span.end();
      }
    });
    const hook = await waitFor(() => hooks.received.find((r) => r.path === '/otel' && r.body.includes('"client"')), {
      what: 'the webhook',
    });
    const spans = await traceOnceItHas(traceId, [
      'app request',
      'corral.queue_wait',
      'corral.begin',
      'corral.dispatch',
      'corral.commit',
      'corral.handler',
      'execute_tool lookup',
      'POST',
    ]);
    expect(otlp.problems).toEqual([]);

    const appSpan = only(spans, 'app request');
    expect([appSpan.parentSpanId, appSpan.spanId, appSpan.service, appSpan.encoding]).toEqual(['', appSpanId, 'test-app', 'protobuf']);

    const invoke = only(spans, `invoke_agent ${AGENT}`);
    expect(invoke.parentSpanId).toBe(appSpanId);
    expect([invoke.kind, invoke.service, invoke.encoding, invoke.status.code]).toEqual([
      SPAN_KIND.server,
      'corral-daemon',
      'json',
      STATUS_CODE.unset,
    ]);
    expect(invoke.attributes).toMatchObject({
      'gen_ai.operation.name': 'invoke_agent',
      'gen_ai.agent.id': AGENT,
      'gen_ai.agent.name': AGENT,
      'gen_ai.conversation.id': `${AGENT}/client`,
      'corral.event.id': sent.eventId,
      'corral.attempt': 1,
      'corral.batch.size': 1,
      'corral.worker.id': 'otel-worker',
      'corral.outcome': 'committed',
    });
    expect(typeof invoke.attributes['corral.actor_epoch']).toBe('number');

    for (const child of ['corral.queue_wait', 'corral.begin', 'corral.dispatch', 'corral.commit']) {
      const s = only(spans, child);
      expect([child, s.parentSpanId, s.service]).toEqual([child, invoke.spanId, 'corral-daemon']);
      expect(s.endNs >= s.startNs, child).toBe(true);
    }
    // the first attempt's span starts at the enqueue, with its queue wait; then begin, dispatch, commit, in that order
    const at = (n: string) => only(spans, n).startNs;
    expect(invoke.startNs).toBe(at('corral.queue_wait'));
    expect(at('corral.begin') >= only(spans, 'corral.queue_wait').endNs).toBe(true);
    expect(at('corral.dispatch') >= only(spans, 'corral.begin').endNs).toBe(true);
    expect(at('corral.commit') >= at('corral.dispatch')).toBe(true);
    expect(only(spans, 'corral.commit').attributes['corral.outcome']).toBe('committed');
    expect(only(spans, 'corral.dispatch').events.map((e) => e.name)).toContain('turn_start sent');

    const handler = only(spans, 'corral.handler');
    expect([handler.parentSpanId, handler.kind, handler.service, handler.encoding]).toEqual([
      invoke.spanId,
      SPAN_KIND.consumer,
      'test-app',
      'protobuf',
    ]);
    expect(handler.attributes).toMatchObject({ 'corral.event.id': sent.eventId, 'corral.attempt': 1, 'corral.outcome': 'turn_result' });
    const tool = only(spans, 'execute_tool lookup');
    expect(tool.parentSpanId).toBe(handler.spanId);
    expect(tool.attributes).toMatchObject({ 'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': 'lookup', 'lookup.kind': 'test' });
    // the handler's code runs inside its span, the tool's inside the tool's; ctx.trace names the handler span
    expect(seen.get('client#1')).toEqual({
      handlerSpan: handler.spanId,
      toolSpan: tool.spanId,
      trace: `00-${traceId}-${handler.spanId}-01`,
    });

    const post = only(spans, 'POST');
    expect([post.parentSpanId, post.kind]).toEqual([invoke.spanId, SPAN_KIND.client]);
    expect(post.attributes).toMatchObject({
      'http.request.method': 'POST',
      'http.response.status_code': 200,
      'corral.outbox.sink': 'otel',
      'corral.outbox.attempt': 1,
      'corral.outcome': 'delivered',
      'url.path': '/otel',
    });
    // the sink receives the POST's own span as its parent
    expect(hook.traceparent).toBe(`00-${traceId}-${post.spanId}-01`);
    // the turn row names the attempt's span (`corral actor`, `corral turn`)
    expect(await turnTraceparents(sent.eventId)).toEqual([`00-${traceId}-${invoke.spanId}-01`]);
  });

  it("the live stream's turn_started carries the attempt span's traceparent", async () => {
    // resolved once the watch is registered: the send comes after
    const watch = await corral.watch(`${AGENT}/live`);
    try {
      const first = watch[Symbol.asyncIterator]().next();
      const sent = await corral.send(`${AGENT}/live`, { n: 'live' }, { traceparent: LIVE_TP });
      const started = (await first).value as { type: string; data: { event_id: string; traceparent?: string } };
      expect([started.type, started.data.event_id]).toEqual(['turn_started', sent.eventId]);
      const spans = await traceOnceItHas(LIVE_TP.slice(3, 35), ['corral.commit']);
      const invoke = named(spans, `invoke_agent ${AGENT}`).find((x) => x.attributes['corral.event.id'] === sent.eventId)!;
      expect(started.data.traceparent).toBe(`00-${LIVE_TP.slice(3, 35)}-${invoke.spanId}-01`);
    } finally {
      await watch.close();
    }
  });

  it("HTTP: the request's traceparent is the attempt span's parent", async () => {
    const token = await api.token('tracer', ['send']);
    const res = await api.call(`/v1/actors/${AGENT}/http/events`, {
      method: 'POST',
      token,
      headers: { 'content-type': 'application/json', traceparent: TP },
      body: JSON.stringify({ n: 'http' }),
    });
    expect(res.status).toBe(202);
    const eventId = ((await res.json()) as { event_id: string }).event_id;
    const traceId = TP.slice(3, 35);
    const spans = await traceOnceItHas(traceId, ['corral.handler', 'execute_tool lookup', 'corral.commit']);
    const invoke = named(spans, `invoke_agent ${AGENT}`).find((s) => s.attributes['corral.event.id'] === eventId)!;
    expect([invoke.parentSpanId, invoke.attributes['gen_ai.conversation.id']]).toEqual([TP.slice(36, 52), `${AGENT}/http`]);
    const handler = spans.find((s) => s.name === 'corral.handler' && s.attributes['corral.event.id'] === eventId)!;
    expect(handler.parentSpanId).toBe(invoke.spanId);
  });

  it('SQL: corral.send_event with a traceparent: the same tree under it', async () => {
    const tp = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
    const one = await raw.query<{ id: string }>(`select corral.send_event($1, 'sql', '{"n":"sql"}'::jsonb, null, $2) as id`, [AGENT, tp]);
    const eventId = one.rows[0]!.id;
    const spans = await traceOnceItHas(tp.slice(3, 35), ['corral.handler', 'execute_tool lookup', 'corral.commit']);
    const invoke = only(spans, `invoke_agent ${AGENT}`);
    expect([invoke.parentSpanId, invoke.attributes['corral.event.id']]).toEqual([tp.slice(36, 52), eventId]);
    expect(only(spans, 'corral.handler').parentSpanId).toBe(invoke.spanId);
  });

  it('a retried turn: two attempts under one trace, the failed one an error, the retry committed', async () => {
    const app = trace.getTracer('test-app');
    let traceId = '';
    let appSpanId = '';
    const sent = await app.startActiveSpan('app retry', async (span) => {
      traceId = span.spanContext().traceId;
      appSpanId = span.spanContext().spanId;
      try {
        return await corral.send(`${AGENT}/retry`, { n: 'retry', fail: true });
      } finally {
        span.end();
      }
    });
    const spans = await traceOnceItHas(traceId, ['execute_tool lookup'], 2);
    const attempts = named(spans, `invoke_agent ${AGENT}`).sort(
      (a, b) => Number(a.attributes['corral.attempt']) - Number(b.attributes['corral.attempt']),
    );
    expect(attempts.map((a) => [a.parentSpanId, a.attributes['corral.attempt'], a.attributes['corral.outcome'], a.status.code])).toEqual([
      [appSpanId, 1, 'retry', STATUS_CODE.error],
      [appSpanId, 2, 'committed', STATUS_CODE.unset],
    ]);
    expect(attempts[0]!.attributes['corral.fenced_out']).toBe(false);
    expect(attempts[0]!.status.message).toContain('flaky');
    // each attempt's handler span is its own attempt's child; the failed one says why
    const handlers = named(spans, 'corral.handler');
    expect(handlers.map((h) => [h.attributes['corral.attempt'], h.parentSpanId, h.attributes['corral.outcome']]).sort()).toEqual([
      [1, attempts[0]!.spanId, 'turn_error'],
      [2, attempts[1]!.spanId, 'turn_result'],
    ]);
    expect(handlers.find((h) => h.attributes['corral.attempt'] === 1)!.attributes['error.type']).toBe('flaky');
    expect(await turnTraceparents(sent.eventId)).toEqual(attempts.map((a) => `00-${traceId}-${a.spanId}-01`));

    // `corral turn` shows each attempt with its trace and span
    const config = loadConfig({ databaseUrl: t.db.url, logLevel: 'silent' }, {});
    const out = new PassThrough();
    const chunks: Buffer[] = [];
    out.on('data', (c: Buffer) => chunks.push(c));
    expect(await runTurnCommand(config, `${AGENT}/retry`, sent.eventId, {}, out)).toBe(0);
    const lines = Buffer.concat(chunks).toString('utf8').trim().split('\n');
    expect(lines[0]).toBe(`event ${sent.eventId} of ${AGENT}/retry: 2 attempts`);
    expect(lines[1]).toMatch(/^ATTEMPT\s+STATUS\s+EPOCH\s+REV\s+WORKER\s+STARTED\s+FINISHED\s+TRACE\s+SPAN\s+ERROR$/);
    expect(lines[2]).toMatch(new RegExp(`^1\\s+failed\\s.*${traceId}\\s+${attempts[0]!.spanId}\\s+flaky: the tool was flaky$`));
    expect(lines[3]).toMatch(new RegExp(`^2\\s+succeeded\\s.*${traceId}\\s+${attempts[1]!.spanId}$`));
    expect(await errorCodeOf(runTurnCommand(config, `${AGENT}/retry`, 'not-an-id', {}, out))).toBe('invalid_argument');
    expect(await errorCodeOf(runTurnCommand(config, `${AGENT}/other`, sent.eventId, {}, out))).toBe('not_found');
  });

  it('a fenced-out attempt (past the maximum turn time) is marked so; its retry commits in the same trace', async () => {
    // sent without a context: every attempt of the event shares the trace its id names
    const sent = await corral.send(`${AGENT}/hang`, { n: 'hang', hang: true }, { traceparent: null });
    const traceId = sent.eventId.replace(/-/g, '');
    const spans = await traceOnceItHas(traceId, ['execute_tool lookup'], 2);
    const attempts = named(spans, `invoke_agent ${AGENT}`).sort(
      (a, b) => Number(a.attributes['corral.attempt']) - Number(b.attributes['corral.attempt']),
    );
    expect(attempts.map((a) => [a.parentSpanId, a.attributes['corral.outcome'], a.attributes['corral.fenced_out'], a.status.code])).toEqual(
      [
        ['', 'retry', true, STATUS_CODE.error],
        ['', 'committed', undefined, STATUS_CODE.unset],
      ],
    );
    expect(attempts[0]!.attributes['error.type']).toBe('fenced_out');
    const first = named(spans, 'corral.handler').find((h) => h.attributes['corral.attempt'] === 1)!;
    expect([first.parentSpanId, first.attributes['corral.outcome']]).toEqual([attempts[0]!.spanId, 'cancelled']);
  });

  it('a job written by other means with a malformed trace still runs: traced from no parent, its row without the bad value', async () => {
    const job = actorEventJob({ agentUid: AGENT, sessionId: 'forged' }, { n: 'forged' }, 1024, {
      traceparent: "00-x' or 1=1--",
      tracestate: 'x',
    } as unknown as TraceCarrier);
    await t.daemon.boss.send(t.daemon.queues.events, job.data, { id: job.id, singletonKey: job.singletonKey });
    await waitFor(() => seen.get('forged#1'), { what: 'the forged event’s turn' });
    const traceId = job.id.replace(/-/g, '');
    const spans = await traceOnceItHas(traceId, ['corral.commit']);
    const invoke = only(spans, `invoke_agent ${AGENT}`);
    expect([invoke.parentSpanId, invoke.attributes['corral.outcome']]).toEqual(['', 'committed']);
    expect(await turnTraceparents(job.id)).toEqual([`00-${traceId}-${invoke.spanId}-01`]);
  });

  it('an attempt span ending in a dead letter has an error status; an outbox POST that fails is an error', async () => {
    const key = { agentUid: AGENT, sessionId: 'direct' };
    const dead = daemonTracer.attempt({
      key,
      eventId: '0190f3a0-0000-7000-8000-00000000d1ed',
      attempt: 3,
      parent: undefined,
      enqueuedAtMs: undefined,
      batchSize: 1,
    });
    dead.end({ outcome: 'dead_letter', why: 'turn_error: boom', fencedOut: false });
    const post = daemonTracer.outboxAttempt({
      parent: dead.carrier,
      sink: 's',
      url: new URL('http://127.0.0.1:9/x'),
      messageId: '7',
      attempt: 2,
      key,
    });
    post.end({ status: 503, outcome: 'retry', error: 'HTTP 503' });
    const traceId = '0190f3a0000070008000' + '00000000d1ed';
    const spans = await otlp.waitFor((all) => {
      const mine = all.filter((s) => s.traceId === traceId);
      return mine.length >= 3 && mine;
    }, 'the dead letter’s spans');
    const invoke = only(spans, `invoke_agent ${AGENT}`);
    expect([invoke.status.code, invoke.status.message, invoke.attributes['corral.outcome']]).toEqual([
      STATUS_CODE.error,
      'dead-lettered: turn_error: boom',
      'dead_letter',
    ]);
    // a span with no queue wait (not a first attempt): begin ended with the attempt
    expect(named(spans, 'corral.queue_wait')).toEqual([]);
    const failed = only(spans, 'POST');
    expect([
      failed.parentSpanId,
      failed.status.code,
      failed.attributes['http.response.status_code'],
      failed.attributes['error.type'],
    ]).toEqual([invoke.spanId, STATUS_CODE.error, 503, '503']);
  });
});
