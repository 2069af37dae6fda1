/**
 * The README's first minutes, on real processes and a real embedded PostgreSQL in a fresh
 * CORRAL_HOME: commands started together share one server, a start killed with -9 does not
 * wedge the next one, and SIGTERM to the process the user started (`npm start`, `npx corral
 * daemon`) stops the daemon and its workers.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { chmod } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { CORRAL, ROOT, freshHomes, run } from './helpers.ts';
import { createTestDatabase, type TestDatabase } from '../helpers/db.ts';
import {
  childPids,
  descendants,
  freePort,
  isAlive as alive,
  killAll,
  postmastersOf,
  safeKill,
  spawnCorral,
  type Proc,
} from '../helpers/processes.ts';
import { waitFor } from '../helpers/wait.ts';

const homes = freshHomes('corral-first-run-');
const freshHome = () => homes.make();

/** The environment of a user with no DATABASE_URL: the embedded server under `home`. */
const embeddedEnv = (home: string, port: number) => ({ CORRAL_HOME: home, DATABASE_URL: '', CORRAL_ENDPOINT: `tcp://127.0.0.1:${port}` });

/** Databases the tests below create on the run's server (dropped after each test). */
const databases: TestDatabase[] = [];
async function testDatabase(): Promise<TestDatabase> {
  const db = await createTestDatabase();
  databases.push(db);
  return db;
}

afterEach(async () => {
  killAll();
  for (const db of databases.splice(0)) await db.drop();
});
afterAll(() => homes.removeAll());

describe('a fresh CORRAL_HOME', () => {
  it('serves five commands and a daemon started together from one embedded server', async () => {
    const home = await freshHome();
    const env = embeddedEnv(home, await freePort());
    const daemon = spawnCorral(['daemon', '--workers', '1'], env, 'daemon');
    const sends: Proc[] = Array.from({ length: 5 }, (_, i) => spawnCorral(['send', `race-${i}/s`, '{"text":"x"}'], env, `send-${i}`));
    const codes = await Promise.all(sends.map((s) => s.exited));
    // Each reached the one server: it enqueued, or it came before the daemon had applied corral's
    // migrations and said so (a send sets up nothing in a database without corral's schema).
    const refused = sends.flatMap((s, i) => (codes[i] === 0 ? [] : [i]));
    for (const i of refused) {
      expect([codes[i], sends[i]!.log()]).toEqual([1, expect.stringContaining('the database has no corral schema yet')]);
    }
    await waitFor(() => daemon.log().includes('corral daemon running'), { timeoutMs: 90_000, what: 'the daemon to run' });
    expect(postmastersOf(home)).toBe(1);
    for (const i of refused) {
      const again = await run([CORRAL, 'send', `race-${i}/s`, '{"text":"x"}'], env);
      expect(again.code, again.stderr).toBe(0);
    }
    for (let i = 0; i < 5; i++) {
      await waitFor(async () => (await run([CORRAL, 'transcript', `race-${i}/s`], env)).stdout.includes('echo: x'), {
        timeoutMs: 60_000,
        intervalMs: 300,
        what: `the turn of race-${i}/s`,
      });
    }
    daemon.child.kill('SIGTERM');
    expect(await daemon.exited).toBe(0);
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
    await first.exited;

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
    const db = await testDatabase();
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
    const db = await testDatabase();
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
