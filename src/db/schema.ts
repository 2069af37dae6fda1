/**
 * The Drizzle schema of corral's own tables (schema `corral`). pg-boss owns and migrates its own
 * schema; it is never modelled here.
 *
 * Two families:
 *  - durable agent state: actors (the durable epoch counter), conversations, turns, messages;
 *  - runtime projections: activations, deliveries, workers, daemons. They can be rebuilt or failed on
 *    recovery; nothing that must survive lives only in them;
 *  - idempotency keys of enqueued events (src/db/enqueue/send-event.ts), kept while their event's job is;
 *  - the turn channels watched now (src/db/turns/turn-events.ts): turn events are notified only on those;
 *  - per-agent transcript retention (src/db/operations/transcript-retention.ts): without a row, an agent's
 *    transcript is kept forever.
 *
 * Invariants enforced by the database itself:
 *  I1 at most one live activation per actor key (partial unique index `activations_one_live`).
 *  I2 `actors.epoch_counter` only grows; a new activation takes `epoch_counter + 1`.
 *  I3' at most one succeeded turn per event (partial unique index `turns_one_success_per_event`).
 *  D1 at most one live delivery per event (partial unique index `deliveries_one_live_per_event`).
 */
import { sql, bigint, bigserial, boolean, check, index, integer, jsonb, primaryKey, text, uniqueIndex, uuid, type SQL } from './orm.ts';
import {
  ACTIVATION_LIVE,
  ACTIVATION_STATUSES,
  BATCHING_POLICIES,
  INPUT_POLICIES,
  MAX_BATCH_EVENTS,
  MAX_DEBOUNCE_MS,
  TURN_STATUSES,
  MESSAGE_ROLES,
  MAX_IDEMPOTENCY_KEY_LENGTH,
  OUTBOX_STATES,
} from './views.ts';
import { ACTOR_PART } from '../base/actor-key.ts';
import { MAX_TRACESTATE_LENGTH, STORED_TRACEPARENT_PATTERN, TRACESTATE_PATTERN } from '../base/trace-context.ts';

import { corral, tz } from './schema-base.ts';

export { corral };
export * from './schema-shards.ts';
export * from './schema-tokens.ts';

export { ACTIVATION_LIVE, ACTIVATION_STATUSES, TURN_STATUSES, MESSAGE_ROLES, MAX_IDEMPOTENCY_KEY_LENGTH } from './views.ts';
/** Activations that ended. */
export const ACTIVATION_ENDED = ['stopped', 'failed'] as const;
export type { ActivationStatus, TurnStatus, MessageRole } from './views.ts';
/** Turns that finished (every status but `started`). */
export const TURN_FINISHED = ['succeeded', 'failed', 'cancelled', 'interrupted'] as const;

export const DELIVERY_LIVE = ['created', 'sent', 'accepted'] as const;
/** Live deliveries their worker has not (yet, durably) accepted. */
export const DELIVERY_UNACCEPTED = ['created', 'sent'] as const;
export const DELIVERY_FINISHED = ['completed', 'failed', 'send_failed', 'superseded'] as const;
export const DELIVERY_STATES = [...DELIVERY_LIVE, ...DELIVERY_FINISHED] as const;
export type DeliveryState = (typeof DELIVERY_STATES)[number];

export const WORKER_STATUSES = ['ready', 'stale', 'gone'] as const;
export type WorkerStatus = (typeof WORKER_STATUSES)[number];

const listText = (values: readonly string[]) => `(${values.map((v) => `'${v.replaceAll("'", "''")}'`).join(', ')})`;

/** `('a', 'b')`: one of the state lists above as a SQL list, for statements written as text. */
export const sqlList = (values: readonly string[]) => sql.raw(listText(values));

/**
 * `now()` less `seconds`, written as a literal interval: a generic plan (daemon connections,
 * src/db/client.ts) estimates a parameter's cutoff at a third of the table and reads it all; with
 * the literal the planner sees how few rows are past it and walks the index on that column.
 */
export function ageCutoff(seconds: number) {
  if (!Number.isInteger(seconds) || seconds < 0) throw new Error(`an age in whole seconds, not ${seconds}`);
  return sql.raw(`now() - interval '${seconds} seconds'`);
}

