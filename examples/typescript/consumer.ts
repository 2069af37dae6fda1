/**
 * Every public export of corral, used from a strict TypeScript application (`tsconfig.json` here:
 * `strict`, `moduleResolution: nodenext`, no `skipLibCheck`). The package test type-checks this
 * file against the packed package and fails when an entry point exports a name this file does not
 * import: a new export is added here, with a use of it.
 */
import {
  connect,
  type Corral,
  toActorKey,
  DEFAULT_WAIT_MS,
  DEFAULT_MAX_BUFFERED,
  MAX_IDEMPOTENCY_KEY_LENGTH,
  MAX_SEND_BATCH,
  SEND_ERRORS,
  INPUT_POLICIES,
  AVAILABLE_INPUT_POLICIES,
  TURN_CHANNELS,
  TURN_EVENT_KINDS,
  turnChannelOf,
  createDaemon,
  localWorkerId,
  CorralError,
  FenceRejected,
  FENCE_REASONS,
  actorKey,
  formatActorKey,
  isValidActorPart,
  parseActorKey,
  type ActorOptions,
  type ActorRef,
  type CancelResult,
  type ClientDiagnostics,
  type CommittedTurn,
  type ConnectOptions,
  type EventInput,
  type InputPolicy,
  type InputPolicySet,
  type InputPolicyOptions,
  type PolicyTargetRef,
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
  OUTBOX_STATES,
  type OutboxApi,
  type OutboxState,
  type OutboxQuery,
  type OutboxListOptions,
  type OutboxPage,
  type OutboxMessage,
  type OutboxMessageDetail,
  type OutboxTarget,
  type OutboxActionResult,
  type TurnDelivery,
  type SinkInput,
  type SinkRotation,
  type SinksApi,
  type SinkView,
  type SinkSummary,
  type SinkRemoval,
  API_TOKEN_SCOPES,
  type ApiTokenScope,
  type TokenInput,
  type TokenView,
  type TokensApi,
  type CorralDaemon,
  type DaemonOptions,
  type DaemonState,
  type LocalWorkersOptions,
  type StopDaemonOptions,
  type Config,
  type DeadLetterMode,
  type Logger,
  type ActorKey,
  type ErrorCode,
  type FenceReason,
  type JsonValue,
} from 'corral';
import {
  CorralError as WorkerCorralError,
  createWorker,
  DEFAULT_START_TIMEOUT_MS,
  type CreateWorkerOptions,
  type Deliver,
  type Emit,
  type ErrorCode as WorkerErrorCode,
  type HandlerError,
  type HistoryPage,
  type JsonValue as WorkerJsonValue,
  type SteerListener,
  type StopOptions,
  type TranscriptMessage,
  type TurnContext,
  type TurnContextWire,
  type TurnHandler,
  type TurnOutcome,
  type TurnRef,
  type Worker,
  type WorkerKeyFile,
} from 'corral/worker';
import {
  createTestEnvironment,
  ManualClock,
  type Clock,
  type TestEnvironment,
  type TestEnvironmentOptions,
  type TestWorkerOptions,
  type TimerHandle,
} from 'corral/testing';

// corral: actor keys and typed errors
const key: ActorKey = actorKey('agent-1', 'session-1');
const text: string = formatActorKey(key);
const parsed: ActorKey = parseActorKey(text);
const valid: boolean = isValidActorPart(parsed.agentUid);
const reasons: readonly FenceReason[] = FENCE_REASONS;
const ref: ActorRef = 'agent-1/session-1';
const refKey: ActorKey = toActorKey(ref);

export function describeError(e: unknown): string {
  if (e instanceof FenceRejected) return `fenced: ${e.reason}`;
  if (e instanceof CorralError) {
    const code: ErrorCode = e.code;
    return `${code}${e.retryable ? ' (retryable)' : ''}`;
  }
  return String(e);
}

