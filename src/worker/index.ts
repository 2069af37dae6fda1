/**
 * `corral/worker`: writing a worker process, the side of corral that runs turns: `createWorker`
 * and the types of a handler. Everything it does not export is internal. docs/embedding.md
 * documents each export; docs/protocol.md is the wire protocol for a worker in another language.
 */
export { createWorker, DEFAULT_START_TIMEOUT_MS, type CreateWorkerOptions } from './create.ts';
export type {
  Deliver,
  Emit,
  HandlerError,
  HistoryPage,
  SteerListener,
  TurnContext,
  TurnHandler,
  TurnOutcome,
  StopOptions,
  Worker,
} from './create.ts';
export type { WorkerKeyFile, TranscriptMessage, TurnContextWire, TurnRef } from './create.ts';
export { CorralError, type ErrorCode } from '../base/errors.ts';
export type { JsonValue } from '../fabric/protocol.ts';
