/**
 * Watch latency: how soon `corral.watch` yields a turn's `started` and `committed` after the
 * daemon wrote them (see docs/benchmarks.md, "Watch latency").
 *
 *   node bin/run-ts.js bench/watch.ts [--samples 100] [--actors 20] [--burst 10] [--workers 2] [--capacity 32] [--json]
 *
 * A daemon with W example workers runs as an OS process (`corral daemon --workers W`, as
 * deployed); the client runs in this process and watches through LISTEN/NOTIFY alone.
 *  - single: S events one at a time on one warm actor; each is sent once the previous committed;
 *  - burst: A watched actors get B events each in one `sendMany`.
 * Latency of an event = when the watch yielded it − when the database wrote it: the begin's
 * `turns.started_at` for `started`, the commit's `turns.finished_at` for `committed` (both are
 * `now()`, their transaction's start: the commit transaction's own duration is included, so the
 * figures are upper bounds). One clock: the bench and PostgreSQL run on one host. Also reported:
 * send → yielded, as an application sees it.
 *
 * Embedded PostgreSQL in a temporary folder unless DATABASE_URL (then a scratch database on it).
 */
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import type pg from 'pg';
import { connect, type Corral, type TurnEvent, type TurnWatch } from '../src/client/index.ts';
import { DEFAULT_WORKER_CAPACITY } from '../src/base/defaults.ts';
import { migrateDatabase } from '../src/db/migrate.ts';
import { openDatabase } from '../src/db/client.ts';
import { progress, round, runBench, summarise, type Percentiles } from './lib/common.ts';
import { openBenchDatabase } from './lib/database.ts';
import { freshDatabase, startDaemonProcess, waitForWorkers } from './lib/daemon-process.ts';

