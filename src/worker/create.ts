/**
 * The public worker entry: `createWorker({ endpoint, keyFile | key, handler, … })`, the SDK of
 * src/worker/sdk.ts with its key resolved (src/worker/credentials.ts) and a `start()` that
 * resolves on the daemon's welcome.
 *
 * Rules:
 * C1 `start()` resolves when the daemon has registered the worker (its `worker_welcome`).
 * C2 It rejects with a typed `CorralError` as soon as the daemon refuses the worker (see
 *    src/worker/refusals.ts: `key_refused`, `server_key_mismatch`, `curve_mismatch`,
 *    `registration_refused`), with `timeout` when no welcome came within `startTimeoutMs` (the
 *    daemon down or unreachable), and with `shutdown` when `stop()` was called first. Each is
 *    logged as an error first; the worker is then stopped (its socket closed), never left retrying.
 * C3 Once started, the worker behaves as the SDK's: it reconnects and registers again by itself
 *    (a daemon restarted, a key put back on the allow-list), and logs every refusal.
 * C4 Nothing is read from the environment unless `env` is given (`process.env`, say): then
 *    `CORRAL_WORKER_KEY_FILE`, `CORRAL_SERVER_KEY`, `CORRAL_HOME`, `CORRAL_DAEMON_KEY_FILE` and
 *    `CORRAL_ALLOWLIST_FILE` fill in the options left out.
 */
import { resolve } from 'node:path';
import { systemClock, type Clock, type TimerHandle } from '../base/clock.ts';
import { DEFAULTS } from '../config.ts';
import { CorralError, toError } from '../base/errors.ts';
import type { WorkerKeyFile } from '../fabric/keys.ts';
import { silentLogger, type Logger } from '../base/logger.ts';
import { resolveWorkerKey } from './credentials.ts';
import { createWorker as createSdkWorker } from './sdk.ts';
import type { TurnHandler } from './turn.ts';
import type { StopOptions, Worker } from './types.ts';

export type { Emit, Deliver, HandlerError, HistoryPage, SteerListener, TurnContext, TurnHandler, TurnOutcome } from './turn.ts';
export type { StopOptions, Worker } from './types.ts';
export type { WorkerKeyFile } from '../fabric/keys.ts';
export type { JsonValue, TranscriptMessage, TurnContextWire, TurnRef } from '../fabric/protocol.ts';
export { CorralError, type ErrorCode } from '../base/errors.ts';

/** How long `start()` waits for the welcome by default. */
export const DEFAULT_START_TIMEOUT_MS = 30_000;

export interface CreateWorkerOptions {
  /** The daemon's endpoint, e.g. `tcp://daemon-host:5555`. */
  endpoint: string;
  /** Runs each turn. */
  handler: TurnHandler;
  /** The key file `corral keys add-worker ID --out FILE` wrote: all a worker on another host needs. */
  keyFile?: string;
  /** The key file's content instead (the parsed object or its JSON text, e.g. from a secret store). */
  key?: WorkerKeyFile | string;
  /**
   * With a key: may only repeat the key's worker id (another one throws `invalid_argument`).
   * Without a key, on the daemon's host: the id to issue a key for under `homeDir` (default
   * `<host>-<pid>`; give a stable one, each id gets its own allow-list entry).
   */
  workerId?: string;
  /** The daemon's public key, overriding the key's `server_key`. */
  serverKey?: string;
  /** With no key: the daemon's `CORRAL_HOME`, where a key is issued on first use. Default `.corral`. */
  homeDir?: string;
  /** Connect without CURVE: only to a daemon started with `--insecure`. No key is used. */
  insecure?: boolean;
  /** Concurrent turns, 1..1024 (the daemon's allow-list may cap it lower). Default 1. */
  capacity?: number;
  /** How long `start()` waits for the daemon's welcome. Default 30000; `Infinity`: as long as it takes. */
  startTimeoutMs?: number;
  /** Default: no logs. */
  logger?: Logger;
  clock?: Clock;
  /** Environment variables for the key options left out (rule C4). Default none. */
  env?: Record<string, string | undefined>;
  /** Until the welcome says otherwise. Default 2000. */
  heartbeatIntervalMs?: number;
  /** How long `ctx.rpc` waits for the daemon's answer. Default 15000. */
  rpcTimeoutMs?: number;
  /** Largest message either way, in bytes; as the daemon's `maxMessageBytes`. Default 1 MiB. */
  maxMessageBytes?: number;
  /** Free-form SDK name/version sent in worker_ready. */
  sdk?: string;
}

/**
 * A worker for `handler`, connected to the daemon at `endpoint` once `start()` is called. Throws
 * at once for options that cannot work: `invalid_argument` (an id that is not the key's, a bad
 * capacity or timeout), `invalid_config` (a key file that cannot be read).
 */
