/**
 * `corral/worker`: writing a worker process, the side of corral that runs turns. Everything it does not
 * export is internal.
 */
export { createWorker, type Worker, type WorkerOptions, type StopOptions } from './sdk.ts';
export type { TurnContext, TurnHandler, TurnOutcome, SteerListener, HandlerError, HistoryPage, Emit, WorkerHooks } from './sdk.ts';
export { CorralError, type ErrorCode } from '../errors.ts';
export type { JsonValue } from '../fabric/protocol.ts';
