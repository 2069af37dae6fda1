/**
 * The outbox: how fast committed turns' messages reach a webhook receiver, and what delivering
 * costs the turn path (see docs/benchmarks.md, "Outbox").
 *
 *   npm run bench:outbox -- [--turns 2000] [--actors 200] [--sinks 1] [--concurrency 4] [--several 4] [--workers 2] [--capacity 128] [--delay 0] [--statements] [--json]
 *
 * A daemon with W example workers runs as an OS process (`corral daemon --workers W`, as
 * deployed); `sinks` sinks (`concurrency` each) point at an HTTP receiver (node:http) in this
 * process, which answers 200 at once and records when each request arrived. Rounds, in order:
 * none, one, none, several, none. Each sends `turns` events over the same `actors` actors
 * (round-robin) in one insert; `none` turns deliver nothing (the baseline), `one` turns deliver one
 * message each to their actor's sink (`{"deliver": {"sink": …}}`), `several` turns `several`
 * messages each (over the sinks in turn). Turns/s = turns ÷ (the send → the last commit, the
 * turns' `finished_at`); deliveries/s = messages ÷ (the send → the last receipt); latency of a
 * message = its receipt − its commit (the outbox row's `created_at`, the commit transaction's
 * now(); one host, one clock). A delivering round's turns/s is compared with the mean of its two
 * neighbouring baselines. A round ends when every message arrived; the bench then checks that,
 * de-duplicated by `webhook-id`, each arrived exactly once, signed, in commit order per actor and
 * sink, and fails otherwise.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { actorKey } from '../src/base/actor-key.ts';
import { openDatabase } from '../src/db/client.ts';
import { addSink } from '../src/outbox/sinks.ts';
import { verifyWebhook } from '../src/outbox/signature.ts';
import { progress, round, roundDeep, runBench, summarise, until, type Cleanup, type Percentiles } from './lib/common.ts';
import { StatementTracker } from './lib/activity.ts';
import { openBenchDatabase } from './lib/database.ts';
import {
  daemonCpuMs,
  freshDatabase,
  openBenchClient,
  startDaemonProcess,
  waitForWorkers,
  type BenchClient,
  type DaemonProcess,
} from './lib/daemon-process.ts';

function options() {
  const { values } = parseArgs({
    options: {
      turns: { type: 'string', default: '2000' },
      actors: { type: 'string', default: '200' },
      sinks: { type: 'string', default: '1' },
      concurrency: { type: 'string', default: '4' },
      several: { type: 'string', default: '4' },
      workers: { type: 'string', default: '2' },
      capacity: { type: 'string', default: '128' },
      delay: { type: 'string', default: '0' },
      statements: { type: 'boolean', default: false },
      json: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (values.help) {
    process.stdout.write(
      'usage: npm run bench:outbox -- [--turns N] [--actors A] [--sinks S] [--concurrency C] [--several K] [--workers W] [--capacity C] [--delay MS] [--statements] [--json]\n' +
        '  --turns        events per round (default 2000)\n' +
        '  --actors       actors the events go to, round-robin (default 200)\n' +
        '  --sinks        sinks, each actor delivers to one (default 1)\n' +
        "  --concurrency  each sink's concurrency: requests at once per daemon (default 4, the sinks' default; 1-64)\n" +
        '  --several      messages per turn in the `several` round (default 4, at most 16)\n' +
        '  --workers      example worker processes of the daemon (default 2)\n' +
        '  --capacity     turns at once per worker (default 128)\n' +
        '  --delay        the receiver answers each request after MS ms (default 0: at once)\n' +
        "  --statements   the delivering rounds' costliest statements per message (pg_stat_statements, embedded database only)\n" +
        '  --json         the report as JSON on stdout\n',
    );
    process.exit(0);
  }
  const int = (name: string, v: string, max = Number.MAX_SAFE_INTEGER, min = 1) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < min || n > max) {
      process.stderr.write(`bench:outbox: --${name} takes an integer from ${min} to ${max}\n`);
      process.exit(2);
    }
    return n;
  };
  return {
    turns: int('turns', values.turns),
    actors: int('actors', values.actors),
    sinks: int('sinks', values.sinks),
    concurrency: int('concurrency', values.concurrency, 64),
    several: int('several', values.several, 16),
    workers: int('workers', values.workers),
    capacity: int('capacity', values.capacity),
    delay: int('delay', values.delay, 9_000, 0),
    statements: values.statements,
    json: values.json,
  };
}

type Options = ReturnType<typeof options>;

interface Request {
  sink: string;
  id: string;
  timestamp: string;
  signature: string;
  body: string;
  /** Date.now() when the body had arrived. */
  at: number;
}

