/**
 * The Python worker SDK (sdk/python, `corral-worker`) next to the TypeScript one: turns/s of an
 * echo worker process of each, on one daemon, in one run. Each round runs both, one at a time
 * (the order alternates), on a burst of events to new actors; the result is the ratio of the
 * medians, Python over TypeScript, measured side by side, and each worker's CPU per turn.
 *
 *   npm run bench:python -- [--events N] [--rounds R] [--capacity C] [--python PATH]
 *
 * The TypeScript worker is `corral worker` (the example handler); the Python one is
 * `python -m corral_worker examples/python echo_agent:handle` with a key from `corral keys`.
 * Both over CURVE with the key proof, at info/warn log levels that print nothing per turn. Uses
 * DATABASE_URL when set (a scratch database on it), else an embedded PostgreSQL in a temporary
 * folder. The Python needs pyzmq and cryptography (CORRAL_PYTHON, else /usr/bin/python3, else
 * python3 on PATH).
 */
import { execFileSync, spawn } from 'node:child_process';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { actorKey } from '../src/base/actor-key.ts';
import { ensureEmbeddedPostgres, stopEmbeddedPostgres } from '../src/db/postgres/embedded.ts';
import { median, progress, runBench, until, type Cleanup } from './lib/common.ts';
import { freshDatabase, openBenchClient, processCpuMs, startDaemonProcess, type BenchClient } from './lib/daemon-process.ts';

const ROOT = join(import.meta.dirname, '..');
const CORRAL = join(ROOT, 'bin', 'corral.js');

function options() {
  const { values } = parseArgs({
    options: {
      events: { type: 'string', default: '2000' },
      rounds: { type: 'string', default: '3' },
      capacity: { type: 'string', default: '32' },
      python: { type: 'string' },
      help: { type: 'boolean', default: false },
    },
  });
  if (values.help) {
    console.log('usage: npm run bench:python -- [--events N] [--rounds R] [--capacity C] [--python PATH]');
    process.exit(0);
  }
  const [events, rounds, capacity] = [values.events, values.rounds, values.capacity].map(Number) as [number, number, number];
  if (![events, rounds, capacity].every((n) => Number.isInteger(n) && n >= 1) || capacity > 1024) {
    console.error('bench:python: --events, --rounds and --capacity take positive integers (capacity at most 1024)');
    process.exit(2);
  }
  return { events, rounds, capacity, python: values.python };
}

/** A Python that imports zmq and cryptography. */
function findPython(given: string | undefined): string {
  const candidates = [given, process.env.CORRAL_PYTHON, '/usr/bin/python3', 'python3'].filter((c): c is string => !!c);
  for (const py of candidates) {
    try {
      execFileSync(py, ['-c', 'import zmq, cryptography'], { stdio: 'ignore' });
      return py;
    } catch {
      // next
    }
  }
  throw new Error(
    'no Python with pyzmq and cryptography: apt-get install python3-zmq python3-cryptography, or --python PATH / CORRAL_PYTHON',
  );
}

type Kind = 'ts' | 'py';
interface Phase {
  kind: Kind;
  round: number;
  turnsPerSecond: number;
  cpuMsPerTurn: number;
}

interface Setup {
  client: BenchClient;
  home: string;
  endpoint: string;
  python: string;
  pyKey: string;
  capacity: number;
}

const WORKER_ID: Record<Kind, string> = { ts: 'bench-ts', py: 'bench-py' };

function spawnWorker(kind: Kind, s: Setup) {
  const env = { ...process.env, CORRAL_HOME: s.home, CORRAL_ENDPOINT: s.endpoint, CORRAL_LOG_LEVEL: 'warn' };
  if (kind === 'ts') {
    return spawn(process.execPath, [CORRAL, 'worker', '--id', WORKER_ID.ts, '--capacity', String(s.capacity)], {
      env,
      stdio: ['ignore', 'ignore', 'inherit'],
    });
  }
  const args = ['-m', 'corral_worker', '--key-file', s.pyKey, '--capacity', String(s.capacity), '--log-level', 'warning'];
  return spawn(s.python, [...args, 'echo_agent:handle'], {
    env: { ...env, PYTHONPATH: join(ROOT, 'sdk', 'python', 'src') },
    cwd: join(ROOT, 'examples', 'python'),
    stdio: ['ignore', 'ignore', 'inherit'],
  });
}

async function workerStatus(client: BenchClient, id: string): Promise<{ status: string; registeredAt: Date } | undefined> {
  const { rows } = await client.db.pool.query<{ status: string; registered_at: Date }>(
    'select status, registered_at from corral.workers where worker_id = $1',
    [id],
  );
  return rows[0] ? { status: rows[0].status, registeredAt: rows[0].registered_at } : undefined;
}

