/**
 * A daemon as deployed, for the process benchmarks (burst, recovery, idle actors):
 * `bin/corral.js daemon --workers W` as an OS process with its local worker processes, on a fresh
 * database of the bench's server, plus what /proc says about it (RSS, CPU) and a way to enqueue.
 */
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { performance } from 'node:perf_hooks';
import type pg from 'pg';
import type { PgBoss } from 'pg-boss';
import type { ActorKey } from '../../src/base/actor-key.ts';
import { DEFAULTS } from '../../src/config.ts';
import { openDatabase, type Database } from '../../src/db/client.ts';
import { createBoss } from '../../src/queue/boss.ts';
import { sendEventsInBatches } from '../../src/db/enqueue/send.ts';
import { createDatabaseOn, type TestDatabase } from '../../test/helpers/databases.ts';
import { childPids, freePort, safeKill, spawnCorral, type Proc } from '../../test/helpers/processes.ts';
import { sleep, until, type Cleanup } from './common.ts';

/** A fresh, empty database on the bench's server: the daemon migrates it itself, as on first run. */
export async function freshDatabase(serverUrl: string, cleanup: Cleanup, prefix = 'corral_bp'): Promise<TestDatabase> {
  const db = await createDatabaseOn(serverUrl, `${prefix}_${randomBytes(4).toString('hex')}`);
  cleanup.defer(`drop database ${db.name}`, () => db.drop());
  return db;
}

export interface DaemonOptions {
  url: string;
  workers: number;
  capacity: number;
  /** Extra CORRAL_* settings (lease, heartbeats …). */
  env?: Record<string, string>;
  /** Reuse a home folder (keys) across daemons of one database. */
  home?: string;
  name?: string;
}

export interface DaemonProcess {
  proc: Proc;
  pid: number;
  home: string;
  /** Pids of its local worker processes. */
  workerPids(): number[];
  /** SIGTERM, then SIGKILL after `graceMs`; waits for the exit. */
  stop(graceMs?: number): Promise<void>;
  /** kill -9 of the daemon and its worker processes, at once. */
  kill9(): Promise<void>;
}

export async function startDaemonProcess(opts: DaemonOptions, cleanup: Cleanup): Promise<DaemonProcess> {
  const home = opts.home ?? (await mkdtemp(join(tmpdir(), 'corral-bench-daemon-')));
  if (!opts.home) cleanup.defer('remove daemon home', () => rm(home, { recursive: true, force: true }));
  const port = await freePort();
  const proc = spawnCorral(
    ['daemon', '--workers', String(opts.workers), '--worker-capacity', String(opts.capacity)],
    {
      DATABASE_URL: opts.url,
      CORRAL_HOME: home,
      CORRAL_ENDPOINT: `tcp://127.0.0.1:${port}`,
      CORRAL_LOG_LEVEL: 'warn',
      ...opts.env,
    },
    opts.name ?? 'daemon',
  );
  cleanup.defer('remove daemon log', () => rm(dirname(proc.logPath), { recursive: true, force: true }));
  const pid = proc.child.pid!;
  const workerPids = () => childPids(pid, '');
  const d: DaemonProcess = {
    proc,
    pid,
    home,
    workerPids,
    async stop(graceMs = 10_000) {
      if (proc.child.exitCode !== null || proc.child.signalCode !== null) return;
      proc.child.kill('SIGTERM');
      const t = setTimeout(() => {
        for (const w of workerPids()) safeKill(w, 'SIGKILL');
        proc.child.kill('SIGKILL');
      }, graceMs);
      await proc.exited;
      clearTimeout(t);
    },
    async kill9() {
      const workers = workerPids();
      proc.child.kill('SIGKILL');
      for (const w of workers) safeKill(w, 'SIGKILL');
      await proc.exited;
    },
  };
  cleanup.defer(`stop daemon ${pid}`, () => d.stop());
  return d;
}

