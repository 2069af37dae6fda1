/**
 * The client's public types: what `connect()` gives and what its methods take and return. Free of
 * the modules that import Drizzle, pg and pg-boss (only src/db/views.ts, the shapes of corral's
 * rows), so that an application's type check never loads those libraries' declarations; the
 * implementation (client.ts, watch.ts, wait.ts) is checked against these by the compiler.
 */
import type { ActorKey } from '../base/actor-key.ts';
import type { Logger } from '../base/logger.ts';
import type {
  ActorStatus,
  OutboxActionResult,
  OutboxListOptions,
  OutboxMessageDetail,
  OutboxPage,
  OutboxTarget,
  SinkRemoval,
  SinkSummary,
  SinkView,
  InputPolicy,
  InputPolicyOptions,
  CommittedTurnView,
  DrizzleExecutable,
  PgQueryable,
  SqlAdapter,
  TranscriptEntry,
  TurnEventKind,
  ApiTokenScope,
  TokenView,
} from '../db/views.ts';
import type { ActorRef } from './actor-ref.ts';

export interface ConnectOptions {
  /** PostgreSQL to use; default `DATABASE_URL`, else the embedded server under `homeDir` (as the CLI). */
  databaseUrl?: string;
  /** corral's folder, where the embedded server lives; default `CORRAL_HOME`, else `.corral`. */
  homeDir?: string;
  /** The actor queue; default `CORRAL_QUEUE`, else `actor-events`. */
  queueName?: string;
  /** pg-boss's schema; default `CORRAL_BOSS_SCHEMA`, else `pgboss`. */
  bossSchema?: string;
  /** Largest event (JSON bytes) `send` takes; default `CORRAL_MAX_EVENT_BYTES`, else 262,144. */
  maxEventBytes?: number;
  /** Where the defaults above are read from; default `process.env`. */
  env?: Record<string, string | undefined>;
  /** Connections of the client's pool (default 4; a watch or wait adds one, shared). */
  maxConnections?: number;
  /** `application_name` of its connections (default `corral-client`). */
  applicationName?: string;
  /** Where the client logs (reconnects, background errors); default: nowhere. */
  logger?: Logger;
  /**
   * How long an actor's turn channel stays registered after the last watch or wait on it ended
   * (default 30,000 ms): a client that watches and waits often does not register again each time.
   */
  watchLingerMs?: number;
}

/** Where a send's statement runs: a node-postgres `Client`/`PoolClient` inside `BEGIN`, a Drizzle transaction, or `{ executeSql }`. */
export type SendDb = PgQueryable | SqlAdapter | DrizzleExecutable;

export interface SendOptions {
  /** Enqueue inside this transaction: rolled back with it, committed with it. Default: the client's own connection, at once. */
  db?: SendDb;
  /** Sending again with this key (per actor and caller, 1–200 characters) enqueues nothing and returns the first event. */
  idempotencyKey?: string;
  /**
   * Whose key `idempotencyKey` is (1–200 characters): two scopes never see each other's events
   * through a key. Default: the SQL role the client connected as. Only corral's own role (the
   * owner of its schema) may name one; another is refused `forbidden`.
   */
  idempotencyScope?: string;
  /**
   * The W3C `traceparent` (and `tracestate`) the event continues: stored with it, sent to the
   * turn's worker (`turn_start.trace`). Default: the active OpenTelemetry span of the caller, when
   * the process set up OpenTelemetry; `null`: none.
   */
  traceparent?: string | null;
  tracestate?: string;
}

export interface SendResult {
  eventId: string;
  /** The idempotency key had enqueued this event already: nothing was enqueued now. */
  duplicate: boolean;
}

export interface EventInput {
  actor: ActorRef;
  data: unknown;
  idempotencyKey?: string;
  /** As `SendOptions.idempotencyScope`. */
  idempotencyScope?: string;
  /** As `SendOptions.traceparent` and `tracestate`. */
  traceparent?: string | null;
  tracestate?: string;
}

export interface SteerResult {
  eventId: string;
  epoch: number;
  /**
   * The turn's new revision. A result of the old revision still commits; the steering input it
   * did not see is then enqueued as the actor's next event (docs/failure-semantics.md).
   */
  revision: number;
}

export interface CancelResult {
  eventId: string;
  epoch: number;
}

export interface ActorOptions {
  /** How many of the latest turns (default 10). */
  turns?: number;
  /** How many pending events at most (default 100). */
  pending?: number;
  /** How many dead letters at most (default 100). */
  deadLetters?: number;
}

export interface ClientDiagnostics {
  /** Connections taken from the pool plus statements on the notification connection, since `connect`. */
  databaseCalls: number;
  /** Turn channels listened on now (and registered: daemons notify them), lingering ones included. */
  listening: number;
  /** Times the notification connection was lost and made again. */
  reconnects: number;
  /** Open watches and waits. */
  watches: number;
  waits: number;
}

/** One turn event of the watched actor. */
import type { LiveWatch, LiveWatchOptions } from '../live/events.ts';

