/**
 * The README's first minutes, on real processes and a real embedded PostgreSQL in a fresh
 * CORRAL_HOME: commands started together share one server, a start killed with -9 does not
 * wedge the next one, and SIGTERM to the process the user started (`npm start`, `npx corral
 * daemon`) stops the daemon and its workers.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { chmod } from 'node:fs/promises';
import { hostname } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { CORRAL, ROOT, freshHomes, run } from './helpers.ts';
import { useTestDatabases } from '../helpers/db.ts';
import {
  childPids,
  descendants,
  freePort,
  isAlive as alive,
  killAll,
  postmastersOf,
  safeKill,
  spawnCorral,
  trackChild,
  type Proc,
  exitOf,
} from '../helpers/processes.ts';
import { waitFor } from '../helpers/wait.ts';
import { SETUP_LOCK_KEY } from '../../src/db/postgres/setup-lock.ts';

const homes = freshHomes('corral-first-run-');
const freshHome = () => homes.make();

/** The environment of a user with no DATABASE_URL: the embedded server under `home`. */
const embeddedEnv = (home: string, port: number) => ({ CORRAL_HOME: home, DATABASE_URL: '', CORRAL_ENDPOINT: `tcp://127.0.0.1:${port}` });

/** Databases the tests below create on the run's server (dropped after each test, once the afterEach below killed its processes). */
const databases = useTestDatabases();

afterEach(() => {
  killAll();
});
afterAll(() => homes.removeAll());

