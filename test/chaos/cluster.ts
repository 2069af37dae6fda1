/**
 * One scenario's processes (`corral daemon`, `corral worker`): start, wait until ready, kill -9,
 * SIGSTOP/SIGCONT, terminate. Every child is registered with the shared process registry
 * (test/helpers/processes.ts), so it is killed whatever happens and the leak check sees it.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, mkdirSync, openSync } from 'node:fs';
import { join } from 'node:path';
import { CORRAL_BIN, freePort, trackChild } from '../helpers/processes.ts';
import { sleep, waitFor } from '../helpers/wait.ts';
import { childEnv, type ChaosTimings } from './environment.ts';
import { readLogLines, tailFile } from './logs.ts';

/** Preload that makes a child kill itself when the harness process disappears. */
const PARENT_WATCH = new URL('./parent-watch.mjs', import.meta.url).href;

export type ChildKind = 'daemon' | 'worker';

export interface ChildHandle {
  name: string;
  kind: ChildKind;
  proc: ChildProcess;
  pid: number;
  logPath: string;
  endpoint: string;
  args: string[];
  startedAt: number;
  /** Set when the harness killed / stopped it on purpose (its exit is then expected). */
  expectedExit: boolean;
  stopped: boolean;
  exit: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  exited: boolean;
}

export interface UnexpectedExit {
  name: string;
  code: number | null;
  signal: NodeJS.Signals | null;
  logPath: string;
}

export interface WorkerSpec {
  id: string;
  capacity?: number;
  duplicateResults?: boolean;
}

/**
 * One scenario's processes. Tracks every pid it starts; `cleanup()` kills whatever is left
 * (also on failure). Child stdout/stderr go to `<logDir>/<name>.log`.
 */
export class Cluster {
  readonly logDir: string;
  readonly databaseUrl: string;
  readonly timings: ChaosTimings;
  readonly children: ChildHandle[] = [];
  readonly unexpectedExits: UnexpectedExit[] = [];
  readonly notes: string[] = [];
  readonly faults: { at: number; what: string }[] = [];
  private readonly incarnations = new Map<string, number>();

  /** Extra environment of every daemon (e.g. `CORRAL_INPUT_POLICY`). */
  readonly daemonEnv: Record<string, string>;

  constructor(opts: { logDir: string; databaseUrl: string; timings: ChaosTimings; daemonEnv?: Record<string, string> }) {
    this.logDir = opts.logDir;
    this.databaseUrl = opts.databaseUrl;
    this.timings = opts.timings;
    this.daemonEnv = opts.daemonEnv ?? {};
    mkdirSync(this.logDir, { recursive: true });
  }

  private spawnChild(name: string, kind: ChildKind, endpoint: string, args: string[]): ChildHandle {
    const n = (this.incarnations.get(name) ?? 0) + 1;
    this.incarnations.set(name, n);
    const logPath = join(this.logDir, `${name}${n > 1 ? `.${n}` : ''}.log`);
    const fd = openSync(logPath, 'a');
    let proc: ChildProcess;
    try {
      // CORRAL_CHAOS_NODE_ARGS: extra node flags for every child (e.g. `--import ./trace.mjs`).
      const nodeArgs = (process.env.CORRAL_CHAOS_NODE_ARGS ?? '').split(/\s+/).filter(Boolean);
      proc = spawn(process.execPath, ['--import', PARENT_WATCH, ...nodeArgs, CORRAL_BIN, ...args], {
        env: { ...childEnv(this.databaseUrl, this.timings, this.logDir), ...(kind === 'daemon' ? this.daemonEnv : {}) },
        stdio: ['ignore', fd, fd],
        cwd: this.logDir,
      });
    } finally {
      closeSync(fd);
    }
    if (!proc.pid) throw new Error(`chaos: could not spawn ${name}`);
    trackChild(proc);
    const handle: ChildHandle = {
      name: n > 1 ? `${name}#${n}` : name,
      kind,
      proc,
      pid: proc.pid,
      logPath,
      endpoint,
      args,
      startedAt: Date.now(),
      expectedExit: false,
      stopped: false,
      exited: false,
      exit: new Promise((resolve) => {
        proc.once('exit', (code, signal) => {
          handle.exited = true;
          if (!handle.expectedExit) {
            this.unexpectedExits.push({ name: handle.name, code, signal, logPath });
            this.markFault(`${handle.name} exited on its own`);
          }
          resolve({ code, signal });
        });
      }),
    };
    this.children.push(handle);
    return handle;
  }

