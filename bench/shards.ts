/**
 * Shards: what `corral daemon --workers W` (real daemon and worker processes) commits for a burst
 * of events to new actors, on a deployment of 1, 2 and 4 shards on one PostgreSQL, and of 2 shards
 * on two PostgreSQL servers (shard 1 on a second embedded server) against 2 on one. Each shape
 * runs in a fresh database, all of them in the same run, alternating for `--rounds`; reported as
 * turns/s, the median's ratio to 1 shard (and two servers to one), and PostgreSQL's CPU and WAL
 * bytes per committed turn (both servers' together).
 *
 *   npm run bench:shards -- [--events N] [--workers W] [--capacity C] [--rounds R]
 *
 * The two servers run on this machine: the ratio says what splitting costs or saves when both
 * share its cores, not what two machines give. Embedded servers only (two are started).
 */
import { randomBytes } from 'node:crypto';
import { spawn } from 'node:child_process';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { DEFAULTS, loadConfig } from '../src/config.ts';
import { connect } from '../src/client/client.ts';
import { ensureEmbeddedPostgres, stopEmbeddedPostgres } from '../src/db/postgres/embedded.ts';
import { freePort } from '../src/db/postgres/net.ts';
import { shardSchemas } from '../src/base/shard-map.ts';
import { migrateShards, setShardUrl } from '../src/ops/shards.ts';
import { migrateDatabase } from '../src/db/migrate.ts';
import { createBoss, ensureQueues } from '../src/queue/boss.ts';
import { withDatabase } from '../test/helpers/databases.ts';
import { postgresCpuMs } from './lib/database.ts';
import { median, progress } from './lib/common.ts';

const CORRAL = fileURLToPath(new URL('../bin/corral.js', import.meta.url));
const SEND_BATCH = 500;

interface Shape {
  name: string;
  shards: number;
  /** Shard 1 on the second server. */
  twoServers: boolean;
}

const SHAPES: Shape[] = [
  { name: '1 shard', shards: 1, twoServers: false },
  { name: '2 shards, one server', shards: 2, twoServers: false },
  { name: '4 shards, one server', shards: 4, twoServers: false },
  { name: '2 shards, two servers', shards: 2, twoServers: true },
];

interface Server {
  url: string;
  dataDir: string;
  home: string;
}

interface Result {
  turnsPerS: number;
  pgCpuMsPerTurn: number | undefined;
  walBytesPerTurn: number;
}

function options() {
  const { values } = parseArgs({
    options: {
      events: { type: 'string', default: '3000' },
      workers: { type: 'string', default: '2' },
      capacity: { type: 'string', default: '16' },
      rounds: { type: 'string', default: '2' },
      help: { type: 'boolean', default: false },
    },
  });
  if (values.help) {
    console.log('usage: npm run bench:shards -- [--events N] [--workers W] [--capacity C] [--rounds R]');
    process.exit(0);
  }
  const n = (k: keyof typeof values, min: number) => {
    const v = Number(values[k]);
    if (!Number.isInteger(v) || v < min) {
      console.error(`bench:shards: --${k} takes an integer >= ${min}`);
      process.exit(2);
    }
    return v;
  };
  return { events: n('events', 1), workers: n('workers', 1), capacity: n('capacity', 1), rounds: n('rounds', 1) };
}

async function startServer(): Promise<Server> {
  const home = await mkdtemp(join(tmpdir(), 'corral-bench-shards-'));
  await chmod(home, 0o755);
  const s = await ensureEmbeddedPostgres({ homeDir: home, ephemeral: true, database: 'postgres' });
  return { url: s.url, dataDir: s.dataDir, home };
}

async function onServer<T>(url: string, fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    return await fn(c);
  } finally {
    await c.end();
  }
}

const walLsn = (url: string) =>
  onServer(url, async (c) => BigInt((await c.query<{ b: string }>(`select pg_current_wal_lsn() - '0/0' as b`)).rows[0]!.b));

/** The turns committed so far in every shard of the deployment. */
async function committed(urls: readonly string[], bossSchema: string): Promise<number> {
  let n = 0;
  for (const [shard, url] of urls.entries()) {
    const schema = shardSchemas(shard, bossSchema).corral;
    n += await onServer(
      url,
      async (c) => (await c.query<{ n: number }>(`select count(*)::int as n from ${schema}.turns where status = 'succeeded'`)).rows[0]!.n,
    );
  }
  return n;
}

