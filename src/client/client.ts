/**
 * The client an application uses: `const corral = await connect()`. It enqueues events (inside
 * the caller's transaction if asked), reads transcripts and actors, steers and cancels turns,
 * waits for a turn and watches an actor's turns. Every use-case is the CLI's own implementation
 * (src/db/enqueue/send-event.ts, src/db/turns/transcript.ts, src/ops/status.ts, src/ops/turn-control.ts); the
 * client adds nothing to the daemon's path.
 */
import { parseActorPatterns } from '../base/actor-scope.ts';
import { createToken, generatedTokenName, listTokens, parseScopes, parseTokenName, parseTokenTtl, revokeToken } from '../ops/api-tokens.ts';
import type { PgBoss } from 'pg-boss';
import type pg from 'pg';
import { loadConfig, type Config } from '../config.ts';
import type { Queues } from '../db/boss/jobs.ts';
import type { Database } from '../db/client.ts';
import { isStatementTarget } from '../db/executor.ts';
import { openUsableDatabase } from '../db/postgres/open.ts';
import { openDatabase } from '../db/client.ts';
import { readShardLayout } from '../db/shards/catalog.ts';
import { shardClientOf } from '../db/shards/shard-sql.ts';
import { shardSchemas } from '../base/shard-map.ts';
import { ShardedCorral } from './sharded.ts';
import { MAX_IDEMPOTENCY_KEY_LENGTH, MAX_SEND_BATCH, sendEvents } from '../db/enqueue/send-event.ts';
import { readTranscript, type TranscriptEntry } from '../db/turns/transcript.ts';
import { DEFAULT_LINGER_MS, TurnListener } from '../db/turns/turn-listener.ts';
import { CorralError } from '../base/errors.ts';
import { activeTraceCarrier, checkTraceCarrier, type TraceCarrier } from '../base/trace-context.ts';
import { unstorableReason } from '../base/json-safety.ts';
import { silentLogger, type Logger } from '../base/logger.ts';
import { batchOptionsFrom, clearPolicy, parsePolicy, parsePolicyTarget, setPolicy, type InputPolicy } from '../ops/input-policies.ts';
import { actorStatus, type ActorStatus } from '../ops/status.ts';
import { actOnOutbox, listOutboxMessages, showOutboxMessage } from '../outbox/operations.ts';
import { addSink, enableSink, listSinkViews, removeSink, rotateSecret } from '../outbox/sinks.ts';
import type { InputPolicyOptions } from '../db/views.ts';
import { cancelTurn, steerTurn } from '../ops/turn-control.ts';
import { queuesOf } from '../queue/names.ts';
import { toActorKey, type ActorRef } from './actor-ref.ts';
import type {
  ActorOptions,
  CancelResult,
  ClientDiagnostics,
  CommittedTurn,
  ConnectOptions,
  Corral,
  EventInput,
  InputPolicySet,
  OutboxApi,
  PolicyTargetRef,
  SinkInput,
  SinksApi,
  TokenInput,
  TokensApi,
  SendOptions,
  SendResult,
  SteerResult,
  TurnWatch,
  WaitOptions,
  WatchOptions,
} from './api.ts';
import { waitForTurn } from './wait.ts';
import { ActorWatch } from './watch.ts';
import { parseLiveEventId } from '../live/events.ts';
import { LiveStream } from '../live/stream.ts';
import type { LiveWatch, LiveWatchOptions } from '../live/events.ts';

export type * from './api.ts';

const DEFAULT_CONNECTIONS = 4;
/** The most `maxBufferedBytes` a live watch takes (its default is 4 MiB). */
const MAX_BUFFERED_BYTES = 1024 ** 3;

/** `Corral` (src/client/api.ts), made by `connect()`. */
class CorralClient implements Corral {
  readonly config: Config;
  readonly queues: Queues;
  private readonly database: Database;
  private readonly logger: Logger;
  private readonly applicationName: string;
  private readonly lingerMs: number;
  private listenerInstance: TurnListener | undefined;
  private boss: Promise<PgBoss> | undefined;
  private readonly watches = new Set<ActorWatch>();
  private readonly streams = new Set<LiveStream>();
  private readonly waits = new Set<(e: CorralError) => void>();
  private calls = 0;
  private closing: Promise<void> | undefined;
  readonly sinks: SinksApi;
  readonly outbox: OutboxApi;
  readonly tokens: TokensApi;