/** A receiver that answers 200 (after `delayMs`) and keeps every request (checked after the round, not while it runs). */
class Receiver {
  readonly requests: Request[] = [];
  private server: Server | undefined;

  private readonly delayMs: number;

  constructor(delayMs: number) {
    this.delayMs = delayMs;
  }

  async start(): Promise<void> {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const h = req.headers;
        this.requests.push({
          sink: (req.url ?? '/').slice(1),
          id: String(h['webhook-id'] ?? ''),
          timestamp: String(h['webhook-timestamp'] ?? ''),
          signature: String(h['webhook-signature'] ?? ''),
          body: Buffer.concat(chunks).toString('utf8'),
          at: Date.now(),
        });
        const answer = () => res.writeHead(200, { 'content-type': 'text/plain' }).end('ok');
        if (this.delayMs > 0) setTimeout(answer, this.delayMs);
        else answer();
      });
    });
    this.server.keepAliveTimeout = 60_000;
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
  }

  url(sink: string): string {
    return `http://127.0.0.1:${(this.server!.address() as AddressInfo).port}/${sink}`;
  }

  async stop(): Promise<void> {
    this.server?.closeAllConnections();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}

type Kind = 'none' | 'one' | 'several';

interface RoundResult {
  kind: Kind;
  turns: number;
  /** Send → the last commit. */
  commitMs: number;
  turnsPerS: number;
  messages: number;
  /** Send → the last receipt. */
  deliverMs?: number;
  deliveriesPerS?: number;
  latencyMs?: Percentiles;
  /** Requests beyond the first of a webhook-id (a receiver drops them). */
  duplicates?: number;
  daemonCpuMs: number;
}

interface Setup {
  o: Options;
  bench: BenchClient;
  daemon: DaemonProcess;
  rx: Receiver;
  sinks: { name: string; secret: string }[];
  /** pg_stat_statements over the delivering rounds (--statements). */
  statements?: StatementTracker;
}

const sinkName = (i: number) => `bench-${i}`;

/** The round's events: actor i of `actors` delivers to sink i mod S (`several`: the next sinks in turn too). */
function eventsOf(o: Options, kind: Kind, tag: string) {
  return Array.from({ length: o.turns }, (_, i) => {
    const a = i % o.actors;
    const text = `${tag} ${i}`;
    const n = kind === 'none' ? 0 : kind === 'one' ? 1 : o.several;
    const deliver = Array.from({ length: n }, (_, j) => ({ sink: sinkName((a + j) % o.sinks) }));
    return { key: actorKey('bench-outbox', `a${a}`), event: n === 0 ? { text } : { text, deliver: n === 1 ? deliver[0] : deliver } };
  });
}

