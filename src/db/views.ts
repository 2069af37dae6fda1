/**
 * The shapes corral's reads return and the values an application sees (statuses, roles, job
 * states, turn channels, send limits), free of Drizzle, pg and pg-boss: the package's public
 * declarations name these, so an application's type check never loads those libraries' types.
 * The modules that read the rows (transcript.ts, actor-views.ts, boss-jobs.ts, event-status.ts,
 * ops/status.ts) and the schema re-export them.
 */
import { createHash } from 'node:crypto';
import type { ActorKey } from '../base/actor-key.ts';
import type { InputPolicy } from '../base/defaults.ts';
import type { ErrorCode } from '../base/errors.ts';

export {
  AVAILABLE_INPUT_POLICIES,
  BATCHING_POLICIES,
  DEFAULT_BATCH_EVENTS,
  INPUT_POLICIES,
  MAX_BATCH_EVENTS,
  MAX_DEBOUNCE_MS,
  type InputPolicy,
} from '../base/defaults.ts';

export const ACTIVATION_LIVE = ['starting', 'active', 'draining'] as const;
export const ACTIVATION_STATUSES = [...ACTIVATION_LIVE, 'stopped', 'failed'] as const;
export type ActivationStatus = (typeof ACTIVATION_STATUSES)[number];

/**
 * A batching input policy's options (`coalesce`): each absent one takes its default. `debounceMs`:
 * an idle actor's turn begins once no new event came for this long; `maxWaitMs`: but no later
 * than this after the first event waiting; `maxEvents` (1-100, default 20) and `maxBytes` (of
 * the events' JSON; default what a turn_start holds): the most one turn takes.
 */
export interface InputPolicyOptions {
  debounceMs?: number;
  maxWaitMs?: number;
  maxEvents?: number;
  maxBytes?: number;
}

export const TURN_STATUSES = ['started', 'succeeded', 'failed', 'cancelled', 'interrupted'] as const;
export type TurnStatus = (typeof TURN_STATUSES)[number];

export const MESSAGE_ROLES = ['user', 'assistant', 'tool'] as const;
export type MessageRole = (typeof MESSAGE_ROLES)[number];

/** The longest idempotency key a send takes (characters). */
export const MAX_IDEMPOTENCY_KEY_LENGTH = 200;

export const JOB_STATE = {
  created: 'created',
  retry: 'retry',
  active: 'active',
  completed: 'completed',
  cancelled: 'cancelled',
  failed: 'failed',
} as const;
export type JobState = (typeof JOB_STATE)[keyof typeof JOB_STATE];

export const TURN_EVENT_KINDS = ['started', 'committed', 'failed', 'dead_lettered', 'cancelled'] as const;
export type TurnEventKind = (typeof TURN_EVENT_KINDS)[number];

/** T1: the channels' common prefix; a channel is this and one hex digit. */
export const TURN_CHANNEL_PREFIX = 'corral_turns_';
/** Every turn channel (16). */
export const TURN_CHANNELS: readonly string[] = [...'0123456789abcdef'].map((h) => `${TURN_CHANNEL_PREFIX}${h}`);

/** T1: the channel of an actor's turn events. */
export function turnChannelOf(actor: string): string {
  return `${TURN_CHANNEL_PREFIX}${createHash('md5').update(actor).digest('hex')[0]}`;
}

/** Most events one `send_events` call (`sendMany`) takes. */
export const MAX_SEND_BATCH = 1_000;

/** The SQLSTATEs the functions raise, and the error code each means. */
export const SEND_ERRORS: Readonly<Record<string, ErrorCode>> = {
  CR400: 'invalid_argument',
  CR401: 'invalid_actor_key',
  CR403: 'forbidden',
  CR409: 'idempotency_conflict',
  CR413: 'payload_too_large',
  CR421: 'wrong_shard',
  CR423: 'actor_busy',
};

/** A node-postgres `Client`, `PoolClient` or `Pool` (anything with pg's `query(text, values)`). */
export interface PgQueryable {
  query(text: string, values?: unknown[]): PromiseLike<unknown>;
}

/** An adapter in pg-boss's shape: runs `text` with `$1`… bound to `values`, resolves to `{ rows }` or the rows. */
export interface SqlAdapter {
  executeSql(text: string, values?: unknown[]): PromiseLike<unknown>;
}

