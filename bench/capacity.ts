/**
 * Worker capacity: what `corral daemon --workers W --worker-capacity C` (the `npm start` shape:
 * real daemon and worker processes) commits for a burst of events to new actors, for several C.
 * The defaults of `--capacity` / `--worker-capacity` come from this (see docs/benchmarks.md).
 *
 *   npm run bench:capacity -- [--events N] [--workers W] [--capacities 1,8,32] [--delay-ms D]
 *
 * `--delay-ms` makes each turn wait that long first (the example worker's `delayMs`), standing in
 * for a turn that waits on a model or a tool. Reports turns/s per capacity and the ratio to the
 * first capacity listed, measured in the same run. Uses DATABASE_URL when set (a scratch database
 * on it), else an embedded PostgreSQL in a temporary folder.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { DEFAULTS } from '../src/config.ts';
import { openDatabase } from '../src/db/client.ts';
import { ensureEmbeddedPostgres, stopEmbeddedPostgres } from '../src/db/postgres/embedded.ts';
import { migrateDatabase } from '../src/db/migrate.ts';
import { createBoss, ensureQueues } from '../src/queue/boss.ts';
import { sendEventsInBatches } from '../src/db/enqueue/send.ts';
import { freePort } from '../src/db/postgres/net.ts';

const CORRAL = fileURLToPath(new URL('../bin/corral.js', import.meta.url));

function options() {
  const { values } = parseArgs({
    options: {
      events: { type: 'string', default: '2000' },
      workers: { type: 'string', default: '2' },
      capacities: { type: 'string', default: '1,4,16,32,64' },
      'delay-ms': { type: 'string', default: '0' },
      help: { type: 'boolean', default: false },
    },
  });
  if (values.help) {
    console.log('usage: npm run bench:capacity -- [--events N] [--workers W] [--capacities 1,8,32] [--delay-ms D]');
    process.exit(0);
  }
  const capacities = values.capacities.split(',').map(Number);
  const events = Number(values.events);
  const workers = Number(values.workers);
  const delayMs = Number(values['delay-ms']);
  if (![events, workers, delayMs, ...capacities].every((n) => Number.isInteger(n) && n >= 0) || capacities.some((c) => c < 1)) {
    console.error('bench:capacity: --events, --workers, --delay-ms and --capacities take non-negative integers (capacities >= 1)');
    process.exit(2);
  }
  return { events, workers, capacities, delayMs };
}

async function runOne(serverUrl: string, capacity: number, opts: ReturnType<typeof options>): Promise<number> {
  const name = `corral_cap_${randomBytes(4).toString('hex')}`;
  const admin = new pg.Client({ connectionString: serverUrl });
  await admin.connect();
  await admin.query(`create database ${name}`);
  const u = new URL(serverUrl);
  u.pathname = `/${name}`;
  const url = u.toString();
  const home = await mkdtemp(join(tmpdir(), 'corral-cap-'));
  let daemon: ReturnType<typeof spawn> | undefined;
  try {
    await migrateDatabase(url);
    const boss = createBoss(url, DEFAULTS, { max: 2 });
    await boss.start();
    await ensureQueues(boss, DEFAULTS);
    const port = await freePort();
    daemon = spawn(process.execPath, [CORRAL, 'daemon', '--workers', String(opts.workers), '--worker-capacity', String(capacity)], {
      env: { ...process.env, DATABASE_URL: url, CORRAL_HOME: home, CORRAL_ENDPOINT: `tcp://127.0.0.1:${port}`, CORRAL_LOG_LEVEL: 'warn' },
      stdio: ['ignore', 'ignore', 'inherit'],
    });
    const database = openDatabase(url, { max: 2 });
    // Wait until the workers are registered, so the clock measures turns, not start-up.
    for (;;) {
      const { rows } = await database.pool
        .query<{ n: number }>("select count(*)::int as n from corral.workers where status <> 'gone'")
        .catch(() => ({ rows: [{ n: 0 }] }));
      if ((rows[0]?.n ?? 0) >= opts.workers) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    const data = opts.delayMs > 0 ? { text: 'x', delayMs: opts.delayMs } : { text: 'x' };
    const t0 = performance.now();
    await sendEventsInBatches(
      database.db,
      Array.from({ length: opts.events }, (_, i) => ({ agentUid: `cap-${i}`, sessionId: 's', data })),
    );
    for (;;) {
      const { rows } = await database.pool.query<{ n: number }>("select count(*)::int as n from corral.turns where status = 'succeeded'");
      if ((rows[0]?.n ?? 0) >= opts.events) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    const seconds = (performance.now() - t0) / 1000;
    await database.close();
    await boss.stop({ graceful: false, close: true });
    return opts.events / seconds;
  } finally {
    if (daemon && daemon.exitCode === null) {
      daemon.kill('SIGTERM');
      await new Promise((r) => daemon!.once('exit', r));
    }
    await admin.query(`drop database if exists ${name} with (force)`).catch(() => undefined);
    await admin.end();
    await rm(home, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  const opts = options();
  let home: string | undefined;
  let serverUrl = process.env.DATABASE_URL;
  if (!serverUrl) {
    home = await mkdtemp(join(tmpdir(), 'corral-cap-pg-'));
    await chmod(home, 0o755);
    serverUrl = (await ensureEmbeddedPostgres({ homeDir: home, ephemeral: true, database: 'postgres' })).url;
  }
  try {
    const results: { capacity: number; turnsPerSecond: number }[] = [];
    for (const capacity of opts.capacities) {
      process.stderr.write(
        `bench:capacity: ${opts.workers} workers × capacity ${capacity}, ${opts.events} events (delay ${opts.delayMs} ms)…\n`,
      );
      results.push({ capacity, turnsPerSecond: await runOne(serverUrl, capacity, opts) });
    }
    const base = results[0]!.turnsPerSecond;
    console.log(`${opts.events} events to new actors, ${opts.workers} local workers, turn delay ${opts.delayMs} ms`);
    console.log('capacity   turns/s   ratio to capacity ' + results[0]!.capacity);
    for (const r of results)
      console.log(
        `${String(r.capacity).padStart(8)}   ${r.turnsPerSecond.toFixed(0).padStart(7)}   ${(r.turnsPerSecond / base).toFixed(2)}×`,
      );
  } finally {
    if (home) {
      await stopEmbeddedPostgres(home).catch(() => false);
      await rm(home, { recursive: true, force: true });
    }
  }
}

await main();
