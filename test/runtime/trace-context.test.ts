/**
 * A sender's W3C trace context, carried (E9 of src/db/enqueue/send-event.ts): given to `send`,
 * taken from the caller's active OpenTelemetry span, read from an HTTP request's `traceparent`,
 * or passed to `corral.send_event` in SQL, it is stored with the event, reaches the worker's
 * `ctx.trace` through `turn_start.trace`, goes on with the turn's emits, and is sent to a sink as
 * the outbox request's `traceparent`/`tracestate`. A real daemon, SDK worker, HTTP API and
 * webhook receiver.
 */
import { context, ROOT_CONTEXT, trace, type Context, type ContextManager } from '@opentelemetry/api';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addSink } from '../../src/outbox/sinks.ts';
import { createWorker } from '../../src/worker/index.ts';
import type { Worker } from '../../src/worker/types.ts';
import { errorCodeOf } from '../helpers/capture.ts';
import { startTestDaemon, testLogger, type TestDaemon } from '../helpers/daemon.ts';
import { waitFor } from '../helpers/wait.ts';
import { WebhookReceiver } from '../helpers/webhook-receiver.ts';
import { startApi, type Api } from '../http/helpers.ts';
import { connect, type Corral } from '../../src/client/index.ts';
import pg from 'pg';
import type { TraceCarrier } from '../../src/base/trace-context.ts';
import { actorEventJob } from '../../src/queue/event-job.ts';

const TP = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
const TS = 'congo=t61rcWkgMzE,rojo=00f067aa0ba902b7';

/** The smallest context manager: `with` makes a context active for the synchronous call. */
class StackContextManager implements ContextManager {
  private current: Context = ROOT_CONTEXT;
  active(): Context {
    return this.current;
  }
  with<A extends unknown[], F extends (...args: A) => ReturnType<F>>(
    ctx: Context,
    fn: F,
    thisArg?: ThisParameterType<F>,
    ...args: A
  ): ReturnType<F> {
    const before = this.current;
    this.current = ctx;
    try {
      return fn.call(thisArg, ...args);
    } finally {
      this.current = before;
    }
  }
  bind<T>(_ctx: Context, target: T): T {
    return target;
  }
  enable(): this {
    return this;
  }
  disable(): this {
    this.current = ROOT_CONTEXT;
    return this;
  }
}

