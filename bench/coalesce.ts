/**
 * Coalesced bursts: a burst of E events to each of A actors (10 × 500 = 5,000 events by default),
 * sent through the client's `sendMany` (each actor's events in one call, in order; all actors at
 * once) to a fresh `corral daemon --workers W` (real daemon and example worker processes, a fresh
 * database it migrates itself, a warm-up of `--warmup` single events to other actors first),
 * measured twice in the same run: once under the input policy `queue` (the default: one turn per
 * event) and once under `coalesce`, set for the bench's agent before the send (a turn takes the
 * events queued behind its own, at most `--max-events`). Reports events committed per second
 * (every event's job completed ÷ the time from the first send to the last completion, database
 * clock), how long the sends took and how many events had committed by then, turns run and their
 * sizes, CPU per event, and the ratio coalesce / queue of events/s. Acceptance: coalesce ≥ 3×
 * queue (reported, not enforced). Checks correctness each time: every event's job completed,
 * every event committed by exactly one succeeded turn, each actor's transcript holding its E user
 * messages in send order (and one reply per turn); exit 1 when a check fails. See
 * docs/benchmarks.md.
 *
 *   npm run bench:coalesce -- [--actors 500] [--events-per-actor 10] [--max-events N] [--workers 2]
 *                             [--capacity 32] [--rounds 1] [--warmup 500] [--timeout-seconds 120] [--json]
 *
 * `--rounds R` repeats the pair (the headline is the median ratio), alternating which policy runs
 * first, queue in the first round. Embedded PostgreSQL unless DATABASE_URL is set.
 */
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { connect, type Corral } from '../src/client/index.ts';
import { DEFAULTS } from '../src/config.ts';
import { openDatabase, type Database } from '../src/db/client.ts';
import { DEFAULT_BATCH_EVENTS, DEFAULT_WORKER_CAPACITY, MAX_BATCH_EVENTS } from '../src/base/defaults.ts';
import { MAX_SEND_BATCH } from '../src/db/views.ts';
import { Cleanup, median, progress, roundDeep, runBench, sleep } from './lib/common.ts';
import { openBenchDatabase, type ServerCpu } from './lib/database.ts';
import { daemonCpuMs, freshDatabase, scalar, startDaemonProcess, waitForWorkers, type DaemonProcess } from './lib/daemon-process.ts';

/** The acceptance bar: coalesce commits the burst at ≥ this many times queue's events/s. */
const BAR = 3;

type Mode = 'queue' | 'coalesce';

interface Options {
  actors: number;
  perActor: number;
  /** Coalesce's `maxEvents`; absent: the policy's default (20). */
  maxEvents: number | undefined;
  workers: number;
  capacity: number;
  rounds: number;
  warmup: number;
  timeoutSeconds: number;
  json: boolean;
}

const USAGE =
  'usage: npm run bench:coalesce -- [--actors A] [--events-per-actor E] [--max-events N] [--workers W] [--capacity C] [--rounds R] [--warmup N] [--timeout-seconds T] [--json]\n';