export interface TurnEvent {
  /** `started`: an attempt began; `committed`: its turn is in the transcript; `failed`: the attempt failed and will be retried; `dead_lettered`: its retries are spent; `cancelled`: `cancel` ended it. */
  kind: TurnEventKind;
  actor: ActorKey;
  eventId: string;
  /** The actor's epoch the attempt ran under. */
  epoch: number;
  /** The attempt (1 for the first). */
  attempt: number;
  /** When this process heard of it. */
  receivedAt: Date;
}

/** W2, W3: events in [since, until] may have been missed. */
export interface WatchGap {
  kind: 'gap';
  reason: 'reconnected' | 'overflow';
  since: Date;
  until: Date;
}

export type WatchEvent = TurnEvent | WatchGap;

export interface WatchOptions {
  /** Ends the watch (the iterator finishes). */
  signal?: AbortSignal;
  /** W3: most events held for a slow consumer (default 10,000). */
  maxBuffered?: number;
}

/** An actor's turn events: `for await (const e of watch) …`; `close()` ends it. */
export interface TurnWatch extends AsyncIterable<WatchEvent>, AsyncIterator<WatchEvent> {
  readonly actor: ActorKey;
  close(): Promise<void>;
}

export const DEFAULT_MAX_BUFFERED = 10_000;

/** The committed turn of an event. */
export type CommittedTurn = CommittedTurnView;

export interface WaitOptions {
  /** How long to wait, in ms (default 60,000; at most 2,147,483,647). */
  timeoutMs?: number;
  /** Rejects the wait with `aborted`. */
  signal?: AbortSignal;
}

export const DEFAULT_WAIT_MS = 60_000;

/** An agent (every session of it): `'support-bot'`, `{ agentUid }`; or one actor: `'support-bot/s-42'`, `{ agentUid, sessionId }`. */
export type PolicyTargetRef = string | { agentUid: string; sessionId?: string | null | undefined };

export interface InputPolicySet {
  /** `agent` or `agent/session`. */
  target: string;
  policy: InputPolicy;
  /** A batching policy's options as stored (absent ones take the default). */
  options: InputPolicyOptions;
  /** The policy it replaced; null when the target had none of its own. */
  previous: InputPolicy | null;
}

/** A webhook sink to add (`corral sinks add`). */
export interface SinkInput {
  /** 1-64 characters of A-Z a-z 0-9 . _ - */
  name: string;
  /** Where messages are POSTed: http or https, no user or password in it. */
  url: string;
  /** A Standard Webhooks secret (`whsec_` and base64); one is made when absent. */
  secret?: string;
  /** The longest wait for an answer: a duration (`'5s'`) or milliseconds, 100 ms to 10 min (default 10 s). */
  timeout?: string | number;
  /** Messages sent to it at once, 1 to 64 (default 4). */
  concurrency?: number;
  /**
   * The agents whose turns may deliver to it: agent_uids, or prefixes ending in `*` (as a worker
   * key's scope); a result of another agent's turn delivering to it is refused `deliver_forbidden`.
   * Default: every agent.
   */
  agents?: string[];
  /** Let `url` point at a loopback, private or link-local address (refused by default, at add and at every connect). */
  allowPrivate?: boolean;
}

/** A new signing secret for a sink (`corral sinks rotate-secret`). */
export interface SinkRotation {
  /** The new secret (`whsec_` and base64); one is made when absent. */
  secret?: string;
  /** How long the old secret signs too (after the new one): a duration (`'24h'`), milliseconds, or 0; default 24 h, at most 30 days. */
  overlap?: string | number;
}

/** `corral.sinks`: the webhook sinks turns deliver to (what `corral sinks` does). */
export interface SinksApi {
  /** Adds a sink; resolves to it with its secret (hand that to the receiver). `already_exists` for a taken name. */
  add(input: SinkInput): Promise<SinkView & { secret: string }>;
  /** Every sink, by name, with its pending and dead messages counted; never a secret. */
  list(): Promise<SinkSummary[]>;
  /** Removes a sink and its messages; `invalid_argument` while some are pending unless `force`, `not_found` when there is none. */
  remove(name: string, opts?: { force?: boolean }): Promise<SinkRemoval>;
  /** Enables a sink again after its receiver answered 410 Gone. */
  enable(name: string): Promise<SinkView>;
  /**
   * A new signing secret; resolves to the sink with it (hand it to the receiver). During the
   * overlap requests are signed with both secrets, new first; pending messages are kept.
   * `not_found` when there is no such sink.
   */
  rotateSecret(name: string, rotation?: SinkRotation): Promise<SinkView & { secret: string }>;
}

/** What `tokens.create` takes. */
export interface TokenInput {
  /** 1-64 characters of A-Z a-z 0-9 . _ - (never reused); default a generated one (`tok_…`). */
  name?: string;
  /** What it may do: `read` (transcripts, event states, streams), `send` (events); at least one. */
  scopes: readonly ApiTokenScope[];
  /**
   * The actors it may touch: `agent_uid/session_id` patterns, either part exact or a prefix ending
   * in `*` (`tenant-a/*`, `chat/s42`); default every actor. A request outside them is answered 404.
   */
  actors?: readonly string[];
  /** How long it lasts: a duration (`'1h'`) or milliseconds, 1 s to 10 years; default until revoked. */
  ttl?: string | number;
}