describe('trace context from the sender to the worker and the sink', () => {
  let t: TestDaemon;
  let worker: Worker;
  let corral: Corral;
  let api: Api;
  let raw: pg.Client;
  const rx = new WebhookReceiver();
  /** What the handler saw, by the event's `n`. */
  const seen = new Map<string, { trace: unknown; eventId: string }>();

  beforeAll(async () => {
    await rx.start();
    t = await startTestDaemon({ drainMs: 0 });
    await addSink(t.daemon.database.db, { name: 'traced', url: rx.url('/traced'), allowPrivate: true });
    worker = createWorker({
      endpoint: t.daemon.broker.endpoint,
      insecure: true,
      workerId: 'tracer-1',
      capacity: 4,
      logger: testLogger,
      handler: async (ctx) => {
        const data = ctx.event.data as { n: string; emit?: boolean; deliver?: boolean };
        seen.set(data.n, { trace: ctx.trace, eventId: ctx.event.id });
        return {
          messages: [{ role: 'assistant', content: 'ok' }],
          ...(data.emit ? { emit: [{ actor: `trace/${data.n}-child`, data: { n: `${data.n}-child` } }] } : {}),
          ...(data.deliver ? { deliver: [{ sink: 'traced', body: { n: data.n } }] } : {}),
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
    await rx.stop();
    context.disable();
  });

  const handled = (n: string) => waitFor(() => seen.get(n), { what: `the turn of ${n}`, timeoutMs: 15_000 });
  const storedTrace = async (eventId: string) =>
    (await raw.query<{ trace: unknown }>(`select data->'trace' as trace from pgboss.job where id = $1`, [eventId])).rows[0]?.trace ?? null;

  it('send({ traceparent, tracestate }): the worker gets it, the emitted event keeps it, the sink receives it', async () => {
    const sent = await corral.send('trace/explicit', { n: 'explicit', emit: true, deliver: true }, { traceparent: TP, tracestate: TS });
    expect(await storedTrace(sent.eventId)).toEqual({ traceparent: TP, tracestate: TS });
    expect((await handled('explicit')).trace).toEqual({ traceparent: TP, tracestate: TS });
    // the turn's emit continues the same trace
    expect((await handled('explicit-child')).trace).toEqual({ traceparent: TP, tracestate: TS });
    const hook = await waitFor(() => rx.received.find((r) => r.path === '/traced' && r.body.includes('"explicit"')), {
      what: 'the webhook',
    });
    expect([hook.traceparent, hook.tracestate]).toEqual([TP, TS]);
  });

  it('an event sent with none has none, and its webhook no traceparent', async () => {
    const sent = await corral.send('trace/none', { n: 'none', deliver: true });
    expect(await storedTrace(sent.eventId)).toBeNull();
    expect((await handled('none')).trace).toBeUndefined();
    const hook = await waitFor(() => rx.received.find((r) => r.path === '/traced' && r.body.includes('"none"')), { what: 'the webhook' });
    expect(hook.traceparent).toBe('');
  });

  it("send() continues the caller's active OpenTelemetry span; traceparent: null opts out", async () => {
    context.setGlobalContextManager(new StackContextManager());
    const span = trace.wrapSpanContext({ traceId: 'aa'.repeat(16), spanId: 'bb'.repeat(8), traceFlags: 1 });
    const [active, optedOut] = await context.with(trace.setSpan(ROOT_CONTEXT, span), () =>
      Promise.all([
        corral.send('trace/active', { n: 'active' }),
        corral.send('trace/opted-out', { n: 'opted-out' }, { traceparent: null }),
      ]),
    );
    expect(await storedTrace(active.eventId)).toEqual({ traceparent: `00-${'aa'.repeat(16)}-${'bb'.repeat(8)}-01` });
    expect(await storedTrace(optedOut.eventId)).toBeNull();
    expect((await handled('active')).trace).toEqual({ traceparent: `00-${'aa'.repeat(16)}-${'bb'.repeat(8)}-01` });
    // outside the span's context: none
    const outside = await corral.send('trace/outside', { n: 'outside' });
    expect(await storedTrace(outside.eventId)).toBeNull();
  });

  it('a job written by other means with a malformed trace still runs, with no trace', async () => {
    const job = actorEventJob({ agentUid: 'trace', sessionId: 'forged' }, { n: 'forged' }, 1024, {
      traceparent: "00-x' or 1=1--",
    } as unknown as TraceCarrier);
    await t.daemon.boss.send(t.daemon.queues.events, job.data, { id: job.id, singletonKey: job.singletonKey });
    expect((await handled('forged')).trace).toBeUndefined();
    await waitFor(
      async () => (await raw.query(`select 1 from corral.turns where event_id = $1 and status = 'succeeded'`, [job.id])).rowCount === 1,
      { what: 'the forged event committed' },
    );
    const rows = await raw.query<{ traceparent: string | null }>(`select traceparent from corral.turns where event_id = $1`, [job.id]);
    expect(rows.rows.map((r) => r.traceparent)).toEqual([null]);
  });

  it('a malformed traceparent or tracestate given to send is refused, nothing enqueued', async () => {
    const bad = [
      { traceparent: 'not-a-traceparent' },
      { traceparent: TP.toUpperCase() },
      { traceparent: `ff${TP.slice(2)}` },
      { traceparent: `00-${'0'.repeat(32)}-00f067aa0ba902b7-01` },
      { traceparent: `00-4bf92f3577b34da6a3ce929d0e0e4736-${'0'.repeat(16)}-01` },
      { traceparent: `${TP}-extra` },
      { traceparent: TP, tracestate: 'x'.repeat(513) },
      { traceparent: TP, tracestate: 'a=\u00e9' },
      { traceparent: 42 as unknown as string },
    ];
    for (const opts of bad)
      expect(await errorCodeOf(corral.send('trace/bad', { n: 'bad' }, opts)), JSON.stringify(opts)).toBe('invalid_argument');
    expect((await raw.query(`select 1 from pgboss.job where singleton_key = 'trace/bad'`)).rowCount).toBe(0);
  });

  it('HTTP: the request’s traceparent/tracestate are kept; an invalid one is ignored, as W3C says', async () => {
    const token = await api.token('tracer', ['send']);
    const post = (n: string, headers: Record<string, string>) =>
      api.call(`/v1/actors/trace/http-${n}/events`, {
        method: 'POST',
        token,
        headers: { 'content-type': 'application/json', ...headers },
        body: JSON.stringify({ n: `http-${n}` }),
      });
    const ok = await post('ok', { traceparent: TP, tracestate: TS });
    expect(ok.status).toBe(202);
    const okId = ((await ok.json()) as { event_id: string }).event_id;
    expect(await storedTrace(okId)).toEqual({ traceparent: TP, tracestate: TS });
    expect((await handled('http-ok')).trace).toEqual({ traceparent: TP, tracestate: TS });
    const invalid = await post('invalid', { traceparent: 'garbage', tracestate: TS });
    expect(invalid.status).toBe(202);
    expect(await storedTrace(((await invalid.json()) as { event_id: string }).event_id)).toBeNull();
    // a later version's traceparent keeps its first four fields, as version 00
    const later = await post('later', { traceparent: `01-${TP.slice(3)}-what-comes-next` });
    expect(await storedTrace(((await later.json()) as { event_id: string }).event_id)).toEqual({ traceparent: TP });
  });

  it('SQL: corral.send_event takes a traceparent (and tracestate); a malformed one is refused', async () => {
    const one = await raw.query<{ id: string }>(`select corral.send_event('trace', 'sql', '{"n":"sql"}'::jsonb, null, $1, $2) as id`, [
      TP,
      TS,
    ]);
    expect(await storedTrace(one.rows[0]!.id)).toEqual({ traceparent: TP, tracestate: TS });
    expect((await handled('sql')).trace).toEqual({ traceparent: TP, tracestate: TS });
    const named = await raw.query<{ id: string }>(
      `select corral.send_event('trace', 'sql-named', '{"n":"sql-named"}'::jsonb, traceparent => $1) as id`,
      [TP],
    );
    expect(await storedTrace(named.rows[0]!.id)).toEqual({ traceparent: TP });
    // the four-argument call is unchanged
    const plain = await raw.query<{ id: string }>(`select corral.send_event('trace', 'sql-plain', '{"n":"sql-plain"}'::jsonb, 'k1') as id`);
    expect(await storedTrace(plain.rows[0]!.id)).toBeNull();
    for (const [tp, ts] of [
      ['nope', null],
      [TP, 'é'],
      [TP, 'x'.repeat(513)],
      [`00-${'0'.repeat(32)}-00f067aa0ba902b7-01`, null],
    ]) {
      const err = await raw
        .query(`select corral.send_event('trace', 'sql-bad', '{}'::jsonb, null, $1, $2)`, [tp, ts])
        .catch((e: { code?: string; message?: string }) => e);
      expect((err as { code?: string }).code, String(tp)).toBe('CR400');
    }
    expect((await raw.query(`select 1 from pgboss.job where singleton_key = 'trace/sql-bad'`)).rowCount).toBe(0);
    const sendEvents = await raw.query<{ event_id: string }>(`select event_id from corral.send_events($1::jsonb)`, [
      JSON.stringify([{ agent_uid: 'trace', session_id: 'sql-batch', data: { n: 'sql-batch' }, traceparent: TP }]),
    ]);
    expect(await storedTrace(sendEvents.rows[0]!.event_id)).toEqual({ traceparent: TP });
  });
});