/** A Drizzle database or transaction, of any schema (its `execute` takes a `sql` fragment). */
export interface DrizzleExecutable {
  execute(query: never): PromiseLike<unknown>;
}

/** Where a caller's statement can run. */
export type StatementTarget = PgQueryable | SqlAdapter | DrizzleExecutable;

export interface TranscriptEntry {
  turnId: string;
  eventId: string;
  status: TurnStatus;
  actorEpoch: number;
  revision: number;
  startedAt: Date;
  finishedAt: Date | null;
  messages: { seq: number; role: MessageRole; content: unknown; createdAt: Date }[];
  /** The events the turn emitted with its commit, if any. */
  emitted: EmittedEntry[];
  /** Why a `cancelled` turn was cancelled (its only message is the event's `user` message). */
  cancelReason?: string;
}

export interface EmittedEntry {
  event_id: string;
  actor: string;
  data: unknown;
  delay_ms?: number;
  steer_revision?: number;
}

export interface ActivationView {
  activationUid: string;
  epoch: number;
  status: ActivationStatus;
  revision: number;
  leaseExpiresAt: Date;
  /** `lease_expires_at > now()` by PostgreSQL's clock. */
  leaseAlive: boolean;
  ownerId: string;
  currentEventId: string | null;
  /** Why a non-live activation ended (`turn_error`, `lease_expired`, `idle`, `cancelled`, …). */
  endReason: string | null;
  createdAt: Date;
}

export interface TurnView {
  turnId: string;
  eventId: string;
  attempt: number;
  status: TurnStatus;
  epoch: number;
  revision: number;
  workerId: string | null;
  error: unknown;
  /** The events the turn emitted with its commit (`[{ event_id, actor, data, delay_ms? }]`), or null. */
  emitted: unknown;
  startedAt: Date;
  finishedAt: Date | null;
  /** The attempt's W3C traceparent: its daemon span when traced, else the event's own context; null without either. */
  traceparent: string | null;
}

/** A dead-lettered event: the copy pg-boss made in the dead-letter queue. */
export interface DeadLetter {
  /** The copy's job id in the dead-letter queue (what `corral dlq show/replay/discard` take). */
  id: string;
  /** The original event id (= the original job id, a UUIDv7). */
  eventId: string;
  agentUid: string;
  sessionId: string;
  /** The actor key text, `agent_uid/session_id` (the job's singletonKey). */
  actor: string;
  payload: unknown;
  /** The copy's whole job data (`{ agentUid, sessionId, payload, enqueuedAt }`), re-sent on replay. */
  data: Record<string, unknown>;
  /** When the original event was enqueued. */
  enqueuedAt: Date | null;
  /** When it was dead-lettered (the copy's creation). */
  failedAt: Date;
  /** Attempts the original made (its retry count + 1). */
  attempts: number;
  /** The original's last output: `{ error: { code, message }, kind }`. */
  lastError: unknown;
}

export interface PendingJob {
  id: string;
  state: JobState;
  retryCount: number;
  createdOn: Date;
  startAfter: Date;
  payload: unknown;
}

/** The committed turn of an event: its messages and what it emitted. */
export interface CommittedTurnView {
  eventId: string;
  actor: ActorKey;
  turnId: string;
  actorEpoch: number;
  attempt: number;
  workerId: string | null;
  startedAt: Date;
  finishedAt: Date;
  messages: { seq: number; role: MessageRole; content: unknown; createdAt: Date }[];
  /** The worker's `output`, if it gave one. */
  output: unknown;
  emitted: EmittedEntry[];
}

export interface ActorStatus {
  actor: string;
  known: boolean;
  epochCounter: number;
  blockedByEventId: string | null;
  /** What an event sent to it while it is busy does (src/db/enqueue/input-policies.ts, P1). */
  inputPolicy: { policy: InputPolicy; options: InputPolicyOptions; from: 'actor' | 'agent' | 'default' };
  activation: ActivationView | null;
  pendingEvents: PendingJob[];
  /** Each with what it delivered (its outbox messages, in order) and how their delivery stands. */
  recentTurns: (TurnView & { delivered: TurnDelivery[] })[];
  deadLetters: DeadLetter[];
}

/** States of an outbox message: waiting to be sent (or being sent), received, given up on, dropped by an operator. */
export const OUTBOX_STATES = ['pending', 'delivered', 'dead', 'discarded'] as const;
export type OutboxState = (typeof OUTBOX_STATES)[number];

