/**
 * Public types of the one-for-one supervisor. The behaviour behind them is in supervisor.ts and
 * docs/supervision.md.
 */
import type { Clock } from '../base/clock.ts';

/**
 * When a child that ended is started again.
 * - `permanent`: after any end, including a normal return.
 * - `transient`: only after an error result or a thrown exception.
 * - `temporary`: never; a failure is recorded and surfaced when the supervisor ends.
 */
export type RestartPolicy = 'permanent' | 'transient' | 'temporary';

/** An explicit error result: the child ended badly without throwing. */
export interface ChildError {
  readonly error: unknown;
}

/**
 * What a child factory resolves to. `undefined` (an `async` function that just returns) is a
 * normal end; `{ error }` is an error result, handled exactly like a thrown exception.
 */
export type ChildExit = void | ChildError;

/** Build an error result: `return childError(e)` is equivalent to `throw e` for the supervisor. */
export function childError(error: unknown): ChildError {
  return { error };
}

/** True when a factory's resolved value is an error result (`{ error }`). */
export function isChildError(value: unknown): value is ChildError {
  return typeof value === 'object' && value !== null && 'error' in value;
}

/** Handed to each run of a factory. One instance per generation. */
export interface ChildRun {
  readonly name: string;
  /** 1 for the first start, +1 on every restart. */
  readonly generation: number;
  /** The supervisor's clock; helpers (e.g. `processChild`) use it for their own timers. */
  readonly clock: Clock;
  /**
   * Report that initialisation finished. Emits `ready` once per generation, only for children
   * registered with `readiness: true`; later calls and calls from an old generation are ignored.
   */
  markReady(): void;
}

/**
 * Starts one generation of a child. Must watch `signal`: when it aborts the child should finish
 * its cleanup and return. Cancellation is cooperative (see docs/supervision.md).
 */
export type ChildFactory<C> = (ctx: C, signal: AbortSignal, run: ChildRun) => Promise<ChildExit>;

export interface ChildSpec<C> {
  /** Unique within the supervisor; appears in events, errors and shutdown results. */
  name: string;
  factory: ChildFactory<C>;
  policy: RestartPolicy;
  /** When true the child is expected to call `run.markReady()`; a `ready` event follows. */
  readiness?: boolean;
  /** Overrides the supervisor's `restartDelayMs` for this child. */
  restartDelayMs?: number;
}

export interface SupervisorOptions {
  /** Used in error messages; default `"supervisor"`. */
  name?: string;
  /** Default `systemClock`. Every delay, window and timeout of the supervisor uses it. */
  clock?: Clock;
  /** Pause before a restart; default 10 ms. */
  restartDelayMs?: number;
  /**
   * Restart intensity: at most `maxRestarts` (default 5) restarts within a sliding window of
   * `withinMs` (default 10 000), counted across the whole supervisor. One more stops everything.
   */
  maxRestarts?: number;
  /** Width of the restart-intensity window; see `maxRestarts`. */
  withinMs?: number;
  /** Capacity of the event buffer; default 256. The oldest events are dropped when full. */
  eventBufferSize?: number;
  /** The parent's cancellation: aborting it stops every child (never a reason to restart). */
  signal?: AbortSignal;
  /**
   * Keep running with zero children, ending only on shutdown or cancellation. For supervisors
   * of dynamic children (the daemon's session controllers), which are often empty.
   */
  keepAlive?: boolean;
}

export type SupervisorState = 'idle' | 'running' | 'stopping' | 'ended';

export type ChildState = 'idle' | 'running' | 'stopping' | 'restart-wait' | 'ended';

export interface ChildStatus {
  name: string;
  policy: RestartPolicy;
  state: ChildState;
  /** 0 before the first start. */
  generation: number;
  /** `markReady()` was called by the current generation. */
  ready: boolean;
  dynamic: boolean;
}

/** A failure the supervisor recorded and will surface from `run()` / `shutdown()`. */
export interface ChildFailure {
  name: string;
  generation: number;
  error: unknown;
  /** At most 1024 UTF-8 bytes. */
  diagnostic: string;
}

/** Why a child ended for good (no restart follows). */
export type StopReason =
  /** It returned normally and its policy does not restart it. */
  | 'normal'
  /** It failed and will not be restarted (temporary policy, or intensity exceeded). */
  | 'failure'
  /** It was asked to stop: removeChild, shutdown, cancellation, or another child's intensity. */
  | 'stop';

export type SupervisorEvent =
  /** Emitted before the factory body of this generation runs. */
  | { type: 'started'; name: string; generation: number; atMs: number }
  | { type: 'ready'; name: string; generation: number; atMs: number }
  | {
      type: 'failed';
      name: string;
      generation: number;
      /** At most 1024 UTF-8 bytes, cut on a character boundary. */
      diagnostic: string;
      willRestart: boolean;
      atMs: number;
    }
  /** A restart is starting `generation` (the new one); a `started` event follows. */
  | { type: 'restarted'; name: string; generation: number; atMs: number }
  | { type: 'stopped'; name: string; generation: number; reason: StopReason; atMs: number }
  /** The reader fell behind: `missed` older events were dropped before this one. */
  | { type: 'lagged'; missed: number };

/** Returned by `nextEvent()` once the supervisor ended and every buffered event was read. */
export interface EndOfEvents {
  readonly type: 'end';
}

export const END_OF_EVENTS: EndOfEvents = Object.freeze({ type: 'end' as const });

export type ShutdownResult =
  /** Every child ended and no failure was recorded. */
  | { kind: 'clean' }
  /** Every child ended, but failures were recorded (first: the fatal error, if any). */
  | { kind: 'failed'; failures: ChildFailure[] }
  /** The deadline passed with these children still running; they are still being tracked. */
  | { kind: 'deadline'; stillRunning: string[] };

export interface ShutdownOptions {
  /** How long to wait for children to end; omitted = wait as long as it takes. */
  deadlineMs?: number;
}

export interface NextEventOptions {
  /** Integer in 1..4 294 967 295 ms, measured on the supervisor's clock. */
  timeoutMs?: number;
}

/** The control and monitoring surface of a started supervisor. */
export interface SupervisorHandle<C> {
  readonly name: string;
  readonly state: SupervisorState;
  /**
   * Settles after every child ended and cleanup finished: resolves when clean, rejects with the
   * fatal error (`restart_intensity`) or the first recorded failure. Pre-marked as handled, so
   * dropping it never crashes the process with an unhandled rejection.
   */
  readonly done: Promise<void>;
  /** Add a child while running (or before start). Throws `shutdown` once stopping/ended. */
  addChild(spec: ChildSpec<C>): void;
  /** Stop and forget a child (not a failure, no restart). Resolves `false` if unknown. */
  removeChild(name: string): Promise<boolean>;
  shutdown(opts?: ShutdownOptions): Promise<ShutdownResult>;
  nextEvent(opts?: NextEventOptions): Promise<SupervisorEvent | EndOfEvents>;
  /** Non-blocking `nextEvent()`: `null` when nothing is buffered and the stream is open. */
  tryNextEvent(): SupervisorEvent | EndOfEvents | null;
  /** Async iteration over `nextEvent()` until the end of the stream. */
  events(): AsyncGenerator<SupervisorEvent, void, undefined>;
  children(): ChildStatus[];
  failures(): ChildFailure[];
}