/** One worker process of `kind`: registered, `events` turns to new actors, stopped; turns/s and its CPU per turn. */
async function phase(kind: Kind, round: number, events: number, s: Setup, cleanup: Cleanup): Promise<Phase> {
  const since = new Date(Date.now() - 1000);
  const child = spawnWorker(kind, s);
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  cleanup.defer(`stop ${kind} worker`, async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
    await exited;
  });
  await until(
    async () => {
      if (child.exitCode !== null) throw new Error(`the ${kind} worker exited ${child.exitCode}`);
      const w = await workerStatus(s.client, WORKER_ID[kind]);
      return w?.status === 'ready' && w.registeredAt >= since;
    },
    performance.now() + 60_000,
    `the ${kind} worker registered`,
    50,
  );
  const before = await s.client.succeeded();
  const cpu0 = await processCpuMs(child.pid!);
  const t0 = performance.now();
  const tag = `${kind}${round}-${Math.random().toString(36).slice(2, 8)}`;
  await s.client.enqueue(Array.from({ length: events }, (_, i) => ({ key: actorKey(`bp-${tag}-${i}`, 's'), event: { text: 'x' } })));
  await until(async () => (await s.client.succeeded()) >= before + events, performance.now() + 600_000, `${events} turns`, 20);
  const seconds = (performance.now() - t0) / 1000;
  const cpuMs = (await processCpuMs(child.pid!)) - cpu0;
  child.kill('SIGTERM');
  await exited;
  // the next worker starts once the daemon no longer counts this one (stale_ms, set short)
  await until(
    async () => (await workerStatus(s.client, WORKER_ID[kind]))?.status !== 'ready',
    performance.now() + 30_000,
    `the ${kind} worker gone`,
    50,
  );
  return { kind, round, turnsPerSecond: events / seconds, cpuMsPerTurn: cpuMs / events };
}

async function run(cleanup: Cleanup): Promise<number> {
  const opts = options();
  const python = findPython(opts.python);
  let serverUrl = process.env.DATABASE_URL;
  if (!serverUrl) {
    const pgHome = await mkdtemp(join(tmpdir(), 'corral-bench-py-pg-'));
    await chmod(pgHome, 0o755);
    cleanup.defer('remove embedded PostgreSQL', () => rm(pgHome, { recursive: true, force: true }));
    serverUrl = (await ensureEmbeddedPostgres({ homeDir: pgHome, ephemeral: true, database: 'postgres' })).url;
    cleanup.defer('stop embedded PostgreSQL', () => stopEmbeddedPostgres(pgHome));
  }
  const db = await freshDatabase(serverUrl, cleanup, 'corral_bpy');
  const daemon = await startDaemonProcess(
    { url: db.url, workers: 0, capacity: 1, env: { CORRAL_WORKER_STALE_MS: '1500', CORRAL_WORKER_HEARTBEAT_MS: '300' } },
    cleanup,
  );
  const client = await openBenchClient(db.url, cleanup);
  const daemonEndpoint = await until(
    async () => {
      const { rows } = await client.db.pool.query<{ endpoint: string }>(
        'select endpoint from corral.daemons where stopped_at is null order by started_at desc limit 1',
      );
      return rows[0]?.endpoint;
    },
    performance.now() + 60_000,
    'the daemon up',
    100,
  );
  const pyKey = join(daemon.home, 'bench-py.key');
  execFileSync(process.execPath, [CORRAL, 'keys', 'add-worker', WORKER_ID.py, '--out', pyKey, '--force'], {
    env: { ...process.env, CORRAL_HOME: daemon.home },
    stdio: 'ignore',
  });
  const s: Setup = { client, home: daemon.home, endpoint: daemonEndpoint, python, pyKey, capacity: opts.capacity };
  progress(`python ${execFileSync(python, ['--version'], { encoding: 'utf8' }).trim()} (${python}); warming up each worker…`);
  for (const kind of ['ts', 'py'] as const) await phase(kind, 0, Math.min(300, opts.events), s, cleanup);
  const phases: Phase[] = [];
  for (let round = 1; round <= opts.rounds; round++) {
    for (const kind of round % 2 === 1 ? (['ts', 'py'] as const) : (['py', 'ts'] as const)) {
      const p = await phase(kind, round, opts.events, s, cleanup);
      progress(`round ${round} ${kind}: ${p.turnsPerSecond.toFixed(0)} turns/s, ${p.cpuMsPerTurn.toFixed(2)} ms CPU per turn`);
      phases.push(p);
    }
  }
  const med = (kind: Kind, f: (p: Phase) => number) => median(phases.filter((p) => p.kind === kind).map(f));
  const [ts, py] = [med('ts', (p) => p.turnsPerSecond), med('py', (p) => p.turnsPerSecond)];
  const [tsCpu, pyCpu] = [med('ts', (p) => p.cpuMsPerTurn), med('py', (p) => p.cpuMsPerTurn)];
  console.log(`${opts.events} events to new actors per phase, one worker process of capacity ${opts.capacity}, ${opts.rounds} rounds`);
  console.log('worker       turns/s (median)   worker CPU ms/turn   ratio to TypeScript');
  console.log(`TypeScript   ${ts.toFixed(0).padStart(16)}   ${tsCpu.toFixed(2).padStart(18)}   1.00×`);
  console.log(`Python       ${py.toFixed(0).padStart(16)}   ${pyCpu.toFixed(2).padStart(18)}   ${(py / ts).toFixed(2)}×`);
  console.log(`rounds: ${phases.map((p) => `${p.kind}${p.round} ${p.turnsPerSecond.toFixed(0)}`).join(', ')}`);
  return 0;
}

process.exitCode = await runBench(run);