  private readonly Client: typeof pg.Client | undefined;

  /** Use `connect()`. `Client`: a shard's connection class (src/client/sharded.ts). */
  constructor(
    config: Config,
    database: Database,
    opts: { logger: Logger; applicationName: string; lingerMs: number; Client?: typeof pg.Client },
  ) {
    this.Client = opts.Client;
    this.config = config;
    this.queues = queuesOf(config);
    this.database = database;
    this.logger = opts.logger;
    this.applicationName = opts.applicationName;
    this.lingerMs = opts.lingerMs;
    database.pool.on('acquire', () => this.calls++);
    const db = () => {
      this.open();
      return this.database.db;
    };
    this.sinks = {
      add: async (input: SinkInput) => {
        if (input === null || typeof input !== 'object') throw new CorralError('invalid_argument', 'sinks.add takes { name, url, … }');
        return addSink(db(), input);
      },
      list: async () => listSinkViews(db()),
      remove: async (name, opts = {}) => removeSink(db(), String(name), { force: opts.force === true }),
      enable: async (name) => enableSink(db(), String(name)),
      rotateSecret: async (name, rotation = {}) => {
        if (rotation === null || typeof rotation !== 'object')
          throw new CorralError('invalid_argument', 'sinks.rotateSecret takes (name, { secret?, overlap? })');
        return rotateSecret(db(), String(name), rotation);
      },
    };
    this.tokens = {
      create: async (input: TokenInput) => {
        if (input === null || typeof input !== 'object')
          throw new CorralError('invalid_argument', 'tokens.create takes { scopes, actors?, ttl?, name? }');
        const name = input.name === undefined ? generatedTokenName() : parseTokenName(input.name);
        const scopes = parseScopes(Array.isArray(input.scopes) ? input.scopes : []);
        const actors = input.actors === undefined ? undefined : parseActorPatterns(input.actors);
        const ttlMs = input.ttl === undefined ? undefined : parseTokenTtl(input.ttl);
        return createToken(db(), name, scopes, { ...(actors ? { actors } : {}), ...(ttlMs === undefined ? {} : { ttlMs }) });
      },
      list: async () => listTokens(db()),
      revoke: async (name) => revokeToken(db(), parseTokenName(String(name))),
    };
    this.outbox = {
      list: async (opts = {}) => listOutboxMessages(db(), opts),
      show: async (id) => showOutboxMessage(db(), id),
      replay: async (target) => actOnOutbox(db(), 'replay', target),
      discard: async (target) => actOnOutbox(db(), 'discard', target),
    };
  }

  /** The database URL in use (the embedded server's when no `databaseUrl` was given). */
  get databaseUrl(): string {
    return this.database.url;
  }

  /** Enqueues one event for `actor`; resolves once it is written (committed, or in `opts.db`'s transaction). */
  async send(actor: ActorRef, data: unknown, opts: SendOptions = {}): Promise<SendResult> {
    const [sent] = await this.sendMany(
      [
        {
          actor,
          data,
          ...(opts.idempotencyKey === undefined ? {} : { idempotencyKey: opts.idempotencyKey }),
          ...(opts.idempotencyScope === undefined ? {} : { idempotencyScope: opts.idempotencyScope }),
          ...(opts.traceparent === undefined ? {} : { traceparent: opts.traceparent }),
          ...(opts.tracestate === undefined ? {} : { tracestate: opts.tracestate }),
        },
      ],
      {
        ...(opts.db === undefined ? {} : { db: opts.db }),
      },
    );
    return sent!;
  }

