/**
 * `corral`: the package's main entry point, what an application imports to use corral (with
 * `corral/worker` for workers and `corral/testing` for tests): the client (`connect`), the daemon
 * in the application's process (`createDaemon`), actor keys and typed errors. Everything it does
 * not export is internal and may change in any release. docs/client.md and docs/embedding.md
 * document each export.
 */
export {
  connect,
  type Corral,
  toActorKey,
  DEFAULT_WAIT_MS,
  DEFAULT_MAX_BUFFERED,
  MAX_IDEMPOTENCY_KEY_LENGTH,
  MAX_SEND_BATCH,
  SEND_ERRORS,
  TURN_CHANNELS,
  TURN_EVENT_KINDS,
  turnChannelOf,
  type ActorOptions,
  type ActorRef,
  type CancelResult,
  type ClientDiagnostics,
  type CommittedTurn,
  type ConnectOptions,
  type EventInput,
  type SendDb,
  type SendOptions,
  type SendResult,
  type SteerResult,
  type TurnEvent,
  type TurnEventKind,
  type TurnWatch,
  type WaitOptions,
  type WatchEvent,
  type WatchGap,
  type WatchOptions,
  type EmittedEntry,
  type TranscriptEntry,
  type ActorStatus,
  type ActivationView,
  type TurnView,
  type DeadLetter,
  type PendingJob,
  type PgQueryable,
  type SqlAdapter,
  type DrizzleExecutable,
  type MessageRole,
  type TurnStatus,
} from './client/index.ts';
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
export { CorralError, FenceRejected, FENCE_REASONS, type ErrorCode, type FenceReason } from './errors.ts';
export { actorKey, parseActorKey, formatActorKey, isValidActorPart, type ActorKey } from './actor-key.ts';
export type { JsonValue } from './fabric/protocol.ts';