/** A webhook sink as shown: everything but its secret. */
export interface SinkView {
  name: string;
  url: string;
  timeoutMs: number;
  concurrency: number;
  /** The agents whose turns may deliver to it (agent_uids, or prefixes ending in `*`); null: every agent. */
  agents: string[] | null;
  /** Whether its URL may point inside (loopback, private, link-local …): `--allow-private`. */
  allowPrivate: boolean;
  /** While a rotation's overlap lasts: when the previous secret stops signing; else null. */
  previousSecretUntil: string | null;
  /** Set when its receiver answered 410 Gone (its messages wait until `corral sinks enable`). */
  disabledAt: string | null;
  disabledReason: string | null;
  createdAt: string;
}

/** A sink in a list, with how many of its messages wait and how many are dead. */
export interface SinkSummary extends SinkView {
  pending: number;
  dead: number;
}

/** What removing a sink did: the messages it still had went with it. */
export interface SinkRemoval {
  name: string;
  /** Its messages still pending when it went (0 unless forced). */
  pendingDropped: number;
  /** All its messages, of every state, removed with it. */
  messagesRemoved: number;
}

/** What one turn delivered: one message and how its delivery stands. */
export interface TurnDelivery {
  id: number;
  sink: string;
  webhookId: string;
  state: OutboxState;
  /** Attempts made (claims, the one in flight included). */
  attempts: number;
  /** The last answer's HTTP status; null before any, or for a timeout or connection error. */
  lastStatus: number | null;
  lastError: string | null;
  /** When a pending message is tried next. */
  nextAttemptAt: string;
  deliveredAt: string | null;
}

/** An outbox message as operators see it (`corral outbox list`); `show` adds the body. */
export interface OutboxMessage extends TurnDelivery {
  /** `agent_uid/session_id` of the actor whose turn delivered it. */
  actor: string;
  turnId: string;
  eventId: string;
  /** Its place in the result's `deliver` (0-based). */
  position: number;
  /** The sender holding it now, and until when (a pending message being sent). */
  claimedBy: string | null;
  claimedUntil: string | null;
  createdAt: string;
}

/** One message with its body, exactly as POSTed. */
export interface OutboxMessageDetail extends OutboxMessage {
  body: string;
}

/** Which outbox messages: every filter given holds. */
export interface OutboxQuery {
  /** Any of these states (default: any state). */
  states?: readonly OutboxState[];
  sink?: string;
  /** One actor: `agent_uid/session_id` or `{ agentUid, sessionId }`. */
  actor?: string | ActorKey;
  /** Every session of one agent. */
  agent?: string;
}

export interface OutboxListOptions extends OutboxQuery {
  /** At most this many, newest first (default 50, at most 1,000). */
  limit?: number;
  /** Only messages with a lower id: the `next` of the page before. */
  before?: number;
}

export interface OutboxPage {
  messages: OutboxMessage[];
  /** The `before` of the next page; null when this one is the last. */
  next: number | null;
}

/** Which messages a replay or discard takes: these ids, or (`all: true`) every one the query matches. */
export type OutboxTarget = { ids: readonly number[] } | (OutboxQuery & { all: true });

export interface OutboxActionResult {
  action: 'replay' | 'discard';
  /** The messages replayed (pending again) or discarded. */
  done: number[];
  /** Named messages left as they were: in a state the action does not take. */
  skipped: { id: number; state: OutboxState }[];
  /** Named messages that do not exist. */
  notFound: number[];
  /** Disabled sinks of replayed messages: those wait until `corral sinks enable`. */
  disabledSinks: string[];
}

/**
 * What an API token may do: `read` (transcripts, event states, streams), `send` (events), `admin`
 * (the operator console at `/console`, src/http/console/: every actor, and the operators' actions).
 */
export const API_TOKEN_SCOPES = ['read', 'send', 'admin'] as const;
export type ApiTokenScope = (typeof API_TOKEN_SCOPES)[number];

/** An API token as `corral tokens list` and `corral.tokens.list()` show it: never its text. */
export interface TokenView {
  name: string;
  scopes: ApiTokenScope[];
  /** The actors it may touch (patterns such as `tenant-a/*`); null: every actor. */
  actors: string[] | null;
  /** When it stops authorizing; null: never. */
  expiresAt: string | null;
  createdAt: string;
  lastUsedAt: string | null;
  revokedAt: string | null;
}
