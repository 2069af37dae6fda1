/**
 * Stopping the daemon as a person at a terminal or a process manager does, on real processes:
 * Ctrl-C is SIGINT to the whole foreground process group (npm, the daemon and, unless they have a
 * group of their own, its workers), `kill -- -PGID` is SIGTERM to all of it. Either way the turns
 * in flight finish and commit once, then the workers stop, then the daemon and the embedded
 * PostgreSQL it started, and the launcher exits 0. A daemon that cannot start exits at once, and
 * one killed with -9 is seen as dead by `corral status`.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createServer, type Server } from 'node:net';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { CORRAL, ROOT, freshHomes, json, run } from './helpers.ts';
import { useTestDatabases } from '../helpers/db.ts';
import {
  commandOf,
  descendants,
  freePort,
  isAlive,
  killAll,
  postmastersOf,
  safeKill,
  spawnCorral,
  trackChild,
  type Proc,
  exitOf,
} from '../helpers/processes.ts';
import { waitFor } from '../helpers/wait.ts';

const DRAIN_MS = 10_000;
const TURN_MS = 2_000;

const homes = freshHomes('corral-stopping-');
const freshHome = () => homes.make();

// registered before the afterEach below, so its drops run after that one has killed the processes
const databases = useTestDatabases();
const groups: number[] = [];
const servers: Server[] = [];

afterEach(async () => {
  for (const pgid of groups.splice(0)) {
    for (const pid of descendants(pgid)) safeKill(pid, 'SIGKILL');
    safeKill(-pgid, 'SIGKILL');
  }
  killAll();
  for (const s of servers.splice(0)) await new Promise((r) => s.close(r));
});
afterAll(() => homes.removeAll());

interface Launched {
  launcher: ChildProcess;
  log: () => string;
  exited: Promise<{ code: number | null; atMs: number }>;
  /** How it exited, once it has. */
  exit: () => { code: number | null; atMs: number } | undefined;
}