function options() {
  const { values } = parseArgs({
    options: {
      samples: { type: 'string', default: '100' },
      actors: { type: 'string', default: '20' },
      burst: { type: 'string', default: '10' },
      workers: { type: 'string', default: '2' },
      capacity: { type: 'string', default: String(DEFAULT_WORKER_CAPACITY) },
      json: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (values.help) {
    process.stdout.write(
      'usage: node bin/run-ts.js bench/watch.ts [--samples S] [--actors A] [--burst B] [--workers W] [--capacity C] [--json]\n',
    );
    process.exit(0);
  }
  const int = (name: string, v: string) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < 1) throw new Error(`--${name} takes a positive integer`);
    return n;
  };
  return {
    samples: int('samples', values.samples),
    actors: int('actors', values.actors),
    burst: int('burst', values.burst),
    workers: int('workers', values.workers),
    capacity: int('capacity', values.capacity),
    json: values.json,
  };
}

interface Heard {
  event: TurnEvent;
  /** performance.now() when yielded. */
  at: number;
}

/** Reads `watch` into `into` until it is closed. */
function collect(watch: TurnWatch, into: Heard[]): Promise<void> {
  return (async () => {
    for await (const e of watch) {
      if (e.kind === 'gap') throw new Error(`the watch reported a gap (${e.reason})`);
      into.push({ event: e, at: performance.now() });
    }
  })();
}

/** performance.now() of a database timestamp (epoch ms), by this process's clock. */
const toPerf = (epochMs: number) => epochMs - (Date.now() - performance.now());

async function turnTimes(c: pg.Pool, eventIds: string[]): Promise<Map<string, { started: number; finished: number }>> {
  const { rows } = await c.query<{ event_id: string; started: string; finished: string }>(
    `select event_id, extract(epoch from started_at) * 1000 as started, extract(epoch from finished_at) * 1000 as finished
       from corral.turns where status = 'succeeded' and event_id = any($1::uuid[])`,
    [eventIds],
  );
  return new Map(rows.map((r) => [r.event_id, { started: Number(r.started), finished: Number(r.finished) }]));
}

interface PhaseResult {
  events: number;
  started: Percentiles;
  committed: Percentiles;
  sendToStarted: Percentiles;
  sendToCommitted: Percentiles;
}

async function latencies(pool: pg.Pool, heard: Heard[], sentAt: Map<string, number>): Promise<PhaseResult> {
  const times = await turnTimes(pool, [...sentAt.keys()]);
  const started: number[] = [];
  const committed: number[] = [];
  const sendToStarted: number[] = [];
  const sendToCommitted: number[] = [];
  for (const h of heard) {
    const t = times.get(h.event.eventId);
    const sent = sentAt.get(h.event.eventId);
    if (!t || sent === undefined) continue;
    if (h.event.kind === 'started') {
      started.push(h.at - toPerf(t.started));
      sendToStarted.push(h.at - sent);
    } else if (h.event.kind === 'committed') {
      committed.push(h.at - toPerf(t.finished));
      sendToCommitted.push(h.at - sent);
    }
  }
  return {
    events: sentAt.size,
    started: summarise(started),
    committed: summarise(committed),
    sendToStarted: summarise(sendToStarted),
    sendToCommitted: summarise(sendToCommitted),
  };
}

async function single(corral: Corral, pool: pg.Pool, samples: number): Promise<PhaseResult> {
  const watch = await corral.watchTurns('bench-watch/single');
  const heard: Heard[] = [];
  const reading = collect(watch, heard);
  const sentAt = new Map<string, number>();
  // one turn first, not measured: the actor's activation is warm afterwards
  const warm = await corral.send('bench-watch/single', { text: 'warm' });
  await corral.waitForTurn(warm.eventId);
  for (let i = 0; i < samples; i++) {
    const t0 = performance.now();
    const { eventId } = await corral.send('bench-watch/single', { text: `s${i}` });
    sentAt.set(eventId, t0);
    const deadline = performance.now() + 30_000;
    while (!heard.some((h) => h.event.eventId === eventId && h.event.kind === 'committed')) {
      if (performance.now() > deadline) throw new Error(`no committed event for ${eventId} within 30 s`);
      await new Promise((r) => setTimeout(r, 1));
    }
  }
  await watch.close();
  await reading;
  return latencies(pool, heard, sentAt);
}

async function burst(corral: Corral, pool: pg.Pool, actors: number, perActor: number): Promise<PhaseResult> {
  const names = Array.from({ length: actors }, (_, i) => `bench-watch/burst-${i}`);
  const watches = await Promise.all(names.map((a) => corral.watchTurns(a)));
  const heard: Heard[] = [];
  const reading = watches.map((w) => collect(w, heard));
  const events = names.flatMap((a) => Array.from({ length: perActor }, (_, k) => ({ actor: a, data: { text: `b${k}` } })));
  const t0 = performance.now();
  const sent = await corral.sendMany(events);
  const sentAt = new Map(sent.map((s) => [s.eventId, t0]));
  const deadline = performance.now() + 120_000;
  while (heard.filter((h) => h.event.kind === 'committed').length < sent.length) {
    if (performance.now() > deadline) throw new Error('the burst did not commit within 120 s');
    await new Promise((r) => setTimeout(r, 5));
  }
  await Promise.all(watches.map((w) => w.close()));
  await Promise.all(reading);
  return latencies(pool, heard, sentAt);
}

const ms = (p: Percentiles) => `p50 ${round(p.p50)} ms  p95 ${round(p.p95)} ms  max ${round(p.max)} ms  (n ${p.n})`;

process.exitCode = await runBench(async (cleanup) => {
  const opts = options();
  const bench = await openBenchDatabase(cleanup);
  const db = await freshDatabase(bench.url, cleanup, 'corral_bw');
  await migrateDatabase(db.url);
  progress(`starting a daemon with ${opts.workers} workers`);
  const daemon = await startDaemonProcess({ url: db.url, workers: opts.workers, capacity: opts.capacity }, cleanup);
  const database = openDatabase(db.url, { max: 2 });
  cleanup.defer('close the database', () => database.close());
  await waitForWorkers(database, opts.workers, 60_000, daemon.proc);
  const corral = await connect({ databaseUrl: db.url, env: {} });
  cleanup.defer('close the client', () => corral.close());
  const pool = database.pool;

  progress(`single: ${opts.samples} events one at a time`);
  const one = await single(corral, pool, opts.samples);
  progress(`burst: ${opts.actors} actors × ${opts.burst} events`);
  const many = await burst(corral, pool, opts.actors, opts.burst);
  const report = { single: one, burst: many };
  if (opts.json) {
    process.stdout.write(`${JSON.stringify(report, null, 2)}\n`);
    return 0;
  }
  const lines = [
    'corral watch latency (LISTEN/NOTIFY; the watch makes no database call while it waits)',
    '-'.repeat(100),
    `single: ${one.events} events, one at a time, on one warm actor`,
    `  started    DB → yielded     ${ms(one.started)}`,
    `  committed  DB → yielded     ${ms(one.committed)}`,
    `  send → started yielded      ${ms(one.sendToStarted)}`,
    `  send → committed yielded    ${ms(one.sendToCommitted)}`,
    `burst: ${opts.actors} watched actors × ${opts.burst} events in one sendMany`,
    `  started    DB → yielded     ${ms(many.started)}`,
    `  committed  DB → yielded     ${ms(many.committed)}`,
    `  send → committed yielded    ${ms(many.sendToCommitted)}  (queueing included)`,
    '-'.repeat(100),
  ];
  process.stdout.write(`${lines.join('\n')}\n`);
  return 0;
});
