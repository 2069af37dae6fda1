/**
 * Every public export of corral, used from a strict TypeScript application (`tsconfig.json` here:
 * `strict`, `moduleResolution: nodenext`, no `skipLibCheck`). The package test type-checks this
 * file against the packed package and fails when an entry point exports a name this file does not
 * import: a new export is added here, with a use of it.
 */
import {
  CorralError,
  FenceRejected,
  FENCE_REASONS,
  actorKey,
  formatActorKey,
  isValidActorPart,
  parseActorKey,
  type ActorKey,
  type ErrorCode,
  type FenceReason,
  type JsonValue,
} from 'corral';
import {
  CorralError as WorkerCorralError,
  createWorker,
  type Emit,
  type ErrorCode as WorkerErrorCode,
  type HandlerError,
  type HistoryPage,
  type JsonValue as WorkerJsonValue,
  type SteerListener,
  type StopOptions,
  type TurnContext,
  type TurnHandler,
  type TurnOutcome,
  type Worker,
  type WorkerHooks,
  type WorkerOptions,
} from 'corral/worker';
import { ManualClock, type Clock, type TimerHandle } from 'corral/testing';

// corral: actor keys and typed errors
const key: ActorKey = actorKey('agent-1', 'session-1');
const text: string = formatActorKey(key);
const parsed: ActorKey = parseActorKey(text);
const valid: boolean = isValidActorPart(parsed.agentUid);
const reasons: readonly FenceReason[] = FENCE_REASONS;

export function describeError(e: unknown): string {
  if (e instanceof FenceRejected) return `fenced: ${e.reason}`;
  if (e instanceof CorralError) {
    const code: ErrorCode = e.code;
    return `${code}${e.retryable ? ' (retryable)' : ''}`;
  }
  return String(e);
}

// corral/worker: a handler and its worker
const onSteer: SteerListener = (input: WorkerJsonValue) => void input;
const handler: TurnHandler = async (ctx: TurnContext): Promise<TurnOutcome> => {
  const off = ctx.onSteer(onSteer);
  try {
    const page: HistoryPage = await ctx.history({ limit: 10 });
    const emit: Emit[] = [{ actor: text, data: { seen: page.messages.length } }];
    const data: JsonValue = ctx.event.data;
    return { messages: [{ role: 'assistant', content: { text: `got ${JSON.stringify(data)}` } }], emit };
  } finally {
    off();
  }
};
const hooks: WorkerHooks = {};
const options: WorkerOptions = { endpoint: 'tcp://127.0.0.1:5555', workerId: 'worker-1', capacity: 4, handler, hooks };
const worker: Worker = createWorker(options);
const stopOptions: StopOptions = { graceMs: 1_000 };

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

// corral/testing: a clock that moves when told to
const clock: Clock = new ManualClock();
const timer: TimerHandle = clock.setTimeout(() => undefined, 1_000);
timer.cancel();

export const used = { valid, reasons, hooks, clock };