  /** Enqueues events (any actors) in one statement, in array order; the results in the same order. */
  async sendMany(events: readonly EventInput[], opts: Pick<SendOptions, 'db'> = {}): Promise<SendResult[]> {
    this.open();
    if (!Array.isArray(events)) throw new CorralError('invalid_argument', 'sendMany takes an array of { actor, data, idempotencyKey? }');
    if (events.length > MAX_SEND_BATCH) {
      throw new CorralError('invalid_argument', `sendMany takes at most ${MAX_SEND_BATCH} events at once (got ${events.length})`);
    }
    if (opts.db !== undefined && !isStatementTarget(opts.db)) {
      throw new CorralError(
        'invalid_argument',
        'opts.db must be a pg Client or PoolClient, a Drizzle transaction, or { executeSql(text, values) }',
      );
    }
    // read once: every event of the call that names no trace context continues the caller's active span
    const active = events.some((e) => e !== null && typeof e === 'object' && e.traceparent === undefined)
      ? activeTraceCarrier()
      : undefined;
    const input = events.map((e, i) => {
      if (e === null || typeof e !== 'object')
        throw new CorralError('invalid_argument', `event ${i + 1}: expected { actor, data, idempotencyKey? }`);
      const key = toActorKey(e.actor);
      const trace = e.traceparent === undefined ? active : eventTrace(e, i, events.length);
      return {
        agentUid: key.agentUid,
        sessionId: key.sessionId,
        data: e.data,
        idempotencyKey: checkedIdempotencyKey(e.idempotencyKey),
        idempotencyScope: checkedIdempotencyKey(e.idempotencyScope, 'idempotency scope'),
        ...(trace ? { trace } : {}),
      };
    });
    return sendEvents(opts.db ?? this.database.pool, input, { maxEventBytes: this.config.maxEventBytes });
  }

  /** The committed transcript of `actor`: its turns in order, each with its messages. */
  async transcript(actor: ActorRef): Promise<TranscriptEntry[]> {
    this.open();
    return readTranscript(this.database.db, toActorKey(actor));
  }

  /** What `corral actor` shows: activation, pending events, latest turns, dead letters. */
  async actor(actor: ActorRef, opts: ActorOptions = {}): Promise<ActorStatus> {
    this.open();
    const limits = {
      ...(opts.turns === undefined ? {} : { turns: checkedCount('turns', opts.turns) }),
      ...(opts.pending === undefined ? {} : { pending: checkedCount('pending', opts.pending) }),
      ...(opts.deadLetters === undefined ? {} : { deadLetters: checkedCount('deadLetters', opts.deadLetters) }),
    };
    return actorStatus(this.database.db, this.queues, toActorKey(actor), limits);
  }

  async setInputPolicy(target: PolicyTargetRef, policy: InputPolicy, options: InputPolicyOptions = {}): Promise<InputPolicySet> {
    this.open();
    // setPolicy checks the options against the policy, before the database is touched
    const set = await setPolicy(this.database.db, policyTargetOf(target), parsePolicy(String(policy)), batchOptionsFrom(options));
    return { target: set.target, policy: set.policy, options: set.options, previous: set.previous };
  }

  async clearInputPolicy(target: PolicyTargetRef): Promise<InputPolicy> {
    this.open();
    return clearPolicy(this.database.db, policyTargetOf(target));
  }

  /** Steers the live turn of `actor` (`not_found` when none runs); `data` is at most 6,900 bytes of JSON. */
  async steer(actor: ActorRef, data: unknown): Promise<SteerResult> {
    this.open();
    if (data === undefined) throw new CorralError('invalid_argument', 'steering input is required');
    const fence = await steerTurn({ db: this.database.db }, toActorKey(actor), data);
    return { eventId: fence.eventId, epoch: fence.actorEpoch, revision: fence.revision };
  }

  /** Cancels the live turn of `actor` (`not_found` when none runs): the actor moves on to its next event. */
  async cancel(actor: ActorRef, reason = 'cancelled by the application'): Promise<CancelResult> {
    this.open();
    if (typeof reason !== 'string' || reason.length === 0 || reason.length > 1000) {
      throw new CorralError('invalid_argument', 'a cancel reason is a string of 1-1000 characters');
    }
    const key = toActorKey(actor);
    const fence = await cancelTurn({ db: this.database.db, boss: await this.bossInstance(), queueName: this.queues.events }, key, reason);
    return { eventId: fence.eventId, epoch: fence.actorEpoch };
  }

  /** The committed turn of `eventId`, once it committed; rejects `dead_lettered`, `cancelled`, `not_found`, `timeout`, `aborted`. */
  waitForTurn(eventId: string, opts: WaitOptions = {}): Promise<CommittedTurn> {
    try {
      this.open();
    } catch (e) {
      return Promise.reject(e as Error);
    }
    return waitForTurn(
      {
        db: this.database.db,
        queues: this.queues,
        listener: () => this.listener(),
        track: (cancel) => {
          this.waits.add(cancel);
          return () => this.waits.delete(cancel);
        },
      },
      eventId,
      opts,
    );
  }