async function runRound(s: Setup, kind: Kind, tag: string, opts: { turns?: number } = {}): Promise<RoundResult> {
  const o = { ...s.o, turns: opts.turns ?? s.o.turns };
  const events = eventsOf(o, kind, tag);
  const expected = kind === 'none' ? 0 : kind === 'one' ? o.turns : o.turns * o.several;
  const pool = s.bench.db.pool;
  await pool.query('analyze pgboss.job');
  const before = s.rx.requests.length;
  const tracked = expected > 0 && tag !== 'warm' ? s.statements : undefined;
  await tracked?.begin();
  const cpu0 = (await daemonCpuMs(s.daemon)).daemon;
  const t0 = Date.now();
  const ids = await s.bench.enqueue(events);
  const deadline = performance.now() + 300_000;
  await until(
    async () => {
      const { rows } = await pool.query<{ n: number }>(
        "select count(*)::int as n from corral.turns where event_id = any($1::uuid[]) and status = 'succeeded'",
        [ids],
      );
      return rows[0]!.n >= ids.length;
    },
    deadline,
    `${tag}: ${ids.length} turns committed`,
    250, // the times come from the database: a slower poll only ends the wait later, and costs the server less
  );
  const pending = async () => {
    const { rows } = await pool.query<{ n: number }>(
      "select count(*)::int as n from corral.outbox where event_id = any($1::uuid[]) and state = 'pending'",
      [ids],
    );
    return rows[0]!.n;
  };
  // every message received, or (once a second) none left to send: the check below says what is missing
  let polls = 0;
  await until(
    async () => new Set(s.rx.requests.slice(before).map((r) => r.id)).size >= expected || (++polls % 20 === 0 && (await pending()) === 0),
    deadline,
    `${tag}: ${expected} messages received`,
  );
  // the receiver records a request when it arrives, the sender settles it once answered
  await until(async () => (await pending()) === 0, deadline, `${tag}: every message settled`, 250);
  const cpuMs = (await daemonCpuMs(s.daemon)).daemon - cpu0;
  await tracked?.end();
  const { rows: last } = await pool.query<{ ms: number }>(
    'select extract(epoch from max(finished_at)) * 1000 as ms from corral.turns where event_id = any($1::uuid[])',
    [ids],
  );
  const commitMs = Number(last[0]!.ms) - t0;
  const result: RoundResult = {
    kind,
    turns: ids.length,
    commitMs,
    turnsPerS: (ids.length / commitMs) * 1000,
    messages: expected,
    daemonCpuMs: cpuMs,
  };
  if (expected > 0) Object.assign(result, await checkDeliveries(s, ids, s.rx.requests.slice(before), expected, t0));
  progress(
    `${tag}: ${ids.length} turns in ${(commitMs / 1000).toFixed(2)} s (${result.turnsPerS.toFixed(0)}/s)` +
      (result.deliverMs !== undefined
        ? `, ${expected} messages received in ${(result.deliverMs / 1000).toFixed(2)} s (${result.deliveriesPerS!.toFixed(0)}/s), ` +
          `latency p50 ${round(result.latencyMs!.p50)} ms, p95 ${round(result.latencyMs!.p95)} ms`
        : ''),
  );
  return result;
}

/**
 * Every message of the round's events arrived exactly once after de-duplication, signed, in
 * commit order per actor and sink, and nothing else arrived; throws otherwise. Returns the
 * round's delivery figures.
 */