export function createWorker(options: CreateWorkerOptions): Worker {
  const env = options.env ?? {};
  const keyFile = options.keyFile ?? (options.key === undefined ? env.CORRAL_WORKER_KEY_FILE || undefined : undefined);
  const serverKey = options.serverKey ?? (env.CORRAL_SERVER_KEY || undefined);
  if (options.insecure && (options.key !== undefined || options.keyFile !== undefined)) {
    throw new CorralError('invalid_argument', 'an insecure worker uses no key: give `insecure` or a key, not both');
  }
  const timeoutMs = options.startTimeoutMs ?? DEFAULT_START_TIMEOUT_MS;
  if (!(timeoutMs > 0)) throw new CorralError('invalid_argument', 'startTimeoutMs must be a positive number of milliseconds');
  const { workerId, credentials } = resolveWorkerKey({
    ...(keyFile !== undefined ? { keyFile: resolve(keyFile) } : {}),
    ...(options.key !== undefined ? { key: options.key } : {}),
    ...(options.workerId !== undefined ? { workerId: options.workerId } : {}),
    ...(serverKey !== undefined ? { serverKey } : {}),
    homeDir: resolve(options.homeDir ?? (env.CORRAL_HOME || DEFAULTS.homeDir)),
    ...(env.CORRAL_DAEMON_KEY_FILE ? { daemonKeyFile: resolve(env.CORRAL_DAEMON_KEY_FILE) } : {}),
    ...(env.CORRAL_ALLOWLIST_FILE ? { allowlistFile: resolve(env.CORRAL_ALLOWLIST_FILE) } : {}),
    insecure: options.insecure ?? false,
  });
  return new WaitingWorker(options, workerId, credentials, timeoutMs);
}

interface Waiter {
  resolve(): void;
  reject(e: CorralError): void;
}

/** The SDK's worker, with a `start()` that waits for the welcome (rules C1, C2). */
class WaitingWorker implements Worker {
  readonly workerId: string;
  private readonly sdk: Worker;
  private readonly log: Logger;
  private readonly clock: Clock;
  private readonly endpoint: string;
  private readonly timeoutMs: number;
  private waiter: Waiter | undefined;
  private starting: Promise<void> | undefined;
  private stopped = false;

  constructor(
    options: CreateWorkerOptions,
    workerId: string,
    credentials: ReturnType<typeof resolveWorkerKey>['credentials'],
    timeoutMs: number,
  ) {
    this.workerId = workerId;
    this.endpoint = options.endpoint;
    this.timeoutMs = timeoutMs;
    this.clock = options.clock ?? systemClock;
    this.log = (options.logger ?? silentLogger).child({ component: 'worker', workerId });
    this.sdk = createSdkWorker({
      endpoint: options.endpoint,
      workerId,
      handler: options.handler,
      clock: this.clock,
      ...(options.logger ? { logger: options.logger } : {}),
      ...(options.capacity !== undefined ? { capacity: options.capacity } : {}),
      ...(options.heartbeatIntervalMs !== undefined ? { heartbeatIntervalMs: options.heartbeatIntervalMs } : {}),
      ...(options.rpcTimeoutMs !== undefined ? { rpcTimeoutMs: options.rpcTimeoutMs } : {}),
      ...(options.maxMessageBytes !== undefined ? { maxMessageBytes: options.maxMessageBytes } : {}),
      ...(options.sdk !== undefined ? { sdk: options.sdk } : {}),
      ...(credentials ? { curve: credentials.curve, auth: credentials.auth } : {}),
      onRegistered: () => this.settle(undefined),
      onRefused: (e) => this.settle(e),
    });
  }

  start(): Promise<void> {
    this.starting ??= this.startOnce();
    return this.starting;
  }

  private async startOnce(): Promise<void> {
    if (this.stopped) throw this.failed(new CorralError('shutdown', `worker ${this.workerId} was stopped before it started`));
    let timer: TimerHandle | undefined;
    const welcomed = new Promise<void>((resolve, reject) => {
      this.waiter = { resolve, reject };
      if (Number.isFinite(this.timeoutMs)) {
        timer = this.clock.setTimeout(
          () =>
            this.settle(
              new CorralError(
                'timeout',
                `no welcome from the daemon at ${this.endpoint} within ${this.timeoutMs} ms: is it running, and is this its endpoint?`,
                { details: { workerId: this.workerId, endpoint: this.endpoint } },
              ),
            ),
          this.timeoutMs,
        );
      }
    });
    try {
      await this.sdk.start();
      await welcomed;
    } catch (e) {
      const error = e instanceof CorralError ? e : new CorralError('internal', toError(e).message, { cause: e });
      this.failed(error);
      await this.sdk.stop();
      throw error;
    } finally {
      timer?.cancel();
      this.waiter = undefined;
    }
  }

  /** C2: every failed start is logged, with its code (a stop asked for is no error). */
  private failed(error: CorralError): CorralError {
    const level = error.code === 'shutdown' ? 'info' : 'error';
    this.log[level]({ code: error.code, endpoint: this.endpoint }, `worker did not start: ${error.message}`);
    return error;
  }

  /** The start under way learns its outcome; a later welcome or refusal concerns only the logs (C3). */
  private settle(error: CorralError | undefined): void {
    const waiter = this.waiter;
    if (!waiter) return;
    this.waiter = undefined;
    if (error) waiter.reject(error);
    else waiter.resolve();
  }

  async stop(opts?: StopOptions): Promise<void> {
    this.stopped = true;
    this.settle(new CorralError('shutdown', `worker ${this.workerId} was stopped while it started`));
    await this.sdk.stop(opts);
  }

  inFlight(): number {
    return this.sdk.inFlight();
  }

  isRegistered(): boolean {
    return this.sdk.isRegistered();
  }

  capacity(): number {
    return this.sdk.capacity();
  }
}