describe('a fresh CORRAL_HOME', () => {
  it('five sends fired 0.2 s apart while `npm start` sets a fresh home up all wait for it and commit', async () => {
    const home = await freshHome();
    const env = embeddedEnv(home, await freePort());
    const started = spawn('npm', ['start'], {
      cwd: ROOT,
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true,
    });
    trackChild(started);
    let log = '';
    started.stdout!.setEncoding('utf8').on('data', (d: string) => (log += d));
    started.stderr!.setEncoding('utf8').on('data', (d: string) => (log += d));
    try {
      const sends: Proc[] = [];
      for (let i = 0; i < 5; i++) {
        await new Promise((r) => setTimeout(r, 200));
        sends.push(spawnCorral(['send', `race-${i}/s`, '{"text":"x"}'], env, `send-${i}`));
      }
      const codes = await Promise.all(sends.map((s) => s.exited));
      expect(codes, sends.map((s) => s.log()).join('\n')).toEqual([0, 0, 0, 0, 0]);
      // each said once what it waited for, when it had to wait (the first ones did: initdb alone takes seconds)
      const waited = sends.filter((s) => s.log().includes('waiting for'));
      expect(waited.length).toBeGreaterThan(0);
      for (const s of waited) expect(s.log().split('waiting for').length - 1).toBe(1);
      expect(waited[0]!.log()).toMatch(
        /corral: waiting for the (daemon starting in .* \(pid \d+\)|set-up of the database under way \(.*\)) to finish \(up to 60 s\)/,
      );
      await waitFor(() => log.includes('corral daemon running'), { timeoutMs: 90_000, what: `the daemon to run:\n${log}` });
      expect(postmastersOf(home)).toBe(1);
      for (let i = 0; i < 5; i++) {
        await waitFor(async () => (await run([CORRAL, 'transcript', `race-${i}/s`], env)).stdout.includes('echo: x'), {
          timeoutMs: 60_000,
          intervalMs: 300,
          what: `the turn of race-${i}/s`,
        });
      }
      // the daemon is set up: no mark of it starting is left behind
      expect(readdirSync(join(home, 'starting'))).toEqual([]);
    } finally {
      process.kill(-started.pid!, 'SIGTERM');
      await waitFor(() => started.exitCode !== null, { timeoutMs: 30_000, what: 'npm start to exit' }).catch(() => {
        for (const pid of descendants(started.pid!)) safeKill(pid, 'SIGKILL');
      });
    }
  }, 240_000);

  it('a send with no daemon at all fails fast with the schema message, and waits for nothing', async () => {
    const home = await freshHome();
    const env = embeddedEnv(home, await freePort());
    // the embedded server started, no corral schema in it, nobody setting it up
    const first = await run([CORRAL, 'send', 'nobody/s', '{"text":"x"}'], env, { timeoutMs: 90_000 });
    expect([first.code, first.stderr]).toEqual([1, expect.stringContaining('the database has no corral schema yet')]);
    const startedAt = Date.now();
    const again = await run([CORRAL, 'send', 'nobody/s', '{"text":"x"}'], env);
    expect([again.code, again.stderr]).toEqual([1, expect.stringContaining('the database has no corral schema yet')]);
    expect(again.stderr).not.toContain('waiting for');
    expect(Date.now() - startedAt).toBeLessThan(5_000);
    // nor does a mark left by a daemon killed while it started
    mkdirSync(join(home, 'starting'), { recursive: true });
    writeFileSync(
      join(home, 'starting', '999999'),
      JSON.stringify({ pid: 2 ** 22 + 1, host: hostname(), since: new Date().toISOString() }),
    );
    const stale = await run([CORRAL, 'status'], env);
    expect([stale.code, stale.stderr]).toEqual([1, expect.stringContaining('the database has no corral schema yet')]);
    expect(stale.stderr).not.toContain('waiting for');
  }, 180_000);

  it('a command on a database whose set-up lock another session holds waits for it, and gives up with a clear error', async () => {
    const db = await databases.fresh();
    const env = { DATABASE_URL: db.url, CORRAL_HOME: await freshHome() };
    // an empty database, as a daemon finds it before its migrations ran
    const admin = new pg.Client({ connectionString: db.url });
    await admin.connect();
    try {
      await admin.query('drop schema corral cascade; drop schema drizzle cascade');
      await admin.query('select pg_advisory_lock($1)', [SETUP_LOCK_KEY]);
      const send = spawnCorral(['send', 'locked/s', '{"text":"x"}'], env, 'send');
      await waitFor(() => send.log().includes('waiting for'), { timeoutMs: 30_000, what: `the send to wait:\n${send.log()}` });
      expect(send.log()).toMatch(/waiting for the set-up of the database under way \(.*backend pid \d+\)/);
      // the set-up goes on: a `db migrate` queued behind this session takes the lock as it is released
      const migrate = spawnCorral(['db', 'migrate'], env, 'migrate');
      await waitFor(async () => (await admin.query(`select 1 from pg_locks where locktype = 'advisory' and not granted`)).rowCount === 1, {
        timeoutMs: 30_000,
        what: 'db migrate to wait for the lock',
      });
      await admin.query('select pg_advisory_unlock($1)', [SETUP_LOCK_KEY]);
      expect(await exitOf(migrate), migrate.log()).toBe(0);
      expect(await exitOf(send), send.log()).toBe(0);
      expect(send.log().split('waiting for').length - 1).toBe(1);
      // a set-up that never ends: the wait is bounded
      await admin.query('drop schema corral cascade');
      await admin.query('select pg_advisory_lock($1)', [SETUP_LOCK_KEY]);
      const bounded = await run([CORRAL, 'status'], { ...env, CORRAL_SETUP_WAIT_MS: '1500' });
      expect(bounded.code).toBe(1);
      expect(bounded.stderr).toMatch(/the database is still being set up after \d+ s/);
    } finally {
      await admin.end();
    }
  }, 180_000);

  it('a command that finds the recorded server stopped starts it', async () => {
    const home = await freshHome();
    const env = embeddedEnv(home, await freePort());
    const migrated = await run([CORRAL, 'db', 'migrate'], env, { timeoutMs: 90_000 });
    expect(migrated.code, migrated.stderr).toBe(0);
    // Read commands and `send` connect to the recorded server first; stopped, it is started.
    for (const args of [['status'], ['send', 'restart/s', '{"text":"x"}']]) {
      expect((await run([CORRAL, 'db', 'stop'], env)).stdout).toMatch(/stopped/);
      expect(postmastersOf(home)).toBe(0);
      const res = await run([CORRAL, ...args], env, { timeoutMs: 90_000 });
      expect(res.code, res.stderr).toBe(0);
      expect(postmastersOf(home)).toBe(1);
    }
  }, 180_000);

  it('recovers from a start killed with -9 while it holds the lock', async () => {
    const home = await freshHome();
    const env = embeddedEnv(home, await freePort());
    const first = spawnCorral(['db', 'migrate'], env, 'migrate');
    const lock = join(home, 'embedded.lock');
    const holder = await waitFor(
      () => (existsSync(lock) ? (JSON.parse(readFileSync(lock, 'utf8') || '{}') as { pid?: number }).pid : undefined),
      { timeoutMs: 30_000, intervalMs: 5, what: 'the first start to take the lock' },
    );
    expect(holder).toBe(first.child.pid);
    first.child.kill('SIGKILL');
    await exitOf(first);

    // The bound: a holder whose pid is gone is replaced at once; one that cannot be checked (other
    // host, reused pid) after 10 s of silence. initdb and the start itself come on top.
    const started = Date.now();
    const next = await run([CORRAL, 'db', 'migrate'], env, { timeoutMs: 90_000 });
    expect(next.code, next.stderr).toBe(0);
    expect(Date.now() - started).toBeLessThan(60_000);
    expect(existsSync(join(home, 'pg', 'data', 'PG_VERSION'))).toBe(true);
    expect(readdirSync(join(home, 'pg')).filter((n) => n.startsWith('data.init'))).toEqual([]);
    expect(existsSync(lock)).toBe(false);
  }, 180_000);

  it.runIf(process.getuid?.() === 0)(
    'as root, moves the cluster out of a home the postgres user cannot reach',
    async () => {
      const closed = await freshHome();
      await chmod(closed, 0o700);
      const home = join(closed, 'home');
      const root = await freshHome();
      const env = { ...embeddedEnv(home, await freePort()), CORRAL_EMBEDDED_ROOT: root };
      const migrated = await run([CORRAL, 'db', 'migrate'], env, { timeoutMs: 90_000 });
      expect(migrated.code, migrated.stderr).toBe(0);
      const state = JSON.parse(readFileSync(join(home, 'embedded.json'), 'utf8')) as { dataDir: string };
      expect(state.dataDir.startsWith(root)).toBe(true);
      expect(existsSync(join(state.dataDir, 'PG_VERSION'))).toBe(true);
      const stopped = await run([CORRAL, 'db', 'stop'], env);
      expect(stopped.stdout).toMatch(/stopped/);
    },
    180_000,
  );
});