async function checkDeliveries(
  s: Setup,
  eventIds: string[],
  requests: Request[],
  expected: number,
  t0: number,
): Promise<Pick<RoundResult, 'deliverMs' | 'deliveriesPerS' | 'latencyMs' | 'duplicates'>> {
  const { rows } = await s.bench.db.pool.query<{
    id: string;
    webhook_id: string;
    sink: string;
    agent_uid: string;
    session_id: string;
    event_id: string;
    state: string;
    created_ms: number;
  }>(
    `select id, webhook_id, sink, agent_uid, session_id, event_id, state, extract(epoch from created_at) * 1000 as created_ms
       from corral.outbox where event_id = any($1::uuid[]) order by id`,
    [eventIds],
  );
  const problems: string[] = [];
  if (rows.length !== expected) problems.push(`${rows.length} outbox rows, expected ${expected}`);
  const notDelivered = rows.filter((r) => r.state !== 'delivered');
  if (notDelivered.length > 0)
    problems.push(`${notDelivered.length} rows not delivered (e.g. ${notDelivered[0]!.webhook_id}: ${notDelivered[0]!.state})`);
  const first = new Map<string, Request>();
  let duplicates = 0;
  for (const r of requests) {
    if (first.has(r.id)) duplicates++;
    else first.set(r.id, r);
  }
  const byId = new Map(rows.map((r) => [r.webhook_id, r]));
  const strangers = [...first.keys()].filter((id) => !byId.has(id));
  if (strangers.length > 0) problems.push(`${strangers.length} messages not of this round (e.g. ${strangers[0]})`);
  const missing = rows.filter((r) => !first.has(r.webhook_id));
  if (missing.length > 0) problems.push(`${missing.length} messages never arrived (e.g. ${missing[0]!.webhook_id})`);
  const secrets = new Map(s.sinks.map((k) => [k.name, k.secret]));
  const latencies: number[] = [];
  const lastOf = new Map<string, number>();
  let badSignature = 0;
  let wrongSink = 0;
  let wrongBody = 0;
  let outOfOrder = 0;
  for (const row of rows) {
    const got = first.get(row.webhook_id);
    if (!got) continue;
    latencies.push(got.at - Number(row.created_ms));
    if (got.sink !== row.sink) wrongSink++;
    const body = JSON.parse(got.body) as { event_id?: string; actor?: string };
    if (body.event_id !== row.event_id || body.actor !== `${row.agent_uid}/${row.session_id}`) wrongBody++;
    // rows come in commit order (id); per actor and sink, each must have arrived after the one before
    const stream = `${row.agent_uid}/${row.session_id} → ${row.sink}`;
    if ((lastOf.get(stream) ?? -Infinity) > got.at) outOfOrder++;
    lastOf.set(stream, got.at);
  }
  for (const r of requests) {
    const row = byId.get(r.id);
    if (row && !verifyWebhook(secrets.get(row.sink) ?? '', r, r.body, { nowS: Math.floor(r.at / 1000) }).ok) badSignature++;
  }
  if (badSignature > 0) problems.push(`${badSignature} requests with a bad signature`);
  if (wrongSink > 0) problems.push(`${wrongSink} messages at the wrong sink`);
  if (wrongBody > 0) problems.push(`${wrongBody} bodies that name another event or actor`);
  if (outOfOrder > 0) problems.push(`${outOfOrder} messages arrived before the one committed before them (same actor and sink)`);
  if (problems.length > 0) throw new Error(`deliveries wrong:\n  ${problems.join('\n  ')}`);
  const lastAt = Math.max(...[...first.values()].map((r) => r.at));
  const deliverMs = lastAt - t0;
  return { deliverMs, deliveriesPerS: (expected / deliverMs) * 1000, latencyMs: summarise(latencies), duplicates };
}