/**
 * `(condition) is true`: the same condition (in a WHERE clause NULL is false either way), written
 * so that no partial index can be chosen for it. For a state checked on a row the statement reaches
 * by its key: after an ANALYZE of a finished history (every activation stopped, every delivery
 * completed) a partial index on live rows is estimated at one row, and the planner then walks it
 * with a filter on the key instead of probing the key's index, reading every live row per row
 * written (test/db/turn-path-plans.test.ts).
 */
export const onKeyedRow = (condition: SQL) => sql`(${condition}) is true`;

const inList = (col: string, values: readonly string[]) => sql.raw(`${col} in ${listText(values)}`);

/** One row per actor key ever seen. Holds the durable epoch counter (I2). */
export const actors = corral.table(
  'actors',
  {
    agentUid: text('agent_uid').notNull(),
    sessionId: text('session_id').notNull(),
    epochCounter: bigint('epoch_counter', { mode: 'number' }).notNull().default(0),
    /** Set while the actor is held by a dead-lettered event (dead-letter mode `block`). */
    blockedByEventId: uuid('blocked_by_event_id'),
    createdAt: tz('created_at').notNull().defaultNow(),
    updatedAt: tz('updated_at').notNull().defaultNow(),
  },
  (t) => [
    primaryKey({ columns: [t.agentUid, t.sessionId] }),
    check('actors_epoch_nonneg', sql`${t.epochCounter} >= 0`),
    // the console's keyset pages (src/db/operations/console-actors.ts): byte order, whatever the database's collation
    index('actors_console').on(sql`agent_uid collate "C"`, sql`session_id collate "C"`),
    index('actors_console_blocked')
      .on(sql`agent_uid collate "C"`, sql`session_id collate "C"`)
      .where(sql.raw('blocked_by_event_id is not null')),
  ],
);

export const conversations = corral.table(
  'conversations',
  {
    id: uuid('id').primaryKey(),
    agentUid: text('agent_uid').notNull(),
    sessionId: text('session_id').notNull(),
    /** Next message position; messages are numbered 1, 2, 3 … within a conversation. */
    nextSeq: integer('next_seq').notNull().default(1),
    /** The highest seq transcript retention deleted (src/db/operations/transcript-retention.ts), 0 when none: all at or below it are gone. */
    prunedThrough: integer('pruned_through').notNull().default(0),
    createdAt: tz('created_at').notNull().defaultNow(),
    updatedAt: tz('updated_at').notNull().defaultNow(),
  },
  (t) => [uniqueIndex('conversations_actor').on(t.agentUid, t.sessionId)],
);

/** One row per attempt to process an actor event (one per delivery). */
export const turns = corral.table(
  'turns',
  {
    id: uuid('id').primaryKey(),
    conversationId: uuid('conversation_id')
      .notNull()
      .references(() => conversations.id),
    eventId: uuid('event_id').notNull(),
    deliveryId: uuid('delivery_id').notNull(),
    status: text('status', { enum: TURN_STATUSES }).notNull(),
    /** The fence this turn was (or is being) processed under. */
    activationUid: uuid('activation_uid').notNull(),
    actorEpoch: bigint('actor_epoch', { mode: 'number' }).notNull(),
    revision: integer('revision').notNull(),
    attempt: integer('attempt').notNull(),
    workerId: text('worker_id'),
    /** The event payload this turn processed (becomes the turn's `user` message on commit). */
    input: jsonb('input'),
    error: jsonb('error'),
    output: jsonb('output'),
    /** The events this turn emitted (enqueued with its commit): `[{ event_id, actor, data, delay_ms? }]`. */
    emitted: jsonb('emitted'),
    /** Steering inputs applied to this turn, in order: `[{ revision, input }]` (see docs/protocol.md §9). */
    steers: jsonb('steers'),
    /**
     * The events this turn took after its own (`event_id`), in order, when it took a batch (input policy `coalesce`,
     * src/db/turns/batches.ts): `[{ event_id, data, enqueued_at }]`, each a `user` message after the turn's own; null for one.
     */
    coalesced: jsonb('coalesced'),
    /** This attempt's W3C traceparent: the daemon's span when it traces, else the event's (docs/observability.md). */
    traceparent: text('traceparent'),
    startedAt: tz('started_at').notNull().defaultNow(),
    finishedAt: tz('finished_at'),
  },
  (t) => [
    uniqueIndex('turns_delivery').on(t.deliveryId),
    check('turns_traceparent', sql.raw(`traceparent is null or traceparent ~ '${STORED_TRACEPARENT_PATTERN.source}'`)),
    uniqueIndex('turns_one_success_per_event')
      .on(t.eventId)
      .where(sql`status = 'succeeded'`),
    index('turns_conversation').on(t.conversationId, t.startedAt),
    index('turns_started')
      .on(t.startedAt)
      .where(sql`status = 'started'`),
    // transcript retention: a conversation's finished turns by age (src/db/operations/transcript-retention.ts)
    index('turns_ended').on(t.conversationId, t.finishedAt).where(inList('status', TURN_FINISHED)),
    // the committed turn of an event it took as part of a batch (src/db/turns/event-status.ts)
    index('turns_coalesced_succeeded')
      .using('gin', sql`${t.coalesced} jsonb_path_ops`)
      .where(sql`status = 'succeeded' and coalesced is not null`),
    check('turns_status', inList('status', TURN_STATUSES)),
  ],
);

