/**
 * A child that is an operating-system process (the daemon's local workers). The process is the
 * unit of isolation: CPU-bound or wedged code in it cannot block the supervisor, and a stop can
 * always be forced with SIGKILL.
 *
 * Outcome mapping:
 * - exit code 0: normal end (a `permanent` policy restarts it, `transient` does not);
 * - non-zero exit, death by a signal, spawn error: rejects with `ProcessExitError` / the error;
 * - after the supervisor's abort: exit code 0, death by `killSignal`, or the conventional
 *   `128 + killSignal` code count as a clean stop; needing SIGKILL is reported as an error, so a
 *   worker that ignores SIGTERM shows up in the shutdown result.
 */
import { spawn, type ChildProcess, type StdioOptions } from 'node:child_process';
import { constants } from 'node:os';
import type { TimerHandle } from '../base/clock.ts';
import type { ChildExit, ChildFactory } from './types.ts';

export interface ProcessChildOptions {
  command: string;
  args?: readonly string[];
  /** Passed to spawn as is; omitted = the parent's environment. */
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  /** Default `'inherit'`: worker logs go to the daemon's stdout/stderr. */
  stdio?: StdioOptions;
  /** Sent first on stop; default `'SIGTERM'`. */
  killSignal?: NodeJS.Signals;
  /** How long after `killSignal` to wait before SIGKILL; default 5000 ms (supervisor's clock). */
  killTimeoutMs?: number;
  /** Called once the process exists, for every generation (e.g. to report the worker's pid). */
  onSpawn?: (pid: number, proc: ChildProcess) => void;
  /** Call `markReady()` as soon as the process is spawned (for `readiness: true` children). */
  readyOnSpawn?: boolean;
  /**
   * Run the process in a process group of its own (default true). A terminal's Ctrl-C and a
   * `kill -- -PGID` signal the whole foreground group: a child in the supervisor's group would
   * get the signal too and stop on its own, ahead of the supervisor's orderly shutdown (a local
   * worker would hand its turns back mid-drain). In its own group it stops when the supervisor
   * says so.
   */
  ownProcessGroup?: boolean;
}

/** A supervised process ended unexpectedly. */
export class ProcessExitError extends Error {
  readonly exitCode: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly pid: number | undefined;

  constructor(message: string, exitCode: number | null, signal: NodeJS.Signals | null, pid: number | undefined) {
    super(message);
    this.name = 'ProcessExitError';
    this.exitCode = exitCode;
    this.signal = signal;
    this.pid = pid;
  }
}

/** A factory that runs `command` as a supervised OS process, one process per generation. */
export function processChild(opts: ProcessChildOptions): ChildFactory<unknown> {
  const killSignal = opts.killSignal ?? 'SIGTERM';
  const killTimeoutMs = opts.killTimeoutMs ?? 5000;
  const signum = constants.signals[killSignal] as number | undefined;
  const label = [opts.command, ...(opts.args ?? [])].join(' ').slice(0, 200);

  return (_ctx, signal, run) =>
    new Promise<ChildExit>((resolve, reject) => {
      if (signal.aborted) return resolve();
      let settled = false;
      let stopping = false;
      let escalated = false;
      let callbackError: unknown = null;
      let killTimer: TimerHandle | null = null;

      const proc = spawn(opts.command, [...(opts.args ?? [])], {
        env: opts.env,
        cwd: opts.cwd,
        stdio: opts.stdio ?? 'inherit',
        detached: opts.ownProcessGroup ?? true,
      });

      const settle = (error: unknown): void => {
        if (settled) return;
        settled = true;
        killTimer?.cancel();
        signal.removeEventListener('abort', onAbort);
        if (error === null) resolve();
        else reject(error);
      };

      const onAbort = (): void => {
        stopping = true;
        if (proc.exitCode !== null || proc.signalCode !== null) return;
        proc.kill(killSignal);
        killTimer = run.clock.setTimeout(() => {
          if (proc.exitCode !== null || proc.signalCode !== null) return;
          escalated = true;
          proc.kill('SIGKILL');
        }, killTimeoutMs);
      };
      signal.addEventListener('abort', onAbort, { once: true });

      proc.once('spawn', () => {
        try {
          if (proc.pid !== undefined) opts.onSpawn?.(proc.pid, proc);
          if (opts.readyOnSpawn) run.markReady();
        } catch (e) {
          // Nothing escapes an event callback: fail this generation and take the process down.
          callbackError = e;
          proc.kill('SIGKILL');
        }
      });

      // Spawn failures (ENOENT, EACCES) emit 'error' and may never emit 'exit'.
      proc.once('error', (err) => settle(err));

      proc.once('exit', (code, sig) => {
        const pid = proc.pid;
        if (callbackError !== null) return settle(callbackError);
        if (escalated) {
          return settle(
            new ProcessExitError(
              `process "${label}" (pid ${pid}) ignored ${killSignal} for ${killTimeoutMs} ms; killed with SIGKILL`,
              code,
              sig,
              pid,
            ),
          );
        }
        const clean = code === 0 || (stopping && (sig === killSignal || (signum !== undefined && code === 128 + signum)));
        if (clean) return settle(null);
        const how = sig ? `was killed by signal ${sig}` : `exited with code ${code}`;
        settle(new ProcessExitError(`process "${label}" (pid ${pid}) ${how}`, code, sig, pid));
      });
    });
}
