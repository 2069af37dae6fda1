/**
 * Crash points for crash tests: a process started with `CORRAL_CRASH_AT=<name>` kills itself with
 * SIGKILL (no cleanup, no flush: a kill -9) the first time it reaches the point of that name, so a
 * test can stop a daemon in a window too short to hit from outside (between a commit and the
 * message that follows it). Unset, a point costs one comparison. Not a setting: nothing but a
 * crash test sets it.
 *
 * The points: `continued-commit` (src/runtime/turn-commit.ts), right after a commit that began
 * next turns is durable and before any of them is sent to its worker; `shard-relay-delivered`
 * (src/runtime/shard-relay.ts), right after a target shard committed cross-shard emits and before
 * the source shard deleted them.
 */
const armed = process.env.CORRAL_CRASH_AT;

export type CrashPoint = 'continued-commit' | 'shard-relay-delivered';

export function crashPoint(name: CrashPoint): void {
  if (armed === name) process.kill(process.pid, 'SIGKILL');
}
