/**
 * OS-process children with real subprocesses and signals. These use the system clock (real
 * processes run in real time) and poll with a deadline instead of fixed sleeps.
 */
import { afterEach, describe, expect, it } from 'vitest';
import type { ChildProcess } from 'node:child_process';
import { ManualClock } from '../../src/base/clock.ts';
import { ProcessExitError, Supervisor, processChild, type SupervisorEvent } from '../../src/supervisor/index.ts';
import { waitFor as sharedWaitFor } from '../helpers/wait.ts';

const NODE = process.execPath;
const IDLE = 'setInterval(() => {}, 1000)';
const spawned: number[] = [];

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function waitFor(cond: () => boolean, what: string, timeoutMs = 10_000): Promise<void> {
  await sharedWaitFor(cond, { what, timeoutMs, intervalMs: 20 });
}

async function nextOfType(sup: Supervisor<unknown>, type: SupervisorEvent['type']): Promise<SupervisorEvent> {
  for (;;) {
    const e = await sup.nextEvent({ timeoutMs: 10_000 });
    if (e.type === 'end') throw new Error(`stream ended before a ${type} event`);
    if (e.type === type) return e;
  }
}

/** Resolves when the process printed `line` on stdout (it installed its handlers). */
function printed(proc: ChildProcess, line: string): Promise<void> {
  return new Promise((resolve) => {
    let buf = '';
    proc.stdout?.on('data', (d: Buffer) => {
      buf += d.toString();
      if (buf.includes(line)) resolve();
    });
  });
}

afterEach(() => {
  for (const pid of spawned.splice(0)) if (alive(pid)) process.kill(pid, 'SIGKILL');
});

describe('processChild', () => {
  it('a permanent worker process killed with SIGKILL is restarted as a new process', async () => {
    const pids: number[] = [];
    const sup = new Supervisor<unknown>({}, { name: 'workers' });
    sup.register({
      name: 'worker-1',
      policy: 'permanent',
      readiness: true,
      factory: processChild({
        command: NODE,
        args: ['-e', IDLE],
        readyOnSpawn: true,
        onSpawn: (pid) => {
          pids.push(pid);
          spawned.push(pid);
        },
      }),
    });
    const handle = sup.start();
    await waitFor(() => pids.length === 1, 'first spawn');
    expect(await nextOfType(sup, 'ready')).toMatchObject({ name: 'worker-1', generation: 1 });

    process.kill(pids[0]!, 'SIGKILL');
    const failed = await nextOfType(sup, 'failed');
    expect(failed).toMatchObject({ name: 'worker-1', generation: 1, willRestart: true });
    if (failed.type === 'failed') expect(failed.diagnostic).toContain('killed by signal SIGKILL');
    expect(await nextOfType(sup, 'restarted')).toMatchObject({ generation: 2 });
    expect(await nextOfType(sup, 'ready')).toMatchObject({ generation: 2 });
    await waitFor(() => pids.length === 2, 'second spawn');
    expect(pids[1]).not.toBe(pids[0]);
    expect(alive(pids[1]!)).toBe(true);

    // Shutdown sends SIGTERM; a node process dies of it, which is a clean stop.
    expect(await handle.shutdown({ deadlineMs: 10_000 })).toEqual({ kind: 'clean' });
    expect(alive(pids[1]!)).toBe(false);
  });

  it('exit code 0 is a normal end; a non-zero code is a failure with the code', async () => {
    const sup = new Supervisor<unknown>({});
    sup.register({ name: 'ok', policy: 'transient', factory: processChild({ command: NODE, args: ['-e', 'process.exit(0)'] }) });
    sup.register({ name: 'bad', policy: 'temporary', factory: processChild({ command: NODE, args: ['-e', 'process.exit(3)'] }) });
    const err = await sup.run().then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(ProcessExitError);
    expect(err).toMatchObject({ exitCode: 3, signal: null });
    expect(sup.failures().map((f) => f.name)).toEqual(['bad']);
    expect(sup.failures()[0]!.diagnostic).toContain('exited with code 3');
  });

  it('a process ignoring SIGTERM gets SIGKILL after killTimeoutMs (on the injected clock)', async () => {
    const clock = new ManualClock();
    let proc: ChildProcess | null = null;
    let handlersInstalled: Promise<void> | null = null;
    const sup = new Supervisor<unknown>({}, { clock });
    sup.register({
      name: 'stubborn',
      policy: 'permanent',
      factory: processChild({
        command: NODE,
        args: ['-e', `process.on('SIGTERM', () => console.log('ignored')); console.log('up'); ${IDLE}`],
        stdio: ['ignore', 'pipe', 'inherit'],
        killTimeoutMs: 2000,
        onSpawn: (pid, p) => {
          spawned.push(pid);
          proc = p;
          handlersInstalled = printed(p, 'up');
        },
      }),
    });
    const handle = sup.start();
    await waitFor(() => handlersInstalled !== null, 'spawn');
    await handlersInstalled;
    const ignored = printed(proc!, 'ignored');
    const result = handle.shutdown();
    await ignored; // SIGTERM arrived and was ignored
    expect(alive(proc!.pid!)).toBe(true);
    await clock.advance(1999);
    expect(alive(proc!.pid!)).toBe(true);
    await clock.advance(1);
    const r = await result;
    expect(r.kind).toBe('failed');
    if (r.kind === 'failed') {
      expect(r.failures[0]!.name).toBe('stubborn');
      expect(r.failures[0]!.diagnostic).toMatch(/ignored SIGTERM for 2000 ms; killed with SIGKILL/);
    }
    expect(alive(proc!.pid!)).toBe(false);
  });

  it('a command that cannot be spawned is a failure', async () => {
    const sup = new Supervisor<unknown>({});
    sup.register({ name: 'ghost', policy: 'temporary', factory: processChild({ command: '/nonexistent/corral-binary' }) });
    await expect(sup.run()).rejects.toMatchObject({ code: 'ENOENT' });
  });
});