  /** Starts `corral daemon` on `endpoint` (a fresh free port if omitted) and waits until it runs. */
  async startDaemon(name = 'daemon', endpoint?: string, opts: { wait?: boolean } = {}): Promise<ChildHandle> {
    const ep = endpoint ?? `tcp://127.0.0.1:${await freePort()}`;
    const h = this.spawnChild(name, 'daemon', ep, ['daemon', '--endpoint', ep]);
    if (opts.wait ?? true) await this.waitDaemonRunning(h);
    return h;
  }

  async waitDaemonRunning(h: ChildHandle, timeoutMs = 60_000): Promise<void> {
    await this.waitForLog(h, (l) => l.msg === 'corral daemon running', timeoutMs, `${h.name} running`);
  }

  /** Starts `corral worker`; with `daemon`, waits until that daemon logged its registration. */
  async startWorker(spec: WorkerSpec, endpoint: string, daemon?: ChildHandle): Promise<ChildHandle> {
    const args = ['worker', '--id', spec.id, '--endpoint', endpoint, '--capacity', String(spec.capacity ?? 4)];
    if (spec.duplicateResults) args.push('--duplicate-results');
    const h = this.spawnChild(spec.id, 'worker', endpoint, args);
    if (daemon) await this.waitWorkerReady(daemon, spec.id, h.startedAt);
    return h;
  }

  /** Waits for `daemon` to log `worker ready` for `workerId` (after `sinceMs`, epoch ms). */
  async waitWorkerReady(daemon: ChildHandle, workerId: string, sinceMs = 0, timeoutMs = 60_000): Promise<void> {
    await this.waitForLog(
      daemon,
      (l) => l.msg === 'worker ready' && l.workerId === workerId && Number(l.time ?? 0) >= sinceMs - 50,
      timeoutMs,
      `${workerId} registered with ${daemon.name}`,
    );
  }

  async waitForLog(
    h: ChildHandle,
    pred: (line: Record<string, unknown>) => boolean,
    timeoutMs: number,
    what: string,
  ): Promise<Record<string, unknown>> {
    try {
      return await waitFor(
        () => {
          if (h.exited) throw new Error(`${h.name} exited`);
          return readLogLines(h.logPath).find(pred);
        },
        { what: `chaos: ${what}`, timeoutMs, intervalMs: 100 },
      );
    } catch (e) {
      throw new Error(`${(e as Error).message}\n--- ${h.logPath} (tail) ---\n${tailFile(h.logPath)}`);
    }
  }

  kill9(h: ChildHandle): void {
    h.expectedExit = true;
    this.markFault(`kill -9 ${h.name}`);
    if (!h.exited) process.kill(h.pid, 'SIGKILL');
  }

  /** Records when a fault was injected (recovery latencies are measured from the latest one). */
  markFault(what: string): void {
    this.faults.push({ at: Date.now(), what });
  }

  /** SIGSTOP: the process freezes (its sockets stay open, its timers do not fire). */
  pause(h: ChildHandle): void {
    h.stopped = true;
    this.markFault(`SIGSTOP ${h.name}`);
    process.kill(h.pid, 'SIGSTOP');
  }

  resume(h: ChildHandle): void {
    h.stopped = false;
    process.kill(h.pid, 'SIGCONT');
  }

  async kill9AndWait(h: ChildHandle): Promise<void> {
    this.kill9(h);
    await h.exit;
  }

  /** SIGTERM, then SIGKILL after `graceMs`. Notes a process that had to be killed. */
  async terminate(h: ChildHandle, graceMs = 8_000): Promise<void> {
    if (h.exited) return;
    h.expectedExit = true;
    if (h.stopped) this.resume(h);
    try {
      process.kill(h.pid, 'SIGTERM');
    } catch {
      return;
    }
    const timer = sleep(graceMs).then(() => 'timeout' as const);
    const res = await Promise.race([h.exit.then(() => 'exited' as const), timer]);
    if (res === 'timeout' && !h.exited) {
      this.notes.push(`${h.name} did not exit within ${graceMs} ms of SIGTERM: killed`);
      process.kill(h.pid, 'SIGKILL');
      await h.exit;
    }
  }

  /** Graceful stop of everything still running (workers first), then SIGKILL of stragglers. */
  async stopAll(): Promise<void> {
    const alive = this.children.filter((c) => !c.exited);
    await Promise.all(alive.filter((c) => c.kind === 'worker').map((c) => this.terminate(c, 5_000)));
    await Promise.all(alive.filter((c) => c.kind === 'daemon').map((c) => this.terminate(c, 12_000)));
  }

  /** Kills every child still alive, no questions asked (test teardown, failures). */
  async cleanup(): Promise<void> {
    for (const c of this.children) {
      if (c.exited) continue;
      c.expectedExit = true;
      try {
        process.kill(c.pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
    await Promise.all(this.children.map((c) => c.exit));
  }

  daemons(): ChildHandle[] {
    return this.children.filter((c) => c.kind === 'daemon');
  }
}
