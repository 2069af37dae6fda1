/**
 * corral's client, everything an application imports to talk to corral: `connect()` and what its
 * methods take and give. docs/client.md documents each export. Only modules whose declarations
 * are free of Drizzle, pg and pg-boss are named here (src/client/api.ts, src/db/views.ts): the
 * package test fails when a public type reaches those libraries' declarations.
 */
export { connect } from './client.ts';
export {
  DEFAULT_MAX_BUFFERED,
  DEFAULT_WAIT_MS,
  type ActorOptions,
  type CancelResult,
  type ClientDiagnostics,
  type CommittedTurn,
  type ConnectOptions,
  type Corral,
  type EventInput,
  type InputPolicySet,
  type PolicyTargetRef,
  type SendDb,
  type SendOptions,
  type SendResult,
  type SteerResult,
  type TurnEvent,
  type TurnWatch,
  type WaitOptions,
  type WatchEvent,
  type WatchGap,
  type WatchOptions,
} from './api.ts';
export { toActorKey, type ActorRef } from './actor-ref.ts';
export {
  LIVE_EVENT_TYPES,
  type LiveAttempt,
  type LiveChunk,
  type LiveError,
  type LiveEvent,
  type LiveEventType,
  type LiveTurnCommitted,
  type LiveTurnFailed,
  type LiveTurnStarted,
  type LiveWatch,
  type LiveWatchOptions,
} from './live-api.ts';
export { CorralError, FenceRejected, FENCE_REASONS, type ErrorCode, type FenceReason } from '../errors.ts';
export { actorKey, formatActorKey, parseActorKey, type ActorKey } from '../actor-key.ts';
export {
  MAX_IDEMPOTENCY_KEY_LENGTH,
  MAX_SEND_BATCH,
  SEND_ERRORS,
  INPUT_POLICIES,
  AVAILABLE_INPUT_POLICIES,
  type InputPolicy,
  type InputPolicyOptions,
  TURN_CHANNELS,
  TURN_EVENT_KINDS,
  turnChannelOf,
  type TurnEventKind,
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
} from '../db/views.ts';