process.exitCode = await runBench(async (cleanup: Cleanup) => {
  const o = options();
  const server = await openBenchDatabase(cleanup, { statements: o.statements });
  const db = await freshDatabase(server.url, cleanup, 'corral_outbox');
  const rx = new Receiver(o.delay);
  await rx.start();
  cleanup.defer('stop the receiver', () => rx.stop());
  const daemon = await startDaemonProcess({ url: db.url, workers: o.workers, capacity: o.capacity }, cleanup);
  const probe = openDatabase(db.url, { max: 1 });
  const sinks: Setup['sinks'] = [];
  try {
    await waitForWorkers(probe, o.workers, 120_000, daemon.proc);
    for (let i = 0; i < o.sinks; i++) {
      const name = sinkName(i);
      const s = await addSink(probe.db, { name, url: rx.url(name), concurrency: o.concurrency, timeout: '10s', allowPrivate: true });
      sinks.push({ name, secret: s.secret });
    }
  } finally {
    await probe.close();
  }
  const bench = await openBenchClient(db.url, cleanup);
  const s: Setup = { o, bench, daemon, rx, sinks };
  if (o.statements && server.source === 'embedded') {
    const admin = new pg.Client({ connectionString: db.url });
    await admin.connect();
    cleanup.defer('close statements client', () => admin.end());
    await admin.query('create extension if not exists pg_stat_statements');
    s.statements = new StatementTracker(admin);
  } else if (o.statements) progress('--statements needs the embedded database; ignored');
  // warm: every actor activated, a conversation, the workers' and the sender's connections open
  await runRound(s, 'one', 'warm', { turns: Math.max(o.actors, Math.min(o.turns, 2 * o.actors)) });
  const none1 = await runRound(s, 'none', 'none-1');
  const one = await runRound(s, 'one', 'one');
  const none2 = await runRound(s, 'none', 'none-2');
  const several = await runRound(s, 'several', 'several');
  const none3 = await runRound(s, 'none', 'none-3');
  const ratio = (r: RoundResult, a: RoundResult, b: RoundResult) => r.turnsPerS / ((a.turnsPerS + b.turnsPerS) / 2);
  const cpuPerTurnMs = (r: RoundResult) => r.daemonCpuMs / r.turns;
  const baselineCpu = (cpuPerTurnMs(none1) + cpuPerTurnMs(none2) + cpuPerTurnMs(none3)) / 3;
  const delivering = (r: RoundResult, a: RoundResult, b: RoundResult) => ({
    turnsPerS: r.turnsPerS,
    ratioTurnsPerS: ratio(r, a, b),
    /** Turns ÷ (send → last receipt), against the baseline's turns/s: the whole path, commit to receipt. */
    ratioEndToEnd: ((r.turns / r.deliverMs!) * 1000) / ((a.turnsPerS + b.turnsPerS) / 2),
    messages: r.messages,
    deliveriesPerS: r.deliveriesPerS,
    latencyMs: r.latencyMs,
    duplicates: r.duplicates,
    daemonCpuPerTurnMs: cpuPerTurnMs(r),
    daemonCpuPerMessageMs: (r.daemonCpuMs - baselineCpu * r.turns) / r.messages,
  });
  const report = {
    turns: o.turns,
    actors: o.actors,
    sinks: o.sinks,
    concurrency: o.concurrency,
    workers: o.workers,
    receiverDelayMs: o.delay,
    baseline: {
      turnsPerS: [none1.turnsPerS, none2.turnsPerS, none3.turnsPerS],
      daemonCpuPerTurnMs: baselineCpu,
    },
    one: delivering(one, none1, none2),
    several: { perTurn: o.several, ...delivering(several, none2, none3) },
  };
  const statements = s.statements?.summary(one.messages + several.messages, 10);
  if (o.json) {
    process.stdout.write(
      `${JSON.stringify(roundDeep({ ...report, ...(statements ? { statementsPerMessage: statements } : {}) }), null, 2)}\n`,
    );
    return 0;
  }
  const line = (name: string, d: typeof report.one) =>
    `${name}: ${d.messages} messages, ${round(d.deliveriesPerS!, 0)} deliveries/s (send → last receipt); ` +
    `commit → receipt p50 ${round(d.latencyMs!.p50)} ms, p95 ${round(d.latencyMs!.p95)} ms, p99 ${round(d.latencyMs!.p99)} ms, max ${round(d.latencyMs!.max)} ms; ` +
    `${d.duplicates} duplicate requests\n` +
    `  turns/s ${round(d.turnsPerS, 0)}: ratio with ÷ without deliver ${round(d.ratioTurnsPerS, 3)} (to the last commit), ` +
    `${round(d.ratioEndToEnd, 3)} (to the last receipt); daemon CPU ${round(d.daemonCpuPerTurnMs, 2)} ms per turn, ` +
    `${round(d.daemonCpuPerMessageMs, 3)} ms per message over the baseline\n`;
  process.stdout.write(
    `${o.turns} turns per round over ${o.actors} actors, ${o.sinks} sink(s) of concurrency ${o.concurrency}, ${o.workers} workers` +
      `${o.delay > 0 ? `, the receiver answering after ${o.delay} ms` : ''}\n` +
      `without deliver: ${report.baseline.turnsPerS.map((x) => round(x, 0)).join(', ')} turns/s; daemon CPU ${round(baselineCpu, 2)} ms per turn\n` +
      line('one message per turn', report.one) +
      line(`${o.several} messages per turn`, report.several) +
      'every message arrived exactly once after de-duplication, signed, in commit order per actor and sink\n',
  );
  if (statements) {
    process.stdout.write('statements of the delivering rounds, per message (calls, server ms; the turns’ own included):\n');
    for (const r of statements)
      process.stdout.write(`  ${round(r.callsPerTurn, 2)} × ${round(r.meanMs, 3)} ms = ${round(r.msPerTurn, 3)} ms  ${r.query}\n`);
  }
  return 0;
});
