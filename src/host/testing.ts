/**
 * `createTestEnvironment`: everything an application's own tests need to run turns through
 * corral, set up by one call and torn down by one call (as Temporal's test environment does for
 * workflows): a throwaway embedded PostgreSQL, a daemon on a free port, and in-process workers
 * running the test's handler.
 *
 * Rules:
 * T1 It runs as production does: CURVE on (unless `insecure`), the daemon's keypair and each
 *    worker's key issued into a temporary CORRAL_HOME, the schema migrated on start.
 * T2 `createTestEnvironment` resolves once every worker is registered (its `start()` resolved on
 *    the welcome); when a step fails, what was started is stopped and the folder removed before it
 *    rejects.
 * T3 `stop()` leaves nothing behind: workers stopped, the daemon stopped, the embedded PostgreSQL
 *    stopped, the temporary folder removed. Idempotent.
 * T4 The embedded cluster is made for throwaway use (fsync off): fast, not crash-safe.
 *
 * The environment's `corral` is a client connected to its database (another connects with its `databaseUrl`).
 */
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Config } from '../config.ts';
import { ensureEmbeddedPostgres, type EmbeddedServer } from '../db/postgres/embedded.ts';
import { CorralError, toError } from '../base/errors.ts';
import { silentLogger, type Logger } from '../base/logger.ts';
import { createWorker } from '../worker/create.ts';
import type { TurnHandler } from '../worker/turn.ts';
import type { Worker } from '../worker/types.ts';
import { keyPaths, ensureLocalWorkerKey } from '../fabric/keys.ts';
import { connect, type Corral } from '../client/client.ts';
import { createDaemon, type CorralDaemon } from './daemon.ts';

export type { CorralDaemon } from './daemon.ts';
export type { TurnContext, TurnHandler, TurnOutcome, Worker } from '../worker/create.ts';

export interface TestEnvironmentOptions {
  /** What the environment's workers run for each turn. Needed when `workers` is above 0. */
  handler?: TurnHandler;
  /** In-process workers started with the environment, 0..64. Default 1 (0 without a handler). */
  workers?: number;
  /** Concurrent turns of each worker. Default 4. */
  capacity?: number;
  /** Daemon settings over the environment's (src/config.ts; e.g. `{ retryLimit: 0 }`). */
  config?: Partial<Config>;
  /** A database to use instead of an embedded server: migrated, never emptied or dropped. */
  databaseUrl?: string;
  /** CURVE off (daemon and workers). Default off: CURVE on, as in production. */
  insecure?: boolean;
  /** Where the daemon and the workers log. Default: nowhere. */
  logger?: Logger;
}

export interface TestWorkerOptions {
  handler: TurnHandler;
  /** Default `test-worker-<n>`. */
  workerId?: string;
  /** Default: the environment's `capacity`. */
  capacity?: number;
}

export interface TestEnvironment {
  /** The database the daemon uses: what a client connects to. */
  readonly databaseUrl: string;
  /** The daemon's endpoint (a free loopback port). */
  readonly endpoint: string;
  /** The temporary CORRAL_HOME: the daemon's keys, the workers' key files, the embedded cluster. */
  readonly homeDir: string;
  readonly daemon: CorralDaemon;
  /** A client connected to the environment's database (`connect({ databaseUrl })`), closed by `stop()`. */
  readonly corral: Corral;
  /** The workers started so far, the environment's first. */
  readonly workers: readonly Worker[];
  /** Issues a key for `workerId` under `homeDir`; returns its key file (for a worker the test runs itself). */
  issueWorkerKey(workerId: string): string;
  /** Starts one more in-process worker; resolves once it is registered. Stopped with the environment. */
  startWorker(opts: TestWorkerOptions): Promise<Worker>;
  /** Stops everything and removes the temporary folder (rule T3). */
  stop(): Promise<void>;
}

/** Settings that keep a test fast; `config` overrides them. */
const TEST_SETTINGS: Partial<Config> = { drainMs: 1_000, pollIntervalMs: 200, heapTrimIdleMs: 0 };

/** Starts a database, a daemon and `workers` workers running `handler` (rules T1, T2). */
export async function createTestEnvironment(options: TestEnvironmentOptions = {}): Promise<TestEnvironment> {
  const workerCount = options.workers ?? (options.handler ? 1 : 0);
  if (!Number.isInteger(workerCount) || workerCount < 0 || workerCount > 64) {
    throw new CorralError('invalid_argument', 'workers must be an integer in 0..64');
  }
  if (workerCount > 0 && !options.handler) throw new CorralError('invalid_argument', 'workers need a handler');
  const logger = options.logger ?? silentLogger;
  const homeDir = await mkdtemp(join(tmpdir(), 'corral-test-env-'));
  // as root the embedded PostgreSQL runs as the `postgres` user, which must reach its folder
  await chmod(homeDir, 0o755);
  const workers: Worker[] = [];
  let embedded: EmbeddedServer | undefined;
  let daemon: CorralDaemon | undefined;
  let client: Corral | undefined;
  let stopping: Promise<void> | undefined;
  const teardown = async (): Promise<void> => {
    const problems: unknown[] = [];
    const step = (p: Promise<unknown>) => p.catch((e: unknown) => void problems.push(e));
    if (client) await step(client.close());
    await Promise.all(workers.map((w) => step(w.stop())));
    if (daemon) await step(daemon.stop());
    if (embedded) await step(embedded.stop());
    await step(rm(homeDir, { recursive: true, force: true }));
    if (problems.length > 0) {
      throw new CorralError('internal', `the test environment did not stop cleanly: ${toError(problems[0]).message}`, {
        cause: problems[0],
      });
    }
  };
  try {
    let databaseUrl = options.databaseUrl;
    if (!databaseUrl) {
      embedded = await ensureEmbeddedPostgres({ homeDir, ephemeral: true });
      databaseUrl = embedded.url;
    }
    const running = (daemon = createDaemon({
      ...TEST_SETTINGS,
      endpoint: 'tcp://127.0.0.1:0',
      ...options.config,
      homeDir,
      databaseUrl,
      ...(options.insecure ? { insecure: true } : {}),
      logger,
    }));
    await running.start();
    const endpoint = running.endpoint!;
    const issueWorkerKey = (workerId: string): string => ensureLocalWorkerKey(keyPaths(homeDir), workerId);
    const startWorker = async (opts: TestWorkerOptions): Promise<Worker> => {
      if (stopping) throw new CorralError('shutdown', 'the test environment is stopped');
      const worker = createWorker({
        endpoint,
        handler: opts.handler,
        workerId: opts.workerId ?? `test-worker-${workers.length + 1}`,
        capacity: opts.capacity ?? options.capacity ?? 4,
        logger,
        ...(options.insecure ? { insecure: true } : { homeDir }),
      });
      workers.push(worker);
      await worker.start();
      return worker;
    };
    for (let i = 0; i < workerCount; i++) await startWorker({ handler: options.handler! });
    const corral = (client = await connect({ databaseUrl, applicationName: 'corral-test-env', logger }));
    return {
      databaseUrl,
      endpoint,
      homeDir,
      daemon: running,
      corral,
      workers,
      issueWorkerKey,
      startWorker,
      stop: () => (stopping ??= teardown()),
    };
  } catch (e) {
    await teardown().catch(() => undefined);
    throw e;
  }
}