// corral: the client, in the application's own transaction
export async function sendAndWait(pgClient: PgQueryable): Promise<CommittedTurn> {
  const options: ConnectOptions = { applicationName: 'consumer', maxConnections: 2 };
  const corral: Corral = await connect(options);
  try {
    const db: SendDb = pgClient;
    const sendOptions: SendOptions = { db, idempotencyKey: 'order-1'.padEnd(Math.min(8, MAX_IDEMPOTENCY_KEY_LENGTH), '-') };
    const sent: SendResult = await corral.send(ref, { text: 'hello' }, sendOptions);
    const batch: EventInput[] = [{ actor: refKey, data: { text: 'again' } }].slice(0, MAX_SEND_BATCH);
    const many: SendResult[] = await corral.sendMany(batch);
    const waitOptions: WaitOptions = { timeoutMs: DEFAULT_WAIT_MS };
    const turn: CommittedTurn = await corral.waitForTurn(sent.eventId, waitOptions);
    const entries: TranscriptEntry[] = await corral.transcript(ref);
    const emitted: EmittedEntry[] = entries.flatMap((t) => t.emitted);
    const actorOptions: ActorOptions = {};
    const status: ActorStatus = await corral.actor(ref, actorOptions);
    const activation: ActivationView | null = status.activation;
    const turns: TurnView[] = status.recentTurns;
    const pending: PendingJob[] = status.pendingEvents;
    const dead: DeadLetter[] = status.deadLetters;
    const target: PolicyTargetRef = { agentUid: refKey.agentUid };
    const reject: InputPolicy = AVAILABLE_INPUT_POLICIES.includes('reject') ? 'reject' : INPUT_POLICIES[0];
    const policy: InputPolicySet = await corral.setInputPolicy(target, reject);
    const batching: InputPolicyOptions = { debounceMs: 300, maxWaitMs: 5_000, maxEvents: 20 };
    const coalesced: InputPolicySet = await corral.setInputPolicy(target, 'coalesce', batching);
    const before: InputPolicy = await corral.clearInputPolicy(target);
    const steered: SteerResult = await corral.steer(ref, { text: 'also' });
    const cancelled: CancelResult = await corral.cancel(ref);
    const diagnostics: ClientDiagnostics = corral.diagnostics();
    const roles: MessageRole[] = turn.messages.map((m) => m.role);
    const statuses: TurnStatus[] = turns.map((t) => t.status);
    void [
      many,
      coalesced,
      emitted,
      activation,
      pending,
      dead,
      policy,
      before,
      status.inputPolicy.from,
      steered,
      cancelled,
      diagnostics,
      roles,
      statuses,
      SEND_ERRORS,
    ];
    return turn;
  } finally {
    await corral.close();
  }
}

export const adapter: SqlAdapter = { executeSql: async () => ({ rows: [] }) };
export function drizzleTarget(tx: DrizzleExecutable): SendDb {
  return tx;
}

// corral: a backend minting an end user's browser a token for their one conversation (docs/http.md)
export async function tokenForUser(corral: Corral, user: string): Promise<{ token: string; expiresAt: string | null }> {
  const tokens: TokensApi = corral.tokens;
  const scopes: ApiTokenScope[] = API_TOKEN_SCOPES.filter((s) => s === 'read' || s === 'send');
  const input: TokenInput = { scopes, actors: [`chat/${user}`], ttl: '15m' };
  const made: TokenView & { token: string } = await tokens.create(input);
  const listed: TokenView[] = await tokens.list();
  void listed.filter((t) => t.actors === null && t.revokedAt === null);
  return { token: made.token, expiresAt: made.expiresAt };
}

// corral: webhook sinks, and the outbox of what turns delivered to them
export async function manageOutbox(corral: Corral): Promise<TurnDelivery[]> {
  const sinks: SinksApi = corral.sinks;
  const input: SinkInput = { name: 'crm', url: 'https://crm.example.com/hooks', timeout: '5s', concurrency: 8, agents: ['support-*'] };
  const added: SinkView & { secret: string } = await sinks.add(input);
  const rotation: SinkRotation = { overlap: '1h' };
  const rotated: SinkView & { secret: string } = await sinks.rotateSecret(added.name, rotation);
  void rotated.previousSecretUntil;
  const listed: SinkSummary[] = await sinks.list();
  const enabled: SinkView = await sinks.enable(added.name);
  const outbox: OutboxApi = corral.outbox;
  const dead: OutboxState = OUTBOX_STATES.includes('dead') ? 'dead' : 'pending';
  const query: OutboxQuery = { states: [dead], sink: added.name };
  const options: OutboxListOptions = { ...query, limit: 100 };
  const page: OutboxPage = await outbox.list(options);
  const messages: OutboxMessage[] = page.messages;
  const first: OutboxMessageDetail | undefined = messages[0] ? await outbox.show(messages[0].id) : undefined;
  const target: OutboxTarget = { ...query, all: true };
  const replayed: OutboxActionResult = await outbox.replay(target);
  const discarded: OutboxActionResult = await outbox.discard({ ids: replayed.done });
  const removed: SinkRemoval = await sinks.remove(added.name, { force: true });
  void [listed.map((s) => s.pending), enabled, first?.body, discarded.skipped, removed.messagesRemoved, page.next];
  const status = await corral.actor(ref);
  return status.recentTurns.flatMap((t) => t.delivered);
}

// corral: an actor's live turns, as a person would follow them
export async function followLive(corral: Corral, signal: AbortSignal, lastEventId?: string): Promise<string> {
  const options: LiveWatchOptions = { signal, maxBufferedBytes: 1 << 20, ...(lastEventId ? { lastEventId } : {}) };
  const watch: LiveWatch = await corral.watch(ref, options);
  const known: readonly LiveEventType[] = LIVE_EVENT_TYPES;
  let shown = '';
  for await (const e of watch as AsyncIterable<LiveEvent>) {
    if (!known.includes(e.type)) continue;
    if (e.type === 'turn_started') {
      const started: LiveTurnStarted = e.data;
      void started.events.length;
    } else if (e.type === 'chunk') {
      const chunk: LiveChunk = e.data;
      shown += String((chunk.data as { delta?: string }).delta ?? '');
    } else if (e.type === 'reset') {
      const attempt: LiveAttempt = e.data;
      void attempt.attempt;
      shown = '';
    } else if (e.type === 'turn_failed') {
      const failed: LiveTurnFailed = e.data;
      void failed.reason;
    } else if (e.type === 'error') {
      const error: LiveError = e.data;
      throw new Error(error.message);
    } else {
      const committed: LiveTurnCommitted = e.data;
      void committed.messages;
      break;
    }
  }
  await watch.close();
  return shown;
}