function options(): Options {
  const { values } = parseArgs({
    options: {
      actors: { type: 'string', default: '500' },
      'events-per-actor': { type: 'string', default: '10' },
      'max-events': { type: 'string' },
      workers: { type: 'string', default: '2' },
      capacity: { type: 'string', default: String(DEFAULT_WORKER_CAPACITY) },
      rounds: { type: 'string', default: '1' },
      warmup: { type: 'string', default: '500' },
      'timeout-seconds': { type: 'string', default: '120' },
      json: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (values.help) {
    process.stdout.write(USAGE);
    process.exit(0);
  }
  const o: Options = {
    actors: Number(values.actors),
    perActor: Number(values['events-per-actor']),
    maxEvents: values['max-events'] === undefined ? undefined : Number(values['max-events']),
    workers: Number(values.workers),
    capacity: Number(values.capacity),
    rounds: Number(values.rounds),
    warmup: Number(values.warmup),
    timeoutSeconds: Number(values['timeout-seconds']),
    json: values.json,
  };
  const positive = [o.actors, o.perActor, o.workers, o.capacity, o.rounds, o.timeoutSeconds, o.maxEvents ?? 1];
  const fail = (msg: string) => {
    process.stderr.write(`bench:coalesce: ${msg}\n${USAGE}`);
    process.exit(2);
  };
  if (!positive.every((n) => Number.isInteger(n) && n > 0) || !Number.isInteger(o.warmup) || o.warmup < 0) {
    fail('every option takes a positive integer (--warmup: 0 or more)');
  }
  if (o.maxEvents !== undefined && o.maxEvents > MAX_BATCH_EVENTS) fail(`--max-events is at most ${MAX_BATCH_EVENTS}`);
  if (o.perActor > MAX_SEND_BATCH) fail(`--events-per-actor is at most ${MAX_SEND_BATCH} (one sendMany per actor's burst)`);
  return o;
}

interface ModeResult {
  mode: Mode;
  round: number;
  events: number;
  /** Jobs of the burst completed when the bench stopped waiting. */
  completed: number;
  /** First send → last job completed, database clock. */
  seconds: number;
  /** The sends alone (database clock): first send → the last sendMany returned. */
  sendSeconds: number;
  /** Events of the burst committed by the time the last sendMany returned. */
  committedWhenSent: number;
  eventsPerSec: number;
  /** Succeeded turns of the bench's agent; `attempts` counts every turn row (retries, failures). */
  turns: number;
  attempts: number;
  eventsPerTurn: number;
  /** Succeeded turns by the number of events they took: `{ "1": 500, "10": 450, … }`. */
  turnSizes: Record<string, number>;
  /** CPU per event during the burst, ms: the daemon process, its worker processes, PostgreSQL. */
  daemonMsPerEvent: number;
  workersMsPerEvent: number;
  pgMsPerEvent: number;
  /** Correctness failures; empty when every check passed. */
  failures: string[];
}

interface Report {
  params: Options & { events: number; coalesceMaxEvents: number };
  results: ModeResult[];
  /** Per round: coalesce events/s ÷ queue events/s. */
  ratios: number[];
  /** The median of `ratios`. */
  ratio: number;
  /** Per round: CPU per event (daemon + workers + PostgreSQL) under queue ÷ under coalesce; less sensitive to other load. */
  cpuRatios: number[];
  bar: number;
  barMet: boolean;
  correct: boolean;
}

const JOBS = `${DEFAULTS.bossSchema}.job`;

/** Jobs of the queue completed so far. */
const completedJobs = (db: Database) =>
  scalar(db.pool, `select count(*)::int as n from ${JOBS} where name = $1 and state = 'completed'`, [DEFAULTS.queueName]);

/** Sends `n` events, one to each of `n` actors of `agent`, and waits until their jobs completed. */
async function warmUp(corral: Corral, db: Database, n: number, deadline: number): Promise<void> {
  if (n === 0) return;
  const before = await completedJobs(db);
  for (let i = 0; i < n; i += MAX_SEND_BATCH) {
    const chunk = Array.from({ length: Math.min(MAX_SEND_BATCH, n - i) }, (_, j) => ({ actor: `warmup/w${i + j}`, data: { text: 'w' } }));
    await corral.sendMany(chunk);
  }
  while ((await completedJobs(db)) < before + n) {
    if (performance.now() > deadline) throw new Error(`warm-up: ${n} events not committed within --timeout-seconds`);
    await sleep(50);
  }
}

/** The burst: each actor's events in order, one sendMany per group of actors (≤ MAX_SEND_BATCH events). */
function burstCalls(agent: string, opts: Options): { actor: string; data: { text: string } }[][] {
  const perCall = Math.max(1, Math.floor(MAX_SEND_BATCH / opts.perActor));
  const calls: { actor: string; data: { text: string } }[][] = [];
  for (let a = 0; a < opts.actors; a += perCall) {
    const call: { actor: string; data: { text: string } }[] = [];
    for (let i = a; i < Math.min(opts.actors, a + perCall); i++) {
      for (let e = 0; e < opts.perActor; e++) call.push({ actor: `${agent}/s${i}`, data: { text: `e${e}` } });
    }
    calls.push(call);
  }
  return calls;
}

/** The correctness checks of one burst; returns what failed. */
async function verify(db: Database, agent: string, ids: string[], opts: Options): Promise<string[]> {
  const failures: string[] = [];
  const n = ids.length;
  const jobs = await db.pool.query<{ completed: number; total: number }>(
    `select count(*) filter (where state = 'completed')::int as completed, count(*)::int as total
       from ${JOBS} where name = $1 and id = any($2::uuid[])`,
    [DEFAULTS.queueName, ids],
  );
  const j = jobs.rows[0]!;
  if (j.total !== n || j.completed !== n) failures.push(`jobs: ${j.completed} of ${n} completed (${j.total} found)`);
  // Every event committed by exactly one succeeded turn: as its own event or as a member of a batch.
  const once = await db.pool.query<{ taken: number; uniq: number; ours: number }>(
    `with s as (
       select t.event_id as id from corral.turns t join corral.conversations c on c.id = t.conversation_id
        where c.agent_uid = $1 and t.status = 'succeeded'
       union all
       select (m->>'event_id')::uuid from corral.turns t join corral.conversations c on c.id = t.conversation_id,
              jsonb_array_elements(t.coalesced) m
        where c.agent_uid = $1 and t.status = 'succeeded' and t.coalesced is not null)
     select count(*)::int as taken, count(distinct id)::int as uniq, count(*) filter (where id = any($2::uuid[]))::int as ours from s`,
    [agent, ids],
  );
  const o = once.rows[0]!;
  if (o.taken !== n || o.uniq !== n || o.ours !== n) {
    failures.push(`exactly once: succeeded turns took ${o.taken} events (${o.uniq} distinct, ${o.ours} of the burst's ${n})`);
  }
  // Transcripts: each actor's user messages are its events in send order; one reply per turn.
  const msgs = await db.pool.query<{ session_id: string; role: string; text: string | null }>(
    `select c.session_id, m.role, m.content->>'text' as text
       from corral.messages m join corral.conversations c on c.id = m.conversation_id
      where c.agent_uid = $1 order by c.session_id, m.seq`,
    [agent],
  );
  const turns = await scalar(
    db.pool,
    `select count(*)::int as n from corral.turns t join corral.conversations c on c.id = t.conversation_id
      where c.agent_uid = $1 and t.status = 'succeeded'`,
    [agent],
  );
  const users = new Map<string, string[]>();
  let replies = 0;
  for (const r of msgs.rows) {
    if (r.role === 'assistant') replies++;
    if (r.role !== 'user') continue;
    const list = users.get(r.session_id) ?? [];
    list.push(r.text ?? '');
    users.set(r.session_id, list);
  }
  const userCount = [...users.values()].reduce((s, l) => s + l.length, 0);
  if (userCount !== n) failures.push(`transcripts: ${userCount} user messages, expected ${n}`);
  if (replies !== turns) failures.push(`transcripts: ${replies} assistant messages for ${turns} turns`);
  const expected = Array.from({ length: opts.perActor }, (_, e) => `e${e}`).join(',');
  let outOfOrder = 0;
  for (let i = 0; i < opts.actors; i++) if ((users.get(`s${i}`) ?? []).join(',') !== expected) outOfOrder++;
  if (outOfOrder > 0) failures.push(`transcripts: ${outOfOrder} of ${opts.actors} actors' user messages not their events in send order`);
  return failures;
}

async function runMode(serverUrl: string, serverCpu: ServerCpu, mode: Mode, round: number, opts: Options): Promise<ModeResult> {
  const cleanup = new Cleanup();
  try {
    const fresh = await freshDatabase(serverUrl, cleanup, 'corral_coalesce');
    const daemon: DaemonProcess = await startDaemonProcess({ url: fresh.url, workers: opts.workers, capacity: opts.capacity }, cleanup);
    const db = openDatabase(fresh.url, { max: 2, applicationName: 'corral-bench' });
    cleanup.defer('close bench pool', () => db.close());
    // The daemon creates corral's tables and pg-boss's schema; the bench connects once it has.
    await waitForWorkers(db, opts.workers, 90_000, daemon.proc);
    const corral = await connect({ databaseUrl: fresh.url, maxConnections: 2, applicationName: 'corral-bench' });
    cleanup.defer('close client', () => corral.close());
    const deadline = performance.now() + opts.timeoutSeconds * 1000;
    await warmUp(corral, db, opts.warmup, deadline);

    const agent = `bench-${mode}`;
    if (mode === 'coalesce')
      await corral.setInputPolicy(agent, 'coalesce', opts.maxEvents === undefined ? {} : { maxEvents: opts.maxEvents });
    const calls = burstCalls(agent, opts);
    const n = opts.actors * opts.perActor;
    const before = await completedJobs(db);
    const cpu0 = await daemonCpuMs(daemon);
    const pg0 = (await serverCpu?.()) ?? 0;
    const { rows } = await db.pool.query<{ t: string }>(`select clock_timestamp()::text as t`);
    const t0Db = rows[0]!.t;
    const ids: string[] = [];
    for (const call of calls) for (const sent of await corral.sendMany(call)) ids.push(sent.eventId);
    const sentAt = await db.pool.query<{ t: string; n: number }>(
      `select clock_timestamp()::text as t, (select count(*)::int from ${JOBS} where name = $1 and state = 'completed') as n`,
      [DEFAULTS.queueName],
    );
    const tSentDb = sentAt.rows[0]!.t;
    const committedWhenSent = sentAt.rows[0]!.n - before;
    let completed = 0;
    let lastLog = performance.now();
    for (;;) {
      completed = (await completedJobs(db)) - before;
      if (completed >= n) break;
      if (performance.now() > deadline) {
        progress(`${mode}: ${completed}/${n} committed at the --timeout-seconds deadline`);
        break;
      }
      if (performance.now() - lastLog > 2_000) {
        lastLog = performance.now();
        progress(`${mode}: ${completed}/${n} committed`);
      }
      await sleep(25);
    }
    const cpu1 = await daemonCpuMs(daemon);
    const pg1 = (await serverCpu?.()) ?? 0;
    const window = await db.pool.query<{ s: string; sent: string }>(
      `select extract(epoch from (max(completed_on) - $1::timestamptz))::text as s,
              extract(epoch from ($2::timestamptz - $1::timestamptz))::text as sent
         from ${JOBS} where name = $3 and id = any($4::uuid[])`,
      [t0Db, tSentDb, DEFAULTS.queueName, ids],
    );
    const seconds = Number(window.rows[0]!.s);
    const sendSeconds = Number(window.rows[0]!.sent);
    const sizes = await db.pool.query<{ size: number; turns: number; attempts: number }>(
      `select case when t.status = 'succeeded' then 1 + coalesce(jsonb_array_length(t.coalesced), 0) else 0 end as size,
              count(*) filter (where t.status = 'succeeded')::int as turns, count(*)::int as attempts
         from corral.turns t join corral.conversations c on c.id = t.conversation_id
        where c.agent_uid = $1 group by 1 order by 1`,
      [agent],
    );
    const turnSizes: Record<string, number> = {};
    let turns = 0;
    let attempts = 0;
    for (const r of sizes.rows) {
      if (r.turns > 0) turnSizes[String(r.size)] = r.turns;
      turns += r.turns;
      attempts += r.attempts;
    }
    const failures =
      completed >= n ? await verify(db, agent, ids, opts) : [`only ${completed} of ${n} events committed within --timeout-seconds`];
    const r: ModeResult = {
      mode,
      round,
      events: n,
      completed,
      seconds,
      sendSeconds,
      committedWhenSent,
      eventsPerSec: completed / seconds,
      turns,
      attempts,
      eventsPerTurn: completed / Math.max(1, turns),
      turnSizes,
      daemonMsPerEvent: (cpu1.daemon - cpu0.daemon) / n,
      workersMsPerEvent: (cpu1.workers - cpu0.workers) / n,
      pgMsPerEvent: serverCpu ? (pg1 - pg0) / n : Number.NaN,
      failures,
    };
    progress(
      `${mode}: ${n} events in ${seconds.toFixed(2)} s → ${r.eventsPerSec.toFixed(0)} events/s, ${turns} turns` +
        (failures.length ? `; FAILED: ${failures.join('; ')}` : '; correct'),
    );
    return r;
  } finally {
    await cleanup.run();
  }
}

function print(report: Report): void {
  const out = (s: string) => process.stdout.write(`${s}\n`);
  const f = (x: number, d = 0) => (Number.isFinite(x) ? x.toFixed(d) : '-');
  const p = report.params;
  out(
    `\ncoalesced bursts: ${p.perActor} events to each of ${p.actors} actors (${p.events}) per burst, sendMany per actor's burst; ` +
      `${p.workers} worker processes × ${p.capacity} slots; a fresh daemon and database each; coalesce max-events ${p.coalesceMaxEvents}`,
  );
  const header = ['round', 'policy', 'events/s', 'seconds', 'send s', 'committed by then', 'turns', 'turn sizes (events: turns)'];
  const rows = report.results.map((r) => {
    const sizes = Object.entries(r.turnSizes)
      .map(([k, v]) => `${k}: ${v}`)
      .join(', ');
    return [
      String(r.round + 1),
      r.mode,
      f(r.eventsPerSec),
      f(r.seconds, 2),
      f(r.sendSeconds, 2),
      String(r.committedWhenSent),
      String(r.turns) + (r.attempts > r.turns ? ` (${r.attempts} attempts)` : ''),
      sizes.length > 40 ? `${sizes.slice(0, 37)}...` : sizes,
      `${f(r.daemonMsPerEvent, 3)} + ${f(r.workersMsPerEvent, 3)} + ${f(r.pgMsPerEvent, 3)}`,
      r.failures.length ? 'NO' : 'yes',
    ];
  });
  header.push('CPU/event ms: daemon + workers + pg', 'correct');
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]) => cells.map((c, i) => (i === 1 || i === 7 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ');
  out(`\n${line(header)}`);
  for (const r of rows) out(line(r));
  out(
    `\nratio coalesce / queue, events/s: ${f(report.ratio, 2)}×` +
      (report.ratios.length > 1 ? ` (median of ${report.ratios.map((x) => f(x, 2)).join(', ')})` : '') +
      `; acceptance ≥ ${report.bar}×: ${report.barMet ? 'met' : 'NOT met'}`,
  );
  out(
    `CPU per event, queue / coalesce: ${report.cpuRatios.map((x) => `${f(x, 2)}×`).join(', ')} (daemon + workers + ${
      Number.isFinite(report.results[0]?.pgMsPerEvent ?? Number.NaN) ? 'PostgreSQL' : 'no PostgreSQL: not measurable here'
    })`,
  );
  for (const r of report.results) for (const x of r.failures) out(`round ${r.round + 1} ${r.mode}: FAILED ${x}`);
  out(
    report.correct
      ? 'correctness: every event committed exactly once, every job completed, each transcript in send order'
      : 'correctness: FAILED',
  );
}

/** CPU per event, ms: the daemon, its workers and (when measurable) PostgreSQL. */
const cpuPerEvent = (r: ModeResult) => r.daemonMsPerEvent + r.workersMsPerEvent + (Number.isFinite(r.pgMsPerEvent) ? r.pgMsPerEvent : 0);

async function main(): Promise<number> {
  const opts = options();
  return runBench(async (cleanup) => {
    const server = await openBenchDatabase(cleanup);
    const results: ModeResult[] = [];
    const ratios: number[] = [];
    const cpuRatios: number[] = [];
    for (let round = 0; round < opts.rounds; round++) {
      const order: Mode[] = round % 2 === 0 ? ['queue', 'coalesce'] : ['coalesce', 'queue'];
      const got: Partial<Record<Mode, ModeResult>> = {};
      for (const mode of order) {
        progress(`round ${round + 1}/${opts.rounds}: ${mode}`);
        const r = await runMode(server.url, server.serverCpuMs, mode, round, opts);
        got[mode] = r;
        results.push(r);
      }
      ratios.push(got.coalesce!.eventsPerSec / got.queue!.eventsPerSec);
      cpuRatios.push(cpuPerEvent(got.queue!) / cpuPerEvent(got.coalesce!));
    }
    const ratio = median(ratios);
    const correct = results.every((r) => r.failures.length === 0);
    const report: Report = {
      params: { ...opts, events: opts.actors * opts.perActor, coalesceMaxEvents: opts.maxEvents ?? DEFAULT_BATCH_EVENTS },
      results,
      ratios,
      ratio,
      cpuRatios,
      bar: BAR,
      barMet: ratio >= BAR,
      correct,
    };
    if (opts.json) process.stdout.write(`${JSON.stringify(roundDeep(report), null, 2)}\n`);
    else print(report);
    return correct ? 0 : 1;
  });
}

process.exitCode = await main();
