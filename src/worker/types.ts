/** The worker SDK's handle and its stop options (src/worker/sdk.ts builds it, src/worker/create.ts wraps it). */

export interface StopOptions {
  /** Let running turns finish for up to this long before aborting them. Default 0. */
  graceMs?: number;
  /** After aborting, wait at most this long for handlers to settle. Default 5000. */
  abortWaitMs?: number;
  /** How long the socket may keep flushing final messages on close. Default 500. */
  lingerMs?: number;
}

export interface Worker {
  readonly workerId: string;
  /**
   * Connect and send worker_ready. This SDK's `start()` resolves without waiting for the daemon
   * (it may be down: the worker registers once it is up); the public `createWorker` of
   * src/worker/create.ts resolves on the daemon's welcome instead.
   */
  start(): Promise<void>;
  /** Refuse new turns, abort running ones (after `graceMs`), flush, close. Idempotent. */
  stop(opts?: StopOptions): Promise<void>;
  /** Turns whose handler has not settled. */
  inFlight(): number;
  /** True between a worker_welcome and the next sign the daemon forgot this worker. */
  isRegistered(): boolean;
  /**
   * How many turns this worker runs at once: its `capacity`, or the lower one the daemon's last
   * welcome said it registered.
   */
  capacity(): number;
}
