/** One-for-one supervision: see docs/supervision.md. */
export { Supervisor } from './supervisor.ts';
export { EventStream, SupervisorEventError, MAX_TIMEOUT_MS, type SupervisorEventErrorKind } from './events.ts';
export { truncateUtf8, describeError, MAX_DIAGNOSTIC_BYTES } from './diagnostics.ts';
export { RestartWindow } from './intensity.ts';
export { processChild, ProcessExitError, type ProcessChildOptions } from './process-child.ts';
export {
  childError,
  isChildError,
  END_OF_EVENTS,
  type RestartPolicy,
  type ChildError,
  type ChildExit,
  type ChildRun,
  type ChildFactory,
  type ChildSpec,
  type SupervisorOptions,
  type SupervisorState,
  type ChildState,
  type ChildStatus,
  type ChildFailure,
  type StopReason,
  type SupervisorEvent,
  type EndOfEvents,
  type ShutdownResult,
  type ShutdownOptions,
  type NextEventOptions,
  type SupervisorHandle,
} from './types.ts';