export const messages = corral.table(
  'messages',
  {
    id: bigserial('id', { mode: 'number' }).primaryKey(),
    conversationId: uuid('conversation_id')
      .notNull()
      .references(() => conversations.id),
    turnId: uuid('turn_id')
      .notNull()
      .references(() => turns.id),
    seq: integer('seq').notNull(),
    role: text('role', { enum: MESSAGE_ROLES }).notNull(),
    content: jsonb('content').notNull(),
    createdAt: tz('created_at').notNull().defaultNow(),
  },
  (t) => [
    uniqueIndex('messages_conversation_seq').on(t.conversationId, t.seq),
    index('messages_turn').on(t.turnId),
    check('messages_role', inList('role', MESSAGE_ROLES)),
  ],
);

/** A lease on an actor: who may run its turns, under which epoch, until when. */
export const activations = corral.table(
  'activations',
  {
    activationUid: uuid('activation_uid').primaryKey(),
    agentUid: text('agent_uid').notNull(),
    sessionId: text('session_id').notNull(),
    actorEpoch: bigint('actor_epoch', { mode: 'number' }).notNull(),
    leaseId: uuid('lease_id').notNull(),
    leaseExpiresAt: tz('lease_expires_at').notNull(),
    /** The daemon instance that holds the lease. */
    ownerId: text('owner_id').notNull(),
    currentEventId: uuid('current_event_id'),
    revision: integer('revision').notNull().default(0),
    status: text('status', { enum: ACTIVATION_STATUSES }).notNull(),
    endReason: text('end_reason'),
    createdAt: tz('created_at').notNull().defaultNow(),
    updatedAt: tz('updated_at').notNull().defaultNow(),
    endedAt: tz('ended_at'),
  },
  (t) => [
    uniqueIndex('activations_one_live').on(t.agentUid, t.sessionId).where(inList('status', ACTIVATION_LIVE)),
    index('activations_live_lease').on(t.leaseExpiresAt).where(inList('status', ACTIVATION_LIVE)),
    index('activations_actor_epoch').on(t.agentUid, t.sessionId, t.actorEpoch),
    // the watchdog's idle stop (src/db/turns/activations.ts stopIdleActivations) reads only the warm
    // activations idle long enough, not every warm one
    index('activations_idle')
      .on(t.updatedAt)
      .where(sql.raw(`status in ${listText(ACTIVATION_LIVE)} and current_event_id is null`)),
    // the pruning of ended activations (src/db/operations/runtime-pruning.ts)
    index('activations_ended').on(t.endedAt).where(inList('status', ACTIVATION_ENDED)),
    check('activations_status', inList('status', ACTIVATION_STATUSES)),
  ],
);