describe('SIGTERM to the process the user started', () => {
  async function startUnder(command: string, args: string[]): Promise<{ launcher: ChildProcess; log: () => string }> {
    const db = await databases.fresh();
    const port = await freePort();
    let log = '';
    const launcher = spawn(command, args, {
      cwd: ROOT,
      env: {
        ...process.env,
        DATABASE_URL: db.url,
        CORRAL_HOME: await freshHome(),
        CORRAL_ENDPOINT: `tcp://127.0.0.1:${port}`,
        CORRAL_DRAIN_MS: '2000',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    launcher.stdout!.setEncoding('utf8').on('data', (d: string) => (log += d));
    launcher.stderr!.setEncoding('utf8').on('data', (d: string) => (log += d));
    return { launcher, log: () => log };
  }

  async function expectAllGoneAfterSigterm(launcher: ChildProcess, log: () => string, workers: number): Promise<void> {
    await waitFor(() => (log().match(/"worker ready"/g) ?? []).length >= workers, {
      timeoutMs: 60_000,
      what: `${workers} workers:\n${log()}`,
    });
    const tree = descendants(launcher.pid!);
    const nodes = tree.filter((pid) => {
      try {
        return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('corral');
      } catch {
        return false;
      }
    });
    expect(nodes.length).toBeGreaterThanOrEqual(1 + workers); // the daemon and its workers
    launcher.kill('SIGTERM');
    // Within the drain time (2 s here) plus the workers' own stop.
    await waitFor(() => nodes.every((pid) => !alive(pid)), {
      timeoutMs: 15_000,
      intervalMs: 100,
      what: `the daemon and workers to exit:\n${log()}`,
    });
    for (const pid of tree) safeKill(pid, 'SIGKILL');
  }

  it('`npm start` stops the daemon and its workers', async () => {
    const { launcher, log } = await startUnder('npm', ['start']);
    await expectAllGoneAfterSigterm(launcher, log, 2);
    expect(log()).toMatch(/shutting down/);
  }, 120_000);

  it('`npx corral daemon` stops the daemon and its workers', async () => {
    const { launcher, log } = await startUnder('npx', ['corral', 'daemon', '--workers', '1']);
    await expectAllGoneAfterSigterm(launcher, log, 1);
    expect(log()).toMatch(/shutting down/);
  }, 120_000);

  it('a daemon killed with -9 takes its local workers with it', async () => {
    const db = await databases.fresh();
    const daemon = spawnCorral(['daemon', '--workers', '1'], {
      DATABASE_URL: db.url,
      CORRAL_HOME: await freshHome(),
      CORRAL_ENDPOINT: `tcp://127.0.0.1:${await freePort()}`,
    });
    await waitFor(() => daemon.log().includes('"worker ready"'), { timeoutMs: 60_000, what: 'the worker' });
    const workers = childPids(daemon.child.pid!, ' worker ');
    expect(workers).toHaveLength(1);
    daemon.child.kill('SIGKILL');
    await waitFor(() => workers.every((pid) => !alive(pid)), { timeoutMs: 10_000, intervalMs: 100, what: 'the orphaned worker to exit' });
  }, 120_000);
});