/** Waits until `n` workers are registered and ready (from the database). */
export async function waitForWorkers(db: Database, n: number, timeoutMs = 60_000, proc?: Proc): Promise<void> {
  await until(
    async () => {
      if (proc && proc.child.exitCode !== null) throw new Error(`daemon exited (${proc.child.exitCode}): ${proc.log().slice(-2000)}`);
      const { rows } = await db.pool.query<{ n: number }>("select count(*)::int as n from corral.workers where status = 'ready'");
      return (rows[0]?.n ?? 0) >= n;
    },
    performance.now() + timeoutMs,
    `${n} workers ready${proc ? ` (log: ${proc.logPath})` : ''}`,
    100,
  );
}

/** A client of the bench's own: a small pool and a pg-boss to enqueue with. */
export interface BenchClient {
  db: Database;
  boss: PgBoss;
  /** Enqueues in chunks of `chunk` events (one insert each). */
  enqueue(events: { key: ActorKey; event: unknown }[], chunk?: number): Promise<string[]>;
  succeeded(): Promise<number>;
}

/** Opens a bench client on a database the daemon has set up (pg-boss's schema and queues exist). */
export async function openBenchClient(url: string, cleanup: Cleanup): Promise<BenchClient> {
  const db = openDatabase(url, { max: 4, applicationName: 'corral-bench' });
  cleanup.defer('close bench pool', () => db.close());
  const boss = createBoss(url, DEFAULTS, { max: 2 });
  await boss.start();
  cleanup.defer('stop bench pg-boss', () => boss.stop({ graceful: false, close: true, timeout: 5_000 }));
  return {
    db,
    boss,
    async enqueue(events, chunk = 5_000) {
      const ids: string[] = [];
      for (let i = 0; i < events.length; i += chunk) {
        const res = await sendEventsInBatches(
          db.db,
          events.slice(i, i + chunk).map((e) => ({ agentUid: e.key.agentUid, sessionId: e.key.sessionId, data: e.event })),
        );
        for (const e of res) ids.push(e.eventId);
      }
      return ids;
    },
    async succeeded() {
      const { rows } = await db.pool.query<{ n: number }>("select count(*)::int as n from corral.turns where status = 'succeeded'");
      return rows[0]!.n;
    },
  };
}

// ---- /proc ---------------------------------------------------------------------------------

/** A `<field>: <n> kB` line of a /proc file, in bytes; undefined when the file or the line is missing. */
async function procKb(path: string, field: string): Promise<number | undefined> {
  try {
    const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(await readFile(path, 'utf8'));
    return m ? Number(m[1]) * 1024 : undefined;
  } catch {
    return undefined;
  }
}

/** Resident set size of `pid` in bytes (VmRSS), or undefined when it is gone. */
export function rssBytes(pid: number): Promise<number | undefined> {
  return procKb(`/proc/${pid}/status`, 'VmRSS');
}

/**
 * Pages `pid` freed with MADV_FREE that the kernel has not taken back yet (`LazyFree` in
 * /proc/<pid>/smaps_rollup): counted in RSS, though the process no longer holds them and the
 * kernel reclaims them at the first memory pressure. Undefined where Linux does not say.
 */
export function lazyFreeBytes(pid: number): Promise<number | undefined> {
  return procKb(`/proc/${pid}/smaps_rollup`, 'LazyFree');
}

/** CPU time (user + system) of `pid` in ms, from /proc (USER_HZ 100), or 0 when it is gone. */
export async function processCpuMs(pid: number): Promise<number> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) * 10;
  } catch {
    return 0;
  }
}

/** CPU of the daemon and of its worker processes so far, ms. */
export async function daemonCpuMs(d: DaemonProcess): Promise<{ daemon: number; workers: number }> {
  const workers = await Promise.all(d.workerPids().map(processCpuMs));
  return { daemon: await processCpuMs(d.pid), workers: workers.reduce((a, b) => a + b, 0) };
}

/** Asks a pg.Client for one number. */
export async function scalar(c: pg.Client | pg.Pool, text: string, values: unknown[] = []): Promise<number> {
  const { rows } = await c.query<{ n: number | string | null }>(text, values);
  return Number(rows[0]?.n ?? 0);
}

export { sleep };