/** One worker execution of exactly one actor event, carrying the fence copied from its activation. */
export const deliveries = corral.table(
  'deliveries',
  {
    deliveryId: uuid('delivery_id').primaryKey(),
    activationUid: uuid('activation_uid')
      .notNull()
      .references(() => activations.activationUid),
    agentUid: text('agent_uid').notNull(),
    sessionId: text('session_id').notNull(),
    actorEpoch: bigint('actor_epoch', { mode: 'number' }).notNull(),
    eventId: uuid('event_id').notNull(),
    revision: integer('revision').notNull(),
    /** pg-boss attempt fence: the job is settled as `{ id: event_id, retryCount }`. */
    jobRetryCount: integer('job_retry_count').notNull(),
    workerId: text('worker_id'),
    /** The events the turn takes after `event_id`, in order (a batch, src/db/turns/batches.ts); null for one event. */
    coalesced: uuid('coalesced').array(),
    state: text('state', { enum: DELIVERY_STATES }).notNull(),
    stateReason: text('state_reason'),
    createdAt: tz('created_at').notNull().defaultNow(),
    updatedAt: tz('updated_at').notNull().defaultNow(),
  },
  (t) => [
    uniqueIndex('deliveries_one_live_per_event').on(t.eventId).where(inList('state', DELIVERY_LIVE)),
    index('deliveries_activation').on(t.activationUid),
    index('deliveries_worker_live').on(t.workerId).where(inList('state', DELIVERY_LIVE)),
    // the pruning of finished deliveries (src/db/operations/runtime-pruning.ts)
    index('deliveries_finished').on(t.updatedAt).where(inList('state', DELIVERY_FINISHED)),
    check('deliveries_state', inList('state', DELIVERY_STATES)),
  ],
);

export const workers = corral.table(
  'workers',
  {
    workerId: text('worker_id').primaryKey(),
    /** The daemon instance the worker is connected to. */
    ownerId: text('owner_id').notNull(),
    status: text('status', { enum: WORKER_STATUSES }).notNull(),
    capacity: integer('capacity').notNull(),
    inFlight: integer('in_flight').notNull().default(0),
    registeredAt: tz('registered_at').notNull().defaultNow(),
    lastHeartbeatAt: tz('last_heartbeat_at').notNull().defaultNow(),
  },
  () => [check('workers_status', inList('status', WORKER_STATUSES))],
);

/**
 * Each daemon's own heartbeat (written every quarter of its `stale_ms`), so that any process can
 * tell a live daemon from one that was killed: a row silent for longer than `stale_ms` is a dead
 * daemon's; a clean stop sets `stopped_at`.
 */
export const daemons = corral.table('daemons', {
  /** The daemon instance's id (`owner_id` of its activations and workers). */
  daemonId: text('daemon_id').primaryKey(),
  host: text('host').notNull(),
  pid: integer('pid').notNull(),
  /** The broker endpoint it bound. */
  endpoint: text('endpoint').notNull(),
  /** Its `CORRAL_WORKER_STALE_MS`: silent this long, it (and a worker of its) counts as dead. */
  staleMs: integer('stale_ms').notNull(),
  startedAt: tz('started_at').notNull().defaultNow(),
  lastSeenAt: tz('last_seen_at').notNull().defaultNow(),
  stoppedAt: tz('stopped_at'),
});

/** Operator actions on dead letters (replay, discard), kept for the record. */
export const deadLetterActions = corral.table(
  'dead_letter_actions',
  {
    id: bigserial('id', { mode: 'number' }).primaryKey(),
    action: text('action', { enum: ['replay', 'discard'] }).notNull(),
    deadLetterId: uuid('dead_letter_id').notNull(),
    eventId: uuid('event_id').notNull(),
    agentUid: text('agent_uid').notNull(),
    sessionId: text('session_id').notNull(),
    payload: jsonb('payload'),
    outcome: text('outcome').notNull(),
    actedAt: tz('acted_at').notNull().defaultNow(),
    replayed: boolean('replayed').notNull().default(false),
  },
  (t) => [index('dead_letter_actions_dl').on(t.deadLetterId)],
);

/**
 * Idempotency keys of sent events (`corral.send_events`, src/db/enqueue/send-event.ts): per actor, the
 * event a key enqueued and the SHA-256 of its data (jsonb's text), so a send again with the key
 * returns that event, and one with other data is refused. Written in the transaction that
 * enqueues the event; pruned by the retention sweep once the event's job is gone.
 */