// corral: a watch of an actor's turns
export async function watchTurns(corral: Corral, signal: AbortSignal): Promise<TurnEventKind[]> {
  const options: WatchOptions = { signal, maxBuffered: DEFAULT_MAX_BUFFERED };
  const watch: TurnWatch = await corral.watchTurns(ref, options);
  const kinds: TurnEventKind[] = [];
  for await (const e of watch as AsyncIterable<WatchEvent>) {
    if (e.kind === 'gap') {
      const gap: WatchGap = e;
      void gap.since;
      continue;
    }
    const event: TurnEvent = e;
    kinds.push(event.kind);
    if (event.kind === 'committed') break;
  }
  await watch.close();
  return kinds.filter((k) => TURN_EVENT_KINDS.includes(k) && TURN_CHANNELS.length > 0 && turnChannelOf(text).length > 0);
}

// corral: the daemon in the application's process
export async function runDaemon(logger?: Logger): Promise<void> {
  const localWorkers: LocalWorkersOptions = { count: 1 };
  const mode: DeadLetterMode | undefined = undefined;
  const options: DaemonOptions = {
    endpoint: 'tcp://127.0.0.1:0',
    localWorkers,
    ...(logger ? { logger } : {}),
    ...(mode ? { deadLetterMode: mode } : {}),
  };
  const daemon: CorralDaemon = createDaemon(options);
  await daemon.start();
  const state: DaemonState = daemon.state;
  const config: Config = daemon.config;
  const stopOptions: StopDaemonOptions = { drainMs: 5_000 };
  void [state, config.endpoint, localWorkerId('host', config.endpoint, 1)];
  await daemon.stop(stopOptions);
}

// corral/worker: a handler and its worker
const onSteer: SteerListener = (input: WorkerJsonValue) => void input;
const handler: TurnHandler = async (ctx: TurnContext): Promise<TurnOutcome> => {
  const off = ctx.onSteer(onSteer);
  try {
    const page: HistoryPage = await ctx.history({ limit: 10 });
    const seen: TranscriptMessage[] = page.messages;
    const emit: Emit[] = [{ actor: text, data: { seen: seen.length } }];
    // outbound messages go to sinks an operator added (`corral sinks add`); none here
    const deliver: Deliver[] = seen.length < 0 ? [{ sink: 'chat', body: { text }, key: ctx.turnRef.event_id }] : [];
    // every event the turn answers (more than one when the actor's policy coalesced them)
    const data: JsonValue = ctx.events.map((e) => e.data);
    const turnRef: TurnRef = ctx.turnRef;
    ctx.stream({ delta: 'thinking… ' });
    void turnRef.actor_epoch;
    return { messages: [{ role: 'assistant', content: { text: `got ${JSON.stringify(data)}` } }], emit, deliver };
  } finally {
    off();
  }
};
const workerOptions: CreateWorkerOptions = {
  endpoint: 'tcp://127.0.0.1:5555',
  keyFile: 'worker.key',
  capacity: 4,
  handler,
  startTimeoutMs: DEFAULT_START_TIMEOUT_MS,
};
const worker: Worker = createWorker(workerOptions);
const stopOptions: StopOptions = { graceMs: 1_000 };
export function keyOf(file: WorkerKeyFile): string {
  return file.worker_id;
}
export function contextOf(wire: TurnContextWire): number {
  return wire.messages.length;
}

export async function runWorker(): Promise<void> {
  try {
    await worker.start();
  } catch (e) {
    if (e instanceof WorkerCorralError) {
      const code: WorkerErrorCode = e.code;
      throw new Error(`refused: ${code}`, { cause: e });
    }
    const failure = e as HandlerError;
    throw failure;
  } finally {
    await worker.stop(stopOptions);
  }
}

// corral/testing: an environment for the application's tests, and a clock that moves when told to
export async function testOnce(): Promise<CommittedTurn> {
  const options: TestEnvironmentOptions = { handler };
  const env: TestEnvironment = await createTestEnvironment(options);
  try {
    const more: TestWorkerOptions = { handler, workerId: 'second' };
    await env.startWorker(more);
    const { eventId } = await env.corral.send(ref, { text: 'test' });
    return await env.corral.waitForTurn(eventId);
  } finally {
    await env.stop();
  }
}
const clock: Clock = new ManualClock();
const timer: TimerHandle = clock.setTimeout(() => undefined, 1_000);
timer.cancel();

export const used = { valid, reasons, clock };