/** Starts `command` as a terminal would: the leader of a process group of its own. */
function launch(command: string, args: string[], env: Record<string, string>): Launched {
  let log = '';
  const launcher = spawn(command, args, { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  trackChild(launcher);
  groups.push(launcher.pid!);
  launcher.stdout!.setEncoding('utf8').on('data', (d: string) => (log += d));
  launcher.stderr!.setEncoding('utf8').on('data', (d: string) => (log += d));
  let exit: { code: number | null; atMs: number } | undefined;
  const exited = new Promise<{ code: number | null; atMs: number }>((r) =>
    launcher.once('exit', (code) => r((exit = { code, atMs: Date.now() }))),
  );
  return { launcher, log: () => log, exited, exit: () => exit };
}

const count = (text: string, what: string) => text.split(what).length - 1;

/** The environment of a user with no DATABASE_URL: the embedded server under a fresh home. */
async function embeddedEnv(): Promise<Record<string, string>> {
  return {
    CORRAL_HOME: await freshHome(),
    DATABASE_URL: '',
    CORRAL_ENDPOINT: `tcp://127.0.0.1:${await freePort()}`,
    CORRAL_DRAIN_MS: String(DRAIN_MS),
  };
}

/**
 * `turns` turns of TURN_MS running, then `signal` to the launcher's whole process group: each turn
 * commits once (attempt 1, never handed back), the launcher exits 0 within the drain + 2 s, every
 * process it started is gone, and so is the embedded PostgreSQL the daemon started.
 */
async function expectGracefulGroupStop(
  started: Launched,
  env: Record<string, string>,
  opts: { workers: number; turns: number; signal: NodeJS.Signals; launcherExitsAtOnce?: boolean },
): Promise<void> {
  const { launcher, log } = started;
  await waitFor(() => count(log(), '"worker ready"') >= opts.workers, { timeoutMs: 90_000, what: `${opts.workers} workers:\n${log()}` });
  const actors = Array.from({ length: opts.turns }, (_, i) => `stop-${i}/s`);
  for (const actor of actors) {
    const sent = await run([CORRAL, 'send', actor, JSON.stringify({ delayMs: TURN_MS, text: 'x' })], env);
    expect(sent.code, sent.stderr).toBe(0);
  }
  await waitFor(() => count(log(), '"turn started"') >= opts.turns, { timeoutMs: 30_000, what: `the turns to start:\n${log()}` });
  const tree = descendants(launcher.pid!);
  const signalledAt = Date.now();
  process.kill(-launcher.pid!, opts.signal);
  // bounded: a launcher that never exits fails here, with its log, not at the test's timeout
  const { code, atMs } = await waitFor(started.exit, {
    timeoutMs: DRAIN_MS + 5_000,
    intervalMs: 50,
    what: () => `the launcher to exit:\n${log()}`,
  });
  if (!opts.launcherExitsAtOnce) {
    expect(code, log()).toBe(0);
    expect(atMs - signalledAt).toBeLessThan(DRAIN_MS + 2_000);
  }
  await waitFor(() => tree.every((pid) => !isAlive(pid)), {
    timeoutMs: DRAIN_MS + 2_000 - (Date.now() - signalledAt),
    intervalMs: 100,
    what: () => `every process of the launcher to exit (left: ${tree.filter(isAlive).map(commandOf).join('; ')}):\n${log()}`,
  });
  expect(log()).toMatch(/"corral daemon stopped"/);
  expect(postmastersOf(env.CORRAL_HOME!)).toBe(0);
  expect(log()).not.toMatch(/second request to stop|turn handed back|turn_start send failed/);
  expect(count(log(), '"turn committed"')).toBe(opts.turns);
  // the database (started again on demand) agrees: one attempt per event, committed
  for (const actor of actors) {
    const r = await run([CORRAL, 'actor', actor, '--json'], env, { timeoutMs: 90_000 });
    const turns = json<{ recentTurns: { attempt: number; status: string }[] }>(r).recentTurns;
    expect(turns.map((t) => [t.attempt, t.status])).toEqual([[1, 'succeeded']]);
  }
}

describe('Ctrl-C and SIGTERM to the whole process group drain first', () => {
  it('`npm start`: SIGINT to its group, with 4 turns running', async () => {
    const env = await embeddedEnv();
    const started = launch('npm', ['start'], env);
    await expectGracefulGroupStop(started, env, { workers: 2, turns: 4, signal: 'SIGINT' });
  }, 240_000);

  it('`corral daemon --workers 2`: SIGINT to its group, with 4 turns running', async () => {
    const env = await embeddedEnv();
    const started = launch(process.execPath, [CORRAL, 'daemon', '--workers', '2'], env);
    await expectGracefulGroupStop(started, env, { workers: 2, turns: 4, signal: 'SIGINT' });
  }, 240_000);

  it('`npx corral daemon`: SIGTERM to its group (npx exits first; the daemon still drains)', async () => {
    const env = await embeddedEnv();
    const started = launch('npx', ['corral', 'daemon', '--workers', '1'], env);
    await expectGracefulGroupStop(started, env, { workers: 1, turns: 2, signal: 'SIGTERM', launcherExitsAtOnce: true });
  }, 240_000);
});

describe('a standalone `corral worker`', () => {
  it('SIGTERM drains it: no new turn, the running one commits on its attempt, then it exits 0; a second signal forces', async () => {
    const db = await databases.fresh();
    const home = await freshHome();
    const env = {
      DATABASE_URL: db.url,
      CORRAL_HOME: home,
      CORRAL_ENDPOINT: `tcp://127.0.0.1:${await freePort()}`,
      CORRAL_DRAIN_MS: '10000',
      // a worker that stopped is forgotten within a few seconds, so the next turn goes to the next
      // one; not sooner: at 1.5 s a loaded machine's late heartbeats made the draining worker stale
      // before its turn ended (the turn then superseded and retried)
      CORRAL_WORKER_STALE_MS: '4000',
      CORRAL_WORKER_HEARTBEAT_MS: '300',
      CORRAL_WATCHDOG_INTERVAL_MS: '200',
    };
    const daemon = spawnCorral(['daemon'], env, 'daemon');
    await waitFor(() => daemon.log().includes('corral daemon running'), { timeoutMs: 60_000, what: () => `the daemon:\n${daemon.log()}` });
    // at debug, the worker says when a turn reached it (the daemon's "turn started" is before its send)
    const worker = spawnCorral(['worker', '--id', 'solo-1'], { ...env, CORRAL_LOG_LEVEL: 'debug' }, 'worker');
    await waitFor(() => daemon.log().includes('"worker ready"'), { timeoutMs: 30_000, what: () => `the worker:\n${worker.log()}` });
    const sent = await run([CORRAL, 'send', 'solo/s', JSON.stringify({ delayMs: TURN_MS, text: 'x' })], env);
    expect(sent.code, sent.stderr).toBe(0);
    await waitFor(() => worker.log().includes('"turn started"'), { timeoutMs: 30_000, what: 'the turn to reach the worker' });
    const signalledAt = Date.now();
    worker.child.kill('SIGTERM');
    expect(await exitOf(worker, DRAIN_MS + 5_000), worker.log()).toBe(0);
    expect(Date.now() - signalledAt).toBeLessThan(DRAIN_MS);
    expect(worker.log()).toMatch(/"draining: turns in flight may finish/);
    // its turn commits on its first attempt (the result it sent before exiting): never handed back, never retried
    const turns = await waitFor(
      async () => {
        const t = json<{ recentTurns: { attempt: number; status: string }[] }>(
          await run([CORRAL, 'actor', 'solo/s', '--json'], env),
        ).recentTurns;
        return t.every((x) => x.status !== 'started') ? t : undefined;
      },
      { timeoutMs: 10_000, intervalMs: 200, what: 'the turn to end' },
    );
    expect(turns.map((t) => [t.attempt, t.status])).toEqual([[1, 'succeeded']]);

    // a second request a second or more after the first does not wait for the turn
    await waitFor(() => /"workerId":"solo-1"[^\n]*"worker (stale: no heartbeat|gone)"/.test(daemon.log()), {
      timeoutMs: 15_000,
      what: 'the daemon to forget the stopped worker',
    });
    const second = spawnCorral(['worker', '--id', 'solo-2'], env, 'worker-2');
    await waitFor(() => daemon.log().split('"worker ready"').length - 1 >= 2, { timeoutMs: 30_000, what: 'the second worker' });
    expect((await run([CORRAL, 'send', 'solo/s2', JSON.stringify({ delayMs: 30_000 })], env)).code).toBe(0);
    await waitFor(() => /"workerId":"solo-2"[^\n]*"turn started"/.test(daemon.log()), {
      timeoutMs: 30_000,
      what: 'the long turn to start on it',
    });
    second.child.kill('SIGTERM');
    await waitFor(() => second.log().includes('draining'), { timeoutMs: 10_000, what: 'the drain' });
    await new Promise((r) => setTimeout(r, 1_100));
    second.child.kill('SIGTERM');
    expect(await exitOf(second, 10_000)).toBe(130);
    daemon.child.kill('SIGTERM');
    await exitOf(daemon);
  }, 120_000);
});

describe('a daemon that cannot start', () => {
  async function expectQuickFailure(daemon: Proc, message: RegExp): Promise<void> {
    const startedAt = Date.now();
    const code = await exitOf(daemon);
    expect(Date.now() - startedAt).toBeLessThan(5_000);
    expect(code).not.toBe(0);
    expect(daemon.log()).toMatch(message);
    expect(daemon.log()).not.toMatch(/corral daemon running/);
  }

  it('exits non-zero within 5 s when its endpoint or its metrics port is in use', async () => {
    const db = await databases.fresh();
    const env = { DATABASE_URL: db.url, CORRAL_HOME: await freshHome(), CORRAL_ENDPOINT: `tcp://127.0.0.1:${await freePort()}` };
    const first = spawnCorral(['daemon'], env, 'first');
    await waitFor(() => first.log().includes('corral daemon running'), { timeoutMs: 60_000, what: 'the first daemon' });

    await expectQuickFailure(spawnCorral(['daemon'], env, 'second'), /broker cannot bind .*[Aa]ddress already in use/);

    const busy = createServer();
    servers.push(busy);
    const port = await new Promise<number>((r) => busy.listen(0, '127.0.0.1', () => r((busy.address() as { port: number }).port)));
    const metricsEnv = { ...env, CORRAL_ENDPOINT: `tcp://127.0.0.1:${await freePort()}` };
    await expectQuickFailure(
      spawnCorral(['daemon', '--metrics-port', String(port)], metricsEnv, 'metrics'),
      new RegExp(`metrics server cannot listen on 127\\.0\\.0\\.1:${port}: .*EADDRINUSE`),
    );

    // the first daemon was never disturbed
    const status = json<{ daemons: { daemonId: string; alive: boolean }[] }>(await run([CORRAL, 'status', '--json'], env));
    expect(status.daemons.filter((d) => d.alive)).toHaveLength(1);
    first.child.kill('SIGTERM');
    expect(await exitOf(first)).toBe(0);
  }, 120_000);
});

describe('liveness in `corral status`', () => {
  it('a daemon killed with -9 shows as not alive, and its workers as stale, within 2 × the stale timeout', async () => {
    const db = await databases.fresh();
    const staleMs = 3_000;
    const env = {
      DATABASE_URL: db.url,
      CORRAL_HOME: await freshHome(),
      CORRAL_ENDPOINT: `tcp://127.0.0.1:${await freePort()}`,
      CORRAL_WORKER_STALE_MS: String(staleMs),
      CORRAL_WORKER_HEARTBEAT_MS: '500',
    };
    const daemon = spawnCorral(['daemon', '--workers', '1'], env, 'daemon');
    await waitFor(() => daemon.log().includes('"worker ready"'), { timeoutMs: 60_000, what: 'the worker' });

    interface Status {
      daemons: { daemonId: string; alive: boolean; state: string; pid: number }[];
      workers: { workerId: string; status: string; ownerId: string }[];
    }
    const status = async () => json<Status>(await run([CORRAL, 'status', '--json'], env));
    const before = await status();
    expect(before.daemons.map((d) => [d.pid, d.alive, d.state])).toEqual([[daemon.child.pid, true, 'running']]);
    expect(before.workers.map((w) => [w.status, w.ownerId])).toEqual([['ready', before.daemons[0]!.daemonId]]);

    const killedAt = Date.now();
    daemon.child.kill('SIGKILL');
    const after = await waitFor(
      async () => {
        const s = await status();
        return s.daemons[0]?.alive === false && s.workers[0]?.status === 'stale' ? s : undefined;
      },
      { timeoutMs: 4 * staleMs, intervalMs: 100, what: 'status to see the daemon dead' },
    );
    expect(Date.now() - killedAt).toBeLessThan(2 * staleMs);
    expect(after.daemons[0]!.state).toBe('dead');

    const text = await run([CORRAL, 'status'], env);
    expect(text.stdout).toMatch(/daemons: none running \(1 stopped or dead\)/);
    expect(text.stdout).toMatch(/ dead /);
    expect(text.stdout).toMatch(/workers: 0 ready of 1/);
  }, 120_000);

  it('a daemon stopped cleanly shows as stopped, its workers as gone, and no warm activation outlives it', async () => {
    const db = await databases.fresh();
    const env = { DATABASE_URL: db.url, CORRAL_HOME: await freshHome(), CORRAL_ENDPOINT: `tcp://127.0.0.1:${await freePort()}` };
    const daemon = spawnCorral(['daemon', '--workers', '1'], env, 'daemon');
    await waitFor(() => daemon.log().includes('"worker ready"'), { timeoutMs: 60_000, what: 'the worker' });
    expect((await run([CORRAL, 'send', 'warm/s', '{"text":"x"}'], env)).code).toBe(0);
    await waitFor(() => daemon.log().includes('"turn committed"'), { timeoutMs: 30_000, what: 'the turn' });
    daemon.child.kill('SIGTERM');
    expect(await exitOf(daemon)).toBe(0);
    const s = json<{ daemons: { state: string }[]; workers: { status: string }[]; liveActivations: number }>(
      await run([CORRAL, 'status', '--json'], env),
    );
    expect(s.daemons.map((d) => d.state)).toEqual(['stopped']);
    expect(s.workers.map((w) => w.status)).toEqual(['gone']);
    expect(s.liveActivations).toBe(0);
  }, 120_000);
});