export const idempotencyKeys = corral.table(
  'idempotency_keys',
  {
    agentUid: text('agent_uid').notNull(),
    sessionId: text('session_id').notNull(),
    /**
     * Whose key it is: a key is the caller's, so two callers never see each other's events
     * (E4 of src/db/enqueue/send-event.ts): `token:<name>` for the HTTP API, else the SQL role
     * the sender logged in as.
     */
    caller: text('caller').notNull().default(''),
    key: text('key').notNull(),
    eventId: uuid('event_id').notNull(),
    dataSha256: text('data_sha256').notNull(),
    createdAt: tz('created_at').notNull().defaultNow(),
  },
  (t) => [
    primaryKey({ columns: [t.agentUid, t.sessionId, t.caller, t.key] }),
    index('idempotency_keys_created').on(t.createdAt),
    check('idempotency_keys_key_length', sql.raw(`char_length(key) between 1 and ${MAX_IDEMPOTENCY_KEY_LENGTH}`)),
  ],
);

/**
 * Who listens for turn events, by channel (src/db/turns/turn-events.ts, src/db/turns/turn-listener.ts): the
 * daemon's statements notify a channel only while a row names it, so turn events cost nothing
 * while nobody watches. A row belongs to the backend (`pid`) that LISTENs; rows of backends that
 * are gone are deleted by the next registration.
 */
export const turnWatchers = corral.table(
  'turn_watchers',
  {
    channel: text('channel').notNull(),
    pid: integer('pid').notNull(),
    registeredAt: tz('registered_at').notNull().defaultNow(),
  },
  (t) => [primaryKey({ columns: [t.channel, t.pid] })],
);

/**
 * Transcript retention, per agent (src/db/operations/transcript-retention.ts, `corral retention`): the
 * finished turns of `agent_uid`'s conversations, with their messages, are deleted once they
 * finished more than `keep_seconds` ago. An agent without a row keeps its transcript forever.
 * `agent_uid` is checked as an actor part, since the pruning writes it into its statement as a
 * literal.
 */
export const transcriptRetention = corral.table(
  'transcript_retention',
  {
    agentUid: text('agent_uid').primaryKey(),
    keepSeconds: integer('keep_seconds').notNull(),
    updatedAt: tz('updated_at').notNull().defaultNow(),
    /** Nothing of the agent's transcript is past the window before this (R7); null: not known yet. */
    dueAt: tz('due_at'),
  },
  (t) => [
    check('transcript_retention_keep_positive', sql`${t.keepSeconds} > 0`),
    check('transcript_retention_agent_uid', sql.raw(`agent_uid ~ '${ACTOR_PART.source}'`)),
  ],
);

/**
 * Input policies (`corral policy`, src/db/enqueue/input-policies.ts): what an event sent to a busy actor
 * does. A row with `session_id` '' holds the agent's policy, one with a session that actor's;
 * the actor's wins, then the agent's, then the daemon's CORRAL_INPUT_POLICY.
 */
export const inputPolicies = corral.table(
  'input_policies',
  {
    agentUid: text('agent_uid').notNull(),
    /** '' for every session of the agent. */
    sessionId: text('session_id').notNull().default(''),
    policy: text('policy', { enum: INPUT_POLICIES }).notNull(),
    /** A batching policy's options (null: the default): see src/db/enqueue/input-policies.ts, P4. */
    debounceMs: integer('debounce_ms'),
    maxWaitMs: integer('max_wait_ms'),
    maxEvents: integer('max_events'),
    maxBytes: integer('max_bytes'),
    updatedAt: tz('updated_at').notNull().defaultNow(),
  },
  (t) => [
    primaryKey({ columns: [t.agentUid, t.sessionId] }),
    check('input_policies_debounce', sql.raw(`debounce_ms between 1 and ${MAX_DEBOUNCE_MS}`)),
    check('input_policies_max_wait', sql.raw(`max_wait_ms between 1 and ${MAX_DEBOUNCE_MS} and max_wait_ms >= coalesce(debounce_ms, 0)`)),
    check('input_policies_max_events', sql.raw(`max_events between 1 and ${MAX_BATCH_EVENTS}`)),
    check('input_policies_max_bytes', sql`max_bytes > 0`),
    check(
      'input_policies_batching',
      sql.raw(
        `policy in ${listText(BATCHING_POLICIES)} or (debounce_ms is null and max_wait_ms is null and max_events is null and max_bytes is null)`,
      ),
    ),
    check('input_policies_policy', inList('policy', INPUT_POLICIES)),
    check('input_policies_agent_uid', sql.raw(`agent_uid ~ '${ACTOR_PART.source}'`)),
    check('input_policies_session_id', sql.raw(`session_id = '' or session_id ~ '${ACTOR_PART.source}'`)),
  ],
);

