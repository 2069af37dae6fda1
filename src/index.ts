/**
 * `corral`: the package's main entry point, what an application imports to use corral (with
 * `corral/worker` for workers and `corral/testing` for tests): the client (`connect`, and the
 * actor keys and typed errors its methods take and throw: src/client/index.ts), the daemon in the
 * application's process (`createDaemon`). Everything it does not export is internal and may
 * change in any release. docs/client.md and docs/embedding.md document each export.
 */
export * from './client/index.ts';
export {
  createDaemon,
  localWorkerId,
  type CorralDaemon,
  type DaemonOptions,
  type DaemonState,
  type LocalWorkersOptions,
  type StopDaemonOptions,
  type Config,
  type DeadLetterMode,
  type Logger,
} from './host/daemon.ts';
export { isValidActorPart } from './base/actor-key.ts';
export type { JsonValue } from './fabric/protocol.ts';
