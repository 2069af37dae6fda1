/**
 * The composed daemon (src/daemon/daemon.ts) behind a `CorralDaemon`, for corral's own tests and tools.
 * Kept out of src/host/daemon.ts so that the package's public declarations never name `Daemon`,
 * whose types would tie an application to pg-boss's and Drizzle's.
 */
import type { Daemon } from '../daemon/daemon.ts';

const cores = new WeakMap<object, () => Daemon | undefined>();

/** Called by the daemon host for each `CorralDaemon` it makes. */
export function registerDaemonInternals(daemon: object, core: () => Daemon | undefined): void {
  cores.set(daemon, core);
}

/** The composed daemon of `daemon` once its `start()` has begun: database, event queue, broker, runtime. */
export function daemonInternals(daemon: object): Daemon | undefined {
  return cores.get(daemon)?.();
}