/**
 * The chunks a running turn streamed (`turn_chunk`, src/db/live/chunks.ts), so that a client of
 * any daemon can follow a live turn from its first chunk or from where it left off. UNLOGGED (the
 * migration says so; Drizzle has no word for it): chunks need not survive a crash, since after the
 * commit the transcript is the record and after a crash the turn is retried from its start. Kept
 * only while the delivery is live: the daemon deletes a turn's chunks when it ends, and the
 * retention sweep those of deliveries that are not live any more.
 */
export const streamChunks = corral.table(
  'stream_chunks',
  {
    deliveryId: uuid('delivery_id').notNull(),
    seq: integer('seq').notNull(),
    agentUid: text('agent_uid').notNull(),
    sessionId: text('session_id').notNull(),
    actorEpoch: integer('actor_epoch').notNull(),
    attempt: integer('attempt').notNull(),
    data: jsonb('data').notNull(),
    createdAt: tz('created_at').notNull().defaultNow(),
  },
  (t) => [primaryKey({ columns: [t.deliveryId, t.seq] }), check('stream_chunks_seq', sql`${t.seq} >= 1`)],
);

/**
 * Webhook sinks (`corral sinks`, src/db/outbox/sinks.ts): named destinations for the messages a turn's
 * result delivers (the outbox). `secret` is the Standard Webhooks signing secret (`whsec_` and the
 * base64 of the key), kept as given since signing needs the key itself. A sink the receiver told
 * gone (HTTP 410) is disabled until `corral sinks enable`.
 *
 * `agents`: the agents whose turns may deliver to it (src/base/agent-scope.ts patterns); null is
 * every agent. `allow_private`: its URL may point inside (loopback, private, link-local …; without
 * it such an address is refused at add and at every connect, src/outbox/address-guard.ts).
 * `previous_secret` signs too, after the current one, until `previous_secret_until` (a rotation's
 * overlap, `corral sinks rotate-secret`); both are null outside one.
 */
export const sinks = corral.table(
  'sinks',
  {
    name: text('name').primaryKey(),
    url: text('url').notNull(),
    secret: text('secret').notNull(),
    timeoutMs: integer('timeout_ms').notNull().default(10_000),
    concurrency: integer('concurrency').notNull().default(4),
    agents: text('agents').array(),
    allowPrivate: boolean('allow_private').notNull().default(false),
    previousSecret: text('previous_secret'),
    previousSecretUntil: tz('previous_secret_until'),
    disabledAt: tz('disabled_at'),
    disabledReason: text('disabled_reason'),
    createdAt: tz('created_at').notNull().defaultNow(),
    updatedAt: tz('updated_at').notNull().defaultNow(),
  },
  (t) => [
    check('sinks_name', sql.raw(`name ~ '^[A-Za-z0-9._-]{1,64}$'`)),
    check('sinks_url', sql.raw(`url ~ '^https?://' and char_length(url) <= 2048`)),
    check('sinks_secret', sql.raw(`secret ~ '^whsec_[A-Za-z0-9+/]+={0,2}$'`)),
    check('sinks_timeout', sql`${t.timeoutMs} between 100 and 600000`),
    check('sinks_concurrency', sql`${t.concurrency} between 1 and 64`),
    check('sinks_agents', sql.raw(`agents is null or cardinality(agents) between 1 and 64`)),
    check('sinks_previous_secret', sql.raw(`previous_secret is null or previous_secret ~ '^whsec_[A-Za-z0-9+/]+={0,2}$'`)),
    check('sinks_previous_secret_until', sql.raw(`(previous_secret is null) = (previous_secret_until is null)`)),
  ],
);

