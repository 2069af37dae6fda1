/**
 * The benchmarks' database: an embedded PostgreSQL in a temporary folder (stopped and deleted at
 * the end), or a scratch database on DATABASE_URL's server; and CPU accounting of the server.
 */
import { randomBytes } from 'node:crypto';
import { chmod, mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { ensureEmbeddedPostgres, stopEmbeddedPostgres } from '../../src/db/postgres/embedded.ts';
import { withDatabase } from '../../test/helpers/databases.ts';
import { progress, type Cleanup } from './common.ts';

export interface BenchDatabase {
  url: string;
  /** How the database was obtained, for the report. */
  source: 'embedded' | 'DATABASE_URL (scratch database)' | 'DATABASE_URL';
  ephemeral: boolean;
  /** CPU time used so far by the embedded server's processes (Linux only), in ms. */
  serverCpuMs?: () => Promise<number | undefined>;
}

/**
 * CPU time of a local PostgreSQL: the postmaster and its live children (utime + stime), plus
 * what the postmaster has reaped from exited children (cutime + cstime). Linux /proc only.
 */
export async function postgresCpuMs(dataDir: string): Promise<number | undefined> {
  if (process.platform !== 'linux') return undefined;
  try {
    const postmaster = Number((await readFile(join(dataDir, 'postmaster.pid'), 'utf8')).split('\n')[0]);
    if (!Number.isInteger(postmaster) || postmaster <= 0) return undefined;
    let ticks = 0;
    for (const entry of await readdir('/proc')) {
      if (!/^\d+$/.test(entry)) continue;
      let stat: string;
      try {
        stat = await readFile(`/proc/${entry}/stat`, 'utf8');
      } catch {
        continue; // exited meanwhile
      }
      // fields after "(comm)": state ppid … utime(14) stime(15) cutime(16) cstime(17), 1-based overall
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      const pid = Number(entry);
      const ppid = Number(f[1]);
      if (pid !== postmaster && ppid !== postmaster) continue;
      ticks += Number(f[11]) + Number(f[12]);
      if (pid === postmaster) ticks += Number(f[13]) + Number(f[14]);
    }
    return ticks * 10; // USER_HZ is 100 on Linux
  } catch {
    return undefined;
  }
}

export async function openBenchDatabase(cleanup: Cleanup, opts: { statements?: boolean } = {}): Promise<BenchDatabase> {
  const external = process.env.DATABASE_URL;
  if (!external) {
    const home = await mkdtemp(join(tmpdir(), 'corral-bench-'));
    await chmod(home, 0o755);
    cleanup.defer('remove temporary folder', () => rm(home, { recursive: true, force: true }));
    progress(`starting an embedded PostgreSQL in ${home}`);
    // Deferred before starting: an interrupted start still gets stopped (a no-op if not running).
    cleanup.defer('stop embedded PostgreSQL', () => stopEmbeddedPostgres(home));
    const database = 'corral_bench';
    let server = await ensureEmbeddedPostgres({ homeDir: home, ephemeral: true, database });
    if (opts.statements) {
      const c = new pg.Client({ connectionString: server.url });
      await c.connect();
      await c.query(`alter system set shared_preload_libraries = 'pg_stat_statements'`);
      await c.query(`alter system set pg_stat_statements.track_planning = on`);
      await c.end();
      progress('restarting the embedded PostgreSQL with pg_stat_statements');
      await server.stop();
      server = await ensureEmbeddedPostgres({ homeDir: home, ephemeral: true, database });
      const d = new pg.Client({ connectionString: server.url });
      await d.connect();
      await d.query('create extension if not exists pg_stat_statements');
      await d.end();
    }
    const dataDir = server.dataDir;
    return { url: server.url, source: 'embedded', ephemeral: true, serverCpuMs: () => postgresCpuMs(dataDir) };
  }
  // A scratch database on the given server keeps the bench away from real data.
  const name = `corral_bench_${randomBytes(5).toString('hex')}`;
  const admin = new pg.Client({ connectionString: external });
  await admin.connect();
  try {
    await admin.query(`create database ${name}`);
  } catch (e) {
    progress(`cannot create a scratch database (${(e as Error).message}); using DATABASE_URL's database as is`);
    return { url: external, source: 'DATABASE_URL', ephemeral: false };
  } finally {
    await admin.end();
  }
  cleanup.defer(`drop database ${name}`, async () => {
    const c = new pg.Client({ connectionString: external });
    await c.connect();
    try {
      await c.query(`drop database if exists ${name} with (force)`);
    } finally {
      await c.end();
    }
  });
  return { url: withDatabase(external, name), source: 'DATABASE_URL (scratch database)', ephemeral: false };
}

export type ServerCpu = (() => Promise<number | undefined>) | undefined;

/** Runs `fn` and returns the CPU this process and (when measurable) the local server used. */
export async function withCpu<T>(
  serverCpu: ServerCpu,
  fn: () => Promise<T>,
): Promise<{ value: T; processMs: number; serverMs: number | undefined }> {
  const s0 = await serverCpu?.();
  const c0 = process.cpuUsage();
  const value = await fn();
  const c = process.cpuUsage(c0);
  const s1 = await serverCpu?.();
  return { value, processMs: (c.user + c.system) / 1000, serverMs: s0 !== undefined && s1 !== undefined ? s1 - s0 : undefined };
}
