/**
 * Metrics and the observability endpoints on an in-process daemon (real PostgreSQL, ZeroMQ, HTTP):
 * counters move with real turns, database gauges are read at scrape time, /healthz and /readyz
 * answer.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { loadConfig } from '../../src/config.ts';
import { Daemon } from '../../src/daemon/daemon.ts';
import { readTranscript } from '../../src/db/turns/transcript.ts';
import { setInputPolicy } from '../../src/db/enqueue/input-policies.ts';
import { sql } from '../../src/db/orm.ts';
import { daemonReadiness, observabilityChild } from '../../src/observability/daemon-child.ts';
import { startObservabilityServer, type ObservabilityServer } from '../../src/observability/http.ts';
import { createMetrics } from '../../src/observability/metrics.ts';
import { runExampleWorker } from '../../src/worker/example.ts';
import type { Worker } from '../../src/worker/sdk.ts';
import { testLogger } from '../helpers/daemon.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { waitFor } from '../helpers/wait.ts';
import { deadLetterCount } from '../ops/helpers.ts';
import { WebhookReceiver } from '../helpers/webhook-receiver.ts';
import { addSink } from '../../src/outbox/sinks.ts';
import { sendEvent } from '../helpers/send.ts';

/** The value of one sample in Prometheus text (`name{labels} value`), or undefined. */
function sample(text: string, name: string, labels = ''): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${name}${labels ? `{${labels}}` : ''} `));
  return line === undefined ? undefined : Number(line.split(' ').at(-1));
}

describe('metrics and observability endpoints', () => {
  const tdb = useTestDatabase();
  let daemon: Daemon;
  let worker: Worker;
  let server: ObservabilityServer | undefined;
  const get = (path: string) => fetch(`${server!.url}${path}`);
  const scrape = async () => {
    const res = await get('/metrics');
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toContain('text/plain');
    return res.text();
  };
  const commitAll = async (session: string, texts: string[]) => {
    const key = actorKey('metrics', session);
    for (const text of texts) await sendEvent(daemon.database.db, key, { text });
    await waitFor(async () => (await readTranscript(daemon.database.db, key)).length === texts.length, { what: 'commits' });
  };

  beforeAll(async () => {
    const config = loadConfig({
      endpoint: 'tcp://127.0.0.1:0',
      pollIntervalMs: 200,
      watchdogIntervalMs: 100_000,
      recoveryIntervalMs: 100_000,
      retryLimit: 0,
      retryDelaySeconds: 1,
      metricsPort: 0,
      insecure: true,
    });
    const metrics = createMetrics();
    daemon = new Daemon({
      config,
      databaseUrl: tdb.url,
      logger: testLogger,
      skipMigrations: true,
      metrics: metrics.runtime,
      extraChildren: () => [
        observabilityChild({ host: '127.0.0.1', port: 0, metrics, logger: testLogger, onListening: (s) => (server = s) }),
      ],
    });
    await daemon.start();
    worker = await runExampleWorker({ endpoint: daemon.broker.endpoint, workerId: 'metrics-w1', logger: testLogger });
    await waitFor(() => server !== undefined && daemon.runtime.workers.freeSlots() === 1, { what: 'server and worker' });
  });

  afterAll(async () => {
    await worker?.stop();
    await daemon?.stop();
  });

  it('counts committed turns and dispatches between two scrapes', async () => {
    await commitAll('s1', ['one', 'two']);
    const first = await scrape();
    expect(sample(first, 'corral_turns_committed_total')).toBe(2);
    expect(sample(first, 'corral_events_dispatched_total')).toBe(2);
    await commitAll('s2', ['three', 'four', 'five']);
    const second = await scrape();
    expect(sample(second, 'corral_turns_committed_total')).toBe(5);
    expect(sample(second, 'corral_events_dispatched_total')).toBe(5);
    // database gauges, read at scrape time
    expect(sample(second, 'corral_live_activations')).toBeGreaterThanOrEqual(1);
    expect(sample(second, 'corral_workers', 'status="ready"')).toBe(1);
    expect(sample(second, 'corral_queue_events', 'state="ready"')).toBe(0);
    expect(sample(second, 'corral_metrics_database_up')).toBe(1);
    expect(second).toContain('# TYPE corral_dispatch_latency_seconds histogram');
    expect(sample(second, 'corral_dispatch_latency_seconds_count')).toBe(5);
    expect(sample(second, 'corral_commit_latency_seconds_count')).toBe(5);
    expect(second).toContain('corral_process_cpu_seconds_total');
    // the broker's own counters, read at scrape time
    expect(sample(second, 'corral_fabric_connections')).toBeGreaterThanOrEqual(1);
    expect(sample(second, 'corral_fabric_refused_total', 'kind="takeover_refused"')).toBe(0);
    // contexts: each actor's first turn read its (new) conversation, the later ones came from the cache
    expect(sample(second, 'corral_turn_contexts_total', 'source="database"')).toBe(2);
    expect(sample(second, 'corral_turn_contexts_total', 'source="cache"')).toBe(3);
    expect(sample(second, 'corral_context_cache_entries')).toBe(2);
    expect(sample(second, 'corral_context_cache_bytes')).toBeGreaterThan(0);
  });

  it('counts dead letters and shows the dead-letter queue depth', async () => {
    const { eventId } = await sendEvent(daemon.database.db, actorKey('metrics', 'fail'), { fail: true });
    await waitFor(async () => (await deadLetterCount(daemon.database.db, [eventId])) === 1, { what: 'dead letter' });
    await waitFor(async () => sample(await scrape(), 'corral_events_dead_lettered_total') === 1, { what: 'counter' });
    const text = await scrape();
    expect(sample(text, 'corral_dead_letters')).toBe(1);
    expect(sample(text, 'corral_event_retries_total')).toBe(0);
  });

  it('counts interrupted turns and the events a batch committed', async () => {
    const db = daemon.database.db;
    await setInputPolicy(db, 'metrics-int', null, 'interrupt');
    const send = async (text: string, delayMs = 0) =>
      (
        await db.execute<{ id: string }>(
          sql`select corral.send_event('metrics-int', 's', ${JSON.stringify({ text, delayMs })}::jsonb) as id`,
        )
      ).rows[0]!.id;
    const m1 = await send('m1', 800);
    await waitFor(
      async () =>
        (await db.execute<{ n: number }>(sql`select count(*)::int as n from corral.turns where event_id = ${m1}::uuid`)).rows[0]!.n > 0,
      { what: 'the first turn begun' },
    );
    await send('m2');
    const key = actorKey('metrics-int', 's');
    await waitFor(async () => (await readTranscript(db, key)).some((t) => t.status === 'succeeded'), { what: 'the batch committed' });
    const text = await scrape();
    expect(sample(text, 'corral_turns_interrupted_total')).toBe(1);
    expect(sample(text, 'corral_events_coalesced_total')).toBe(1);
  });

  it('counts outbox deliveries, retries and dead letters by sink, with the commit → receipt latency', async () => {
    const rx = new WebhookReceiver();
    await rx.start();
    try {
      rx.respond = (r, n) => (r.path === '/gone' ? { status: 410 } : n === 1 ? { status: 503 } : { status: 200 });
      await addSink(daemon.database.db, { name: 'm-ok', url: rx.url('/ok'), allowPrivate: true });
      await addSink(daemon.database.db, { name: 'm-gone', url: rx.url('/gone'), allowPrivate: true });
      await sendEvent(daemon.database.db, actorKey('metrics', 'outbox-2'), {
        text: 'y',
        deliver: [{ sink: 'm-ok' }, { sink: 'm-gone' }],
      });
      await waitFor(async () => ((await scrape()).includes('corral_outbox_delivered_total{sink="m-ok"} 1') ? true : undefined), {
        what: 'delivered',
        timeoutMs: 15_000,
      });
      const text = await scrape();
      expect(sample(text, 'corral_outbox_retries_total', 'sink="m-ok"')).toBe(1);
      expect(sample(text, 'corral_outbox_dead_letters_total', 'sink="m-gone"')).toBe(1);
      expect(sample(text, 'corral_outbox_delivery_latency_seconds_count', 'sink="m-ok"')).toBe(1);
      expect(sample(text, 'corral_outbox_delivery_latency_seconds_sum', 'sink="m-ok"')).toBeGreaterThanOrEqual(0.5);
      expect(sample(text, 'corral_outbox_messages', 'state="dead"')).toBe(1);
      expect(sample(text, 'corral_outbox_messages', 'state="pending"')).toBe(0);
    } finally {
      await rx.stop();
    }
  });

  it('answers /healthz and /readyz, and 404 elsewhere', async () => {
    expect((await get('/healthz')).status).toBe(200);
    const ready = await get('/readyz');
    expect([ready.status, await ready.text()]).toEqual([200, 'ready\n']);
    expect((await get('/nope')).status).toBe(404);
    expect((await fetch(`${server!.url}/metrics`, { method: 'POST' })).status).toBe(405);
  });

  it('/readyz is 503 while the daemon is not running', async () => {
    const metrics = createMetrics({ defaultMetrics: false });
    const starting = { state: 'starting' } as Daemon;
    const s = await startObservabilityServer({
      host: '127.0.0.1',
      port: 0,
      registry: metrics.registry,
      ready: () => daemonReadiness(starting),
    });
    try {
      const res = await fetch(`${s.url}/readyz`);
      expect([res.status, await res.text()]).toEqual([503, 'not ready: daemon is starting\n']);
      expect((await fetch(`${s.url}/healthz`)).status).toBe(200);
      // no database bound: the scrape still answers, without database samples
      const text = await (await fetch(`${s.url}/metrics`)).text();
      expect(text).toContain('corral_turns_committed_total 0');
      expect(sample(text, 'corral_workers', 'status="ready"')).toBeUndefined();
    } finally {
      await s.close();
    }
  });
});
