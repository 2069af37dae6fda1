/**
 * corral's client, everything an application imports to talk to corral: `connect()` and what its
 * methods take and give. docs/client.md documents each export.
 */
export {
  connect,
  Corral,
  type ActorOptions,
  type CancelResult,
  type ClientDiagnostics,
  type ConnectOptions,
  type EventInput,
  type SendDb,
  type SendOptions,
  type SendResult,
  type SteerResult,
} from './client.ts';
export { toActorKey, type ActorRef } from './actor-ref.ts';
export { DEFAULT_WAIT_MS, type CommittedTurn, type WaitOptions } from './wait.ts';
export { DEFAULT_MAX_BUFFERED, type TurnEvent, type TurnWatch, type WatchEvent, type WatchGap, type WatchOptions } from './watch.ts';
export { CorralError, FenceRejected, FENCE_REASONS, type ErrorCode, type FenceReason } from '../errors.ts';
export { actorKey, formatActorKey, parseActorKey, type ActorKey } from '../actor-key.ts';
export { MAX_IDEMPOTENCY_KEY_LENGTH, MAX_SEND_BATCH, SEND_ERRORS } from '../db/send-event.ts';
export { TURN_CHANNELS, TURN_EVENT_KINDS, turnChannelOf, type TurnEventKind } from '../db/turn-events.ts';
export type { EmittedEntry, TranscriptEntry } from '../db/transcript.ts';
export type { ActorStatus } from '../ops/status.ts';
export type { ActivationView, TurnView } from '../db/actor-views.ts';
export type { DeadLetter, PendingJob } from '../db/boss-jobs.ts';
export type { PgQueryable, SqlAdapter, DrizzleExecutable } from '../db/executor.ts';
export type { MessageRole, TurnStatus } from '../db/schema.ts';