/**
 * `corral.tokens`: the bearer tokens of the HTTP API (what `corral tokens` does). An application's
 * backend mints a short-lived token for one end user's session and hands it to their browser.
 */
export interface TokensApi {
  /** Makes a token; resolves to it, with the token's text (shown only now). `already_exists` for a taken name. */
  create(input: TokenInput): Promise<TokenView & { token: string }>;
  /** Every token, revoked and expired ones included; never a token's text. */
  list(): Promise<TokenView[]>;
  /** Revokes a token: it never authorizes again, its streams end within 15 s. `not_found` when there is none. */
  revoke(name: string): Promise<{ name: string; revokedAt: string; alreadyRevoked: boolean }>;
}

/** `corral.outbox`: the messages turns delivered (what `corral outbox` does). */
export interface OutboxApi {
  /** A page of messages, newest first; pass its `next` as `before` for the next one. */
  list(opts?: OutboxListOptions): Promise<OutboxPage>;
  /** One message with its body as sent; `not_found` when there is none. */
  show(id: number): Promise<OutboxMessageDetail>;
  /** Sends dead or discarded messages again, with their webhook-id: by `ids`, or every one a query matches with `all: true`. */
  replay(target: OutboxTarget): Promise<OutboxActionResult>;
  /** Gives up on pending or dead messages (a replay can take them back): by `ids`, or with `all: true`. */
  discard(target: OutboxTarget): Promise<OutboxActionResult>;
}

/**
 * A connection to corral's database: `const corral = await connect()`. Every method is safe to
 * call concurrently; `close()` ends it.
 */
export interface Corral {
  /** The database URL in use (the embedded server's when no `databaseUrl` was given). */
  readonly databaseUrl: string;
  /** Enqueues one event for `actor`; resolves once it is written (committed, or in `opts.db`'s transaction). */
  send(actor: ActorRef, data: unknown, opts?: SendOptions): Promise<SendResult>;
  /** Enqueues events (any actors) in one statement, in array order; the results in the same order. */
  sendMany(events: readonly EventInput[], opts?: Pick<SendOptions, 'db'>): Promise<SendResult[]>;
  /** The committed transcript of `actor`: its turns in order, each with its messages. */
  transcript(actor: ActorRef): Promise<TranscriptEntry[]>;
  /** What `corral actor` shows: activation, pending events, latest turns (with what each delivered), dead letters. */
  actor(actor: ActorRef, opts?: ActorOptions): Promise<ActorStatus>;
  /** The webhook sinks: add, list, remove, enable. */
  readonly sinks: SinksApi;
  /** The outbox: list, show, replay, discard. */
  readonly outbox: OutboxApi;
  /** The HTTP API's tokens: create (scoped to actors, short-lived), list, revoke. */
  readonly tokens: TokensApi;
  /**
   * Sets what an event sent while the actor is busy does, for an agent (every session) or one actor
   * (which wins over its agent's): `queue`; `coalesce` (a turn takes every event waiting, in order,
   * bounded and optionally debounced by `options`); or `reject` (`send` then fails with
   * `actor_busy` and enqueues nothing). Decides the sends after it; events already sent are not touched.
   */
  setInputPolicy(target: PolicyTargetRef, policy: InputPolicy, options?: InputPolicyOptions): Promise<InputPolicySet>;
  /** Removes the target's own policy (its agent's, else the default, applies again); resolves to the one it had, `nothing_matched` when none. */
  clearInputPolicy(target: PolicyTargetRef): Promise<InputPolicy>;
  /** Steers the live turn of `actor` (`not_found` when none runs); `data` is at most 6,900 bytes of JSON. */
  steer(actor: ActorRef, data: unknown): Promise<SteerResult>;
  /** Cancels the live turn of `actor` (`not_found` when none runs): the actor moves on to its next event. */
  cancel(actor: ActorRef, reason?: string): Promise<CancelResult>;
  /** The committed turn of `eventId`, once it committed; rejects `dead_lettered`, `cancelled`, `not_found`, `timeout`, `aborted`, `closed`. */
  waitForTurn(eventId: string, opts?: WaitOptions): Promise<CommittedTurn>;
  /**
   * The live stream of `actor` (src/live/events.ts): each turn's start, the chunks its worker
   * streams, then its commit or failure, from now on or from `lastEventId`; resolves once it listens.
   */
  watch(actor: ActorRef, opts?: LiveWatchOptions): Promise<LiveWatch>;
  /** Just the turn events of `actor` (started, committed, failed …) from now on, without reading any row; resolves once it listens (nothing committed after that is missed). */
  watchTurns(actor: ActorRef, opts?: WatchOptions): Promise<TurnWatch>;
  diagnostics(): ClientDiagnostics;
  /** Ends every watch, rejects every wait (`closed`), closes the connections. Idempotent. */
  close(): Promise<void>;
}
