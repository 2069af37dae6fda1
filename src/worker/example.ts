/**
 * The example worker: an echo handler driven by the event's data, used by `corral worker`,
 * the end-to-end tests and the crash tests.
 *
 * Event data it understands (fields combine):
 * - `{"text": "hi"}`         → one assistant message `{ text: "echo: hi" }`
 * - `{"delayMs": N}`          → waits N ms first (aborted by cancel/stop through ctx.signal)
 * - `{"fail": true}`          → throws; the SDK sends turn_error "example worker asked to fail"
 * - `{"failCode": "x", "retryable": false}` with fail → chooses the error's code and flag
 * - anything else             → `{ text: "echo: " + JSON.stringify(data) }`
 * A steer received before the reply is included as `steered: <last steer input>`.
 */
import type { Clock } from '../clock.ts';
import { systemClock } from '../clock.ts';
import type { Logger } from '../logger.ts';
import type { JsonValue, TurnResult, WorkerMessage } from '../fabric/protocol.ts';
import { createWorker, type TurnContext, type TurnOutcome, type Worker, type WorkerHooks } from './sdk.ts';

const MAX_DELAY_MS = 24 * 60 * 60 * 1000;

function asRecord(data: JsonValue): Record<string, JsonValue> | null {
  return data !== null && typeof data === 'object' && !Array.isArray(data) ? data : null;
}

/** Build the example handler; `clock` drives the `delayMs` wait. */
export function createExampleHandler(clock: Clock = systemClock): (ctx: TurnContext) => Promise<TurnOutcome> {
  return async (ctx) => {
    let steered: JsonValue | undefined;
    const unsubscribe = ctx.onSteer((input) => {
      steered = input;
    });
    try {
      const data = ctx.event.data;
      const rec = asRecord(data);
      const delay = rec?.delayMs;
      if (typeof delay === 'number' && Number.isFinite(delay) && delay > 0) {
        await clock.sleep(Math.min(delay, MAX_DELAY_MS), ctx.signal);
      }
      ctx.signal.throwIfAborted();
      if (rec?.fail === true) {
        const err = new Error('example worker asked to fail') as Error & { code?: string; retryable?: boolean };
        if (typeof rec.failCode === 'string') err.code = rec.failCode;
        if (typeof rec.retryable === 'boolean') err.retryable = rec.retryable;
        throw err;
      }
      const text = typeof rec?.text === 'string' ? `echo: ${rec.text}` : `echo: ${JSON.stringify(data)}`;
      const content: Record<string, JsonValue> = { text };
      if (steered !== undefined) content.steered = steered;
      return { messages: [{ role: 'assistant', content }] };
    } finally {
      unsubscribe();
    }
  };
}

/** The handler with the system clock. */
export const exampleHandler = createExampleHandler();

/** Hooks that send every turn_result twice (exercises the daemon's duplicate handling). */
export const duplicateResultHooks: WorkerHooks = {
  beforeSendResult: (msg: TurnResult): WorkerMessage[] => [msg, msg],
};

/** CURVE keys and registration proof (see `workerCredentials` in src/fabric/keys.ts). */
export interface WorkerCredentials {
  curve: { serverKey: string; publicKey: string; secretKey: string };
  auth: { scheme: string; credential: string };
}

export interface ExampleWorkerOptions {
  endpoint: string;
  workerId: string;
  capacity?: number;
  logger: Logger;
  clock?: Clock;
  /** Send every turn_result twice (via the `beforeSendResult` fault point). */
  duplicateResults?: boolean;
  /** Absent: no CURVE (a daemon started with --insecure). */
  credentials?: WorkerCredentials;
}

/** Create and start the example worker. The caller owns `stop()` (and signal handling). */
export async function runExampleWorker(opts: ExampleWorkerOptions): Promise<Worker> {
  const clock = opts.clock ?? systemClock;
  const worker = createWorker({
    endpoint: opts.endpoint,
    workerId: opts.workerId,
    capacity: opts.capacity ?? 1,
    handler: createExampleHandler(clock),
    logger: opts.logger,
    clock,
    sdk: 'corral-ts/0.1 example',
    ...(opts.duplicateResults ? { hooks: duplicateResultHooks } : {}),
    ...(opts.credentials ? { curve: opts.credentials.curve, auth: opts.credentials.auth } : {}),
  });
  await worker.start();
  return worker;
}