async function runShape(shape: Shape, servers: readonly Server[], opts: ReturnType<typeof options>): Promise<Result> {
  const name = `corral_shards_${randomBytes(4).toString('hex')}`;
  const used = shape.twoServers ? servers : servers.slice(0, 1);
  for (const s of used) await onServer(s.url, (c) => c.query(`create database ${name}`));
  const catalog = withDatabase(servers[0]!.url, name);
  const config = loadConfig({}, {});
  const home = await mkdtemp(join(tmpdir(), 'corral-bench-shards-home-'));
  let daemon: ReturnType<typeof spawn> | undefined;
  try {
    // what `corral db migrate` does first: the catalog's own schemas, pg-boss and queues
    await migrateDatabase(catalog);
    const boss = createBoss(catalog, DEFAULTS, { max: 2 });
    await boss.start();
    await ensureQueues(boss, DEFAULTS);
    await boss.stop({ graceful: false, close: true });
    await migrateShards(catalog, shape.shards, config);
    if (shape.twoServers) {
      const second = withDatabase(servers[1]!.url, name);
      await setShardUrl(catalog, 1, second);
      await migrateShards(catalog, shape.shards, config);
      await onServer(catalog, (c) => c.query(`drop schema corral_s1 cascade; drop schema ${DEFAULTS.bossSchema}_s1 cascade`));
    }
    const urls = Array.from({ length: shape.shards }, (_, k) =>
      shape.twoServers && k === 1 ? withDatabase(servers[1]!.url, name) : catalog,
    );
    const port = await freePort();
    daemon = spawn(process.execPath, [CORRAL, 'daemon', '--workers', String(opts.workers), '--worker-capacity', String(opts.capacity)], {
      env: {
        ...process.env,
        DATABASE_URL: catalog,
        CORRAL_HOME: home,
        CORRAL_ENDPOINT: `tcp://127.0.0.1:${port}`,
        CORRAL_LOG_LEVEL: 'warn',
      },
      stdio: ['ignore', 'ignore', 'inherit'],
    });
    for (;;) {
      const n = await onServer(
        catalog,
        async (c) => (await c.query<{ n: number }>("select count(*)::int as n from corral.workers where status = 'ready'")).rows[0]!.n,
      ).catch(() => 0);
      if (n >= opts.workers) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    const corral = await connect({ databaseUrl: catalog, env: {} });
    const events = Array.from({ length: opts.events }, (_, i) => ({ actor: `bench-${i}/s`, data: { text: 'x' } }));
    const cpu0 = await Promise.all(used.map((s) => postgresCpuMs(s.dataDir)));
    const wal0 = await Promise.all(used.map((s) => walLsn(s.url)));
    const t0 = performance.now();
    try {
      for (let i = 0; i < events.length; i += SEND_BATCH) await corral.sendMany(events.slice(i, i + SEND_BATCH));
    } finally {
      await corral.close();
    }
    while ((await committed(urls, DEFAULTS.bossSchema)) < opts.events) await new Promise((r) => setTimeout(r, 50));
    const seconds = (performance.now() - t0) / 1000;
    const cpu1 = await Promise.all(used.map((s) => postgresCpuMs(s.dataDir)));
    const wal1 = await Promise.all(used.map((s) => walLsn(s.url)));
    const cpuKnown = cpu0.every((x) => x !== undefined) && cpu1.every((x) => x !== undefined);
    const pgCpuMs = cpuKnown ? cpu1.reduce((a, b, i) => a! + b! - cpu0[i]!, 0)! : undefined;
    const walBytes = wal1.reduce((a, b, i) => a + Number(b - wal0[i]!), 0);
    return {
      turnsPerS: opts.events / seconds,
      pgCpuMsPerTurn: pgCpuMs === undefined ? undefined : pgCpuMs / opts.events,
      walBytesPerTurn: walBytes / opts.events,
    };
  } finally {
    if (daemon && daemon.exitCode === null) {
      daemon.kill('SIGTERM');
      await new Promise((r) => daemon!.once('exit', r));
    }
    for (const s of used) await onServer(s.url, (c) => c.query(`drop database if exists ${name} with (force)`)).catch(() => undefined);
    await rm(home, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  const opts = options();
  progress('starting two embedded PostgreSQL servers');
  const servers = [await startServer(), await startServer()];
  try {
    const results = new Map<string, Result[]>(SHAPES.map((s) => [s.name, []]));
    for (let round = 1; round <= opts.rounds; round++) {
      for (const shape of SHAPES) {
        progress(`round ${round}/${opts.rounds}: ${shape.name}, ${opts.events} events, ${opts.workers} workers × ${opts.capacity}`);
        results.get(shape.name)!.push(await runShape(shape, servers, opts));
      }
    }
    const med = (name: string, f: (r: Result) => number | undefined) => {
      const xs = results
        .get(name)!
        .map(f)
        .filter((x): x is number => x !== undefined);
      return xs.length > 0 ? median(xs) : undefined;
    };
    const base = med('1 shard', (r) => r.turnsPerS)!;
    const oneServer2 = med('2 shards, one server', (r) => r.turnsPerS)!;
    console.log(
      `${opts.events} events to new actors, ${opts.workers} local workers × capacity ${opts.capacity}, median of ${opts.rounds} rounds`,
    );
    console.log('shape                     turns/s (rounds)          ratio to 1 shard   PG CPU ms/turn   WAL bytes/turn');
    for (const shape of SHAPES) {
      const rs = results.get(shape.name)!;
      const tps = med(shape.name, (r) => r.turnsPerS)!;
      const cpu = med(shape.name, (r) => r.pgCpuMsPerTurn);
      const wal = med(shape.name, (r) => r.walBytesPerTurn)!;
      console.log(
        `${shape.name.padEnd(24)}  ${tps.toFixed(0).padStart(6)} (${rs.map((r) => r.turnsPerS.toFixed(0)).join(', ')})`.padEnd(52) +
          `${(tps / base).toFixed(2)}×`.padStart(8) +
          `${cpu === undefined ? 'n/a' : cpu.toFixed(3)}`.padStart(17) +
          `${wal.toFixed(0)}`.padStart(17),
      );
    }
    const two = med('2 shards, two servers', (r) => r.turnsPerS)!;
    console.log(`two servers vs one (2 shards each): ${(two / oneServer2).toFixed(2)}×`);
  } finally {
    for (const s of servers) {
      await stopEmbeddedPostgres(s.home).catch(() => false);
      await rm(s.home, { recursive: true, force: true });
    }
  }
}

await main();