  async watch(actor: ActorRef, opts: LiveWatchOptions = {}): Promise<LiveWatch> {
    this.open();
    if (opts.maxBufferedBytes !== undefined) checkedCount('maxBufferedBytes', opts.maxBufferedBytes, MAX_BUFFERED_BYTES);
    if (opts.lastEventId !== undefined && parseLiveEventId(opts.lastEventId) === undefined) {
      throw new CorralError(
        'invalid_argument',
        `lastEventId ${JSON.stringify(opts.lastEventId.slice(0, 80))} is not an event id of a live stream`,
      );
    }
    const stream = new LiveStream(toActorKey(actor), { db: this.database.db, queues: this.queues, listener: this.listener() }, opts, (s) =>
      this.streams.delete(s),
    );
    this.streams.add(stream);
    try {
      await stream.start();
    } catch (e) {
      await stream.close();
      throw e;
    }
    return stream;
  }

  async watchTurns(actor: ActorRef, opts: WatchOptions = {}): Promise<TurnWatch> {
    this.open();
    if (opts.maxBuffered !== undefined) checkedCount('maxBuffered', opts.maxBuffered);
    const watch = new ActorWatch(toActorKey(actor), opts, (w) => this.watches.delete(w));
    this.watches.add(watch);
    try {
      await watch.start(this.listener());
    } catch (e) {
      this.watches.delete(watch);
      throw e;
    }
    return watch;
  }

  diagnostics(): ClientDiagnostics {
    return {
      databaseCalls: this.calls,
      listening: this.listenerInstance?.listening ?? 0,
      reconnects: this.listenerInstance?.reconnects ?? 0,
      watches: this.watches.size + this.streams.size,
      waits: this.waits.size,
    };
  }

  /** Ends every watch, rejects every wait (`closed`), closes the connections. Idempotent. */
  close(): Promise<void> {
    this.closing ??= this.closeOnce();
    return this.closing;
  }

  private async closeOnce(): Promise<void> {
    const closed = new CorralError('closed', 'the client was closed');
    for (const cancel of [...this.waits]) cancel(closed);
    await Promise.all([...this.watches].map((w) => w.close()));
    await Promise.all([...this.streams].map((s) => s.close()));
    await this.listenerInstance?.close();
    const boss = await this.boss?.catch(() => undefined);
    await boss?.stop({ graceful: false, close: true }).catch(() => undefined);
    await this.database.close();
  }

  private open(): void {
    if (this.closing) throw new CorralError('closed', 'the client is closed');
  }

  private listener(): TurnListener {
    this.listenerInstance ??= new TurnListener({
      url: this.database.url,
      applicationName: `${this.applicationName}-listen`.slice(0, 63),
      logger: this.logger,
      onStatement: () => this.calls++,
      lingerMs: this.lingerMs,
      ...(this.Client ? { Client: this.Client } : {}),
    });
    return this.listenerInstance;
  }

  /** pg-boss, for `cancel` only (it completes the event's job): started on first use. */
  private bossInstance(): Promise<PgBoss> {
    this.boss ??= (async () => {
      const { createBoss, ensureQueues } = await import('../queue/boss.ts');
      const boss = createBoss(this.database.url, this.config, {
        max: 2,
        ...(this.Client ? { Client: this.Client } : {}),
        onError: (e) => this.logger.warn({ err: e.message }, 'pg-boss error'),
      });
      await boss.start();
      await ensureQueues(boss, this.config, { updateExisting: false });
      return boss;
    })();
    this.boss.catch(() => (this.boss = undefined));
    return this.boss;
  }
}

/**
 * Connects to corral's database: `databaseUrl`, else `DATABASE_URL`, else the embedded server
 * under `CORRAL_HOME` the CLI uses (started if it is not running). Refuses a database without
 * corral's schema (`database_unavailable`: start the daemon or run `corral db migrate`).
 */
