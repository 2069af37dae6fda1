/**
 * Stopping with the process that started us, where that process is the one a user or a process
 * manager holds on to:
 * - `npx corral daemon` runs the daemon under `sh -c` under npm: a SIGTERM to npm ends npm and
 *   the shell but never reaches the daemon, which would keep running and hold the port;
 * - a local worker of `corral daemon --workers N` must not outlive its daemon killed with -9.
 * Node has no parent-death signal, so the parent pid is polled: when it changes, the parent is
 * gone (we were re-parented). A process started directly (`nohup corral daemon &`) is not
 * watched and outlives its shell as usual.
 */

import { STOP_WITH_PARENT_ENV } from '../base/defaults.ts';

export { STOP_WITH_PARENT_ENV };

/** Why this process should stop with its parent, or undefined. */
export function parentWatchReason(env: NodeJS.ProcessEnv, role: 'daemon' | 'worker'): string | undefined {
  if (env[STOP_WITH_PARENT_ENV] === '1') return 'started by a corral daemon';
  if (role === 'daemon' && env.npm_command) return `started by npm ${env.npm_command}`;
  return undefined;
}

/** Calls `onGone` once when the parent process is gone; returns a function that stops watching. */
export function watchParent(onGone: () => void, intervalMs = 500): () => void {
  const parent = process.ppid;
  const timer = setInterval(() => {
    if (process.ppid !== parent) {
      clearInterval(timer);
      onGone();
    }
  }, intervalMs);
  timer.unref();
  return () => clearInterval(timer);
}