export { OUTBOX_STATES, type OutboxState } from './views.ts';
const TRACESTATE_OK = `char_length(tracestate) <= ${MAX_TRACESTATE_LENGTH} and tracestate ~ '${TRACESTATE_PATTERN.source}'`;
/**
 * The outbox (src/db/outbox/messages.ts): the messages committed turns deliver to sinks, written in the transaction
 * that commits the turn and sent by the daemons' delivery loop (src/outbox/sender.ts). `id` orders them in commit
 * order: per actor and sink, a message is sent only when none before it is pending. `body` is the request body exactly as sent (its
 * signature covers those bytes). A pending message being sent carries its sender's claim
 * (`claimed_by`, `claimed_until`); `attempts` counts the claims (never reset, so it fences the
 * sender's answer across replays).
 */
export const outbox = corral.table(
  'outbox',
  {
    id: bigint('id', { mode: 'number' }).primaryKey().generatedAlwaysAsIdentity(),
    /** Removing a sink removes its messages (`corral sinks remove` refuses while some are pending, unless forced). */
    sink: text('sink')
      .notNull()
      .references(() => sinks.name, { onDelete: 'cascade' }),
    webhookId: text('webhook_id').notNull(),
    /** The result's `key` (sent as `corral-key`); null without one, and on rows written before keys were kept apart from ids. */
    key: text('key'),
    agentUid: text('agent_uid').notNull(),
    sessionId: text('session_id').notNull(),
    turnId: uuid('turn_id').notNull(),
    eventId: uuid('event_id').notNull(),
    /** Its place in the result's `deliver` (0-based). */
    position: integer('position').notNull(),
    body: text('body').notNull(),
    /** The W3C trace context of its turn (sent as `traceparent`/`tracestate`); null: none. */
    traceparent: text('traceparent'),
    tracestate: text('tracestate'),
    state: text('state', { enum: OUTBOX_STATES }).notNull().default('pending'),
    attempts: integer('attempts').notNull().default(0),
    /** `attempts` when an operator last replayed it: the retry limit counts the attempts after it. */
    attemptsBeforeReplay: integer('attempts_before_replay').notNull().default(0),
    nextAttemptAt: tz('next_attempt_at').notNull().defaultNow(),
    claimedBy: text('claimed_by'),
    claimedUntil: tz('claimed_until'),
    /** The last answer: an HTTP status, or null for a timeout or connection error (`last_error` says which). */
    lastStatus: integer('last_status'),
    lastError: text('last_error'),
    createdAt: tz('created_at').notNull().defaultNow(),
    deliveredAt: tz('delivered_at'),
    updatedAt: tz('updated_at').notNull().defaultNow(),
  },
  (t) => [
    uniqueIndex('outbox_webhook_id').on(t.sink, t.webhookId),
    // the claim: each sink's due messages, and the one before each per actor and sink
    index('outbox_due')
      .on(t.sink, t.nextAttemptAt, t.id)
      .where(sql`state = 'pending'`),
    // the claims held now (in flight, or lapsed with their sender)
    index('outbox_claimed')
      .on(t.claimedUntil)
      .where(sql`claimed_until is not null and state = 'pending'`),
    index('outbox_actor_sink')
      .on(t.agentUid, t.sessionId, t.sink, t.id)
      .where(sql`state = 'pending'`),
    index('outbox_turn').on(t.turnId),
    // operators' lists, by state
    index('outbox_state').on(t.state, t.id),
    // retention: the messages done with, by age (src/queue/retention.ts)
    index('outbox_finished')
      .on(t.updatedAt)
      .where(sql`state in ('delivered', 'discarded')`),
    check('outbox_state', inList('state', OUTBOX_STATES)),
    // `<agent_uid>/<session_id>/<key or event_id.index>`: 128 + 1 + 128 + 1 + 256 at most
    check('outbox_webhook_id', sql.raw(`char_length(webhook_id) between 1 and 520 and webhook_id ~ '^[\\x21-\\x7e]+$'`)),
    check('outbox_key', sql.raw(`key is null or (char_length(key) between 1 and 256 and key ~ '^[\\x21-\\x7e]+$')`)),
    check('outbox_position', sql`${t.position} >= 0`),
    check('outbox_traceparent', sql.raw(`traceparent is null or traceparent ~ '${STORED_TRACEPARENT_PATTERN.source}'`)),
    check('outbox_tracestate', sql.raw(`tracestate is null or (traceparent is not null and ${TRACESTATE_OK})`)),
  ],
);