export async function connect(opts: ConnectOptions = {}): Promise<Corral> {
  if (opts === null || typeof opts !== 'object') throw new CorralError('invalid_argument', 'connect() takes an options object');
  const env = opts.env ?? process.env;
  const config = loadConfig(
    {
      ...(opts.databaseUrl === undefined ? {} : { databaseUrl: opts.databaseUrl }),
      ...(opts.homeDir === undefined ? {} : { homeDir: opts.homeDir }),
      ...(opts.queueName === undefined ? {} : { queueName: opts.queueName }),
      ...(opts.bossSchema === undefined ? {} : { bossSchema: opts.bossSchema }),
      ...(opts.maxEventBytes === undefined ? {} : { maxEventBytes: opts.maxEventBytes }),
    },
    env,
  );
  const max = opts.maxConnections === undefined ? DEFAULT_CONNECTIONS : checkedCount('maxConnections', opts.maxConnections, 100);
  const applicationName = opts.applicationName ?? 'corral-client';
  if (typeof applicationName !== 'string' || applicationName.length === 0 || applicationName.length > 63) {
    throw new CorralError('invalid_argument', 'applicationName is a string of 1-63 characters');
  }
  const logger = opts.logger ?? silentLogger;
  const lingerMs = opts.watchLingerMs ?? DEFAULT_LINGER_MS;
  if (!Number.isInteger(lingerMs) || lingerMs < 0 || lingerMs > 3_600_000) {
    throw new CorralError('invalid_argument', 'watchLingerMs is an integer from 0 to 3,600,000');
  }
  const onError = (e: Error) => logger.warn({ err: e.message }, 'database connection error');
  const database = await openUsableDatabase(config, logger, { max, applicationName, onError });
  const client = new CorralClient(config, database, { logger, applicationName, lingerMs });
  try {
    const layout = await readShardLayout(database.pool, database.url);
    if (layout.shardCount === 1) return client;
    // a deployment of several shards (src/client/sharded.ts): a client per shard, at its database
    const shards: Corral[] = [client];
    for (let k = 1; k < layout.shardCount; k++) {
      const names = shardSchemas(k, config.bossSchema);
      const Client = shardClientOf(k, config.bossSchema);
      const shardDb = openDatabase(layout.urlOf(k), { max, applicationName, onError, Client });
      shards.push(new CorralClient({ ...config, bossSchema: names.boss }, shardDb, { logger, applicationName, lingerMs, Client }));
    }
    return new ShardedCorral(shards);
  } catch (e) {
    await client.close();
    throw e;
  }
}

function checkedIdempotencyKey(key: unknown, what = 'idempotency key'): string | undefined {
  if (key === undefined) return undefined;
  // characters as PostgreSQL counts them (code points)
  const length = typeof key === 'string' ? [...key].length : 0;
  if (typeof key !== 'string' || length === 0 || length > MAX_IDEMPOTENCY_KEY_LENGTH) {
    throw new CorralError('invalid_argument', `an ${what} is a string of 1-${MAX_IDEMPOTENCY_KEY_LENGTH} characters`);
  }
  const unstorable = unstorableReason(key, what);
  if (unstorable) throw new CorralError('invalid_argument', `the ${unstorable}`);
  return key;
}

function checkedCount(name: string, n: unknown, max = 100_000): number {
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 1 || n > max) {
    throw new CorralError('invalid_argument', `${name} must be an integer from 1 to ${max} (got ${String(n)})`);
  }
  return n;
}

/** A policy target as the ops take it: a string is parsed, an object's parts are checked the same way. */
function policyTargetOf(target: PolicyTargetRef): { agentUid: string; sessionId: string | null } {
  if (typeof target === 'string') return parsePolicyTarget(target);
  if (target === null || typeof target !== 'object' || typeof target.agentUid !== 'string')
    throw new CorralError('invalid_argument', 'a policy target is "agent", "agent/session" or { agentUid, sessionId? }');
  const session = target.sessionId ?? null;
  if (session !== null && typeof session !== 'string') throw new CorralError('invalid_argument', 'a sessionId is a string');
  return parsePolicyTarget(session === null ? target.agentUid : `${target.agentUid}/${session}`);
}

/** The trace context an event names itself (`traceparent: null`: none), checked. */
function eventTrace(e: EventInput, i: number, count: number): TraceCarrier | undefined {
  if (e.traceparent === null || e.traceparent === undefined) return undefined;
  try {
    return checkTraceCarrier({ traceparent: e.traceparent, tracestate: e.tracestate });
  } catch (err) {
    if (err instanceof CorralError && count > 1) throw new CorralError(err.code, `event ${i + 1}: ${err.message}`, { cause: err });
    throw err;
  }
}
