/**
 * Where a chaos scenario runs: the short timings every child process gets (as CORRAL_* variables),
 * the queue policy the harness's own producer uses, and the PostgreSQL server scenarios get their
 * databases from (and, if this process controls it, how to restart it).
 */
import { DEFAULTS, loadConfig, type Config } from '../../src/config.ts';
import { queuesOf } from '../../src/queue/boss.ts';
import { createDatabaseOn } from '../helpers/databases.ts';

/** Short timings so faults resolve in seconds (each maps to a CORRAL_* variable). */
export interface ChaosTimings {
  leaseMs: number;
  progressIntervalMs: number;
  workerHeartbeatMs: number;
  workerStaleMs: number;
  watchdogIntervalMs: number;
  recoveryIntervalMs: number;
  retryLimit: number;
  retryDelayS: number;
  retryDelayMaxS: number;
  pollIntervalMs: number;
  /** pg-boss expiry backstop for an active job nobody settles (CORRAL_JOB_EXPIRE_S, min 5). */
  jobExpireS?: number;
  /** pg-boss fails an active job its daemon stopped touching (CORRAL_JOB_HEARTBEAT_S, min 10). */
  jobHeartbeatS?: number;
}

export const CHAOS_TIMINGS: ChaosTimings = {
  leaseMs: 2000,
  progressIntervalMs: 400,
  workerHeartbeatMs: 200,
  workerStaleMs: 1000,
  watchdogIntervalMs: 200,
  recoveryIntervalMs: 1000,
  retryLimit: 5,
  retryDelayS: 1,
  retryDelayMaxS: 2,
  pollIntervalMs: 200,
  jobHeartbeatS: 10,
};

export const QUEUE = queuesOf(DEFAULTS);

/** The full configuration the harness's own pg-boss uses to create the queues (same policy as the daemons). */
export function queueConfig(t: ChaosTimings): Config {
  return loadConfig(
    {
      retryLimit: t.retryLimit,
      retryDelaySeconds: t.retryDelayS,
      retryDelayMaxSeconds: t.retryDelayMaxS,
      ...(t.jobExpireS ? { jobExpireSeconds: t.jobExpireS } : {}),
      ...(t.jobHeartbeatS ? { jobHeartbeatSeconds: t.jobHeartbeatS } : {}),
    },
    {},
  );
}

export function childEnv(databaseUrl: string, t: ChaosTimings, homeDir: string, logLevel = 'info'): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  // Inherit the basics (PATH, HOME, …) but none of the caller's corral settings.
  for (const [k, v] of Object.entries(process.env)) {
    if (k.startsWith('CORRAL_') || k === 'DATABASE_URL' || k.startsWith('VITEST') || k === 'NODE_OPTIONS') continue;
    env[k] = v;
  }
  Object.assign(env, {
    DATABASE_URL: databaseUrl,
    CORRAL_HOME: homeDir,
    CORRAL_LOG_LEVEL: logLevel,
    CORRAL_LEASE_MS: String(t.leaseMs),
    CORRAL_PROGRESS_INTERVAL_MS: String(t.progressIntervalMs),
    CORRAL_WORKER_HEARTBEAT_MS: String(t.workerHeartbeatMs),
    CORRAL_WORKER_STALE_MS: String(t.workerStaleMs),
    CORRAL_WATCHDOG_INTERVAL_MS: String(t.watchdogIntervalMs),
    CORRAL_RECOVERY_INTERVAL_MS: String(t.recoveryIntervalMs),
    CORRAL_RETRY_LIMIT: String(t.retryLimit),
    CORRAL_RETRY_DELAY_S: String(t.retryDelayS),
    CORRAL_RETRY_DELAY_MAX_S: String(t.retryDelayMaxS),
    CORRAL_POLL_INTERVAL_MS: String(t.pollIntervalMs),
    CORRAL_DEAD_LETTER_MODE: 'continue',
    ...(t.jobExpireS ? { CORRAL_JOB_EXPIRE_S: String(t.jobExpireS) } : {}),
    ...(t.jobHeartbeatS ? { CORRAL_JOB_HEARTBEAT_S: String(t.jobHeartbeatS) } : {}),
  });
  return env;
}

export interface ChaosDatabase {
  url: string;
  name: string;
  /** The schema (corral migrations and pg-boss) is already there, e.g. a test template clone. */
  migrated?: boolean;
  drop(): Promise<void>;
}

/** Where scenarios get their databases (and, if possible, how to restart the server). */
export interface ChaosEnvironment {
  createDatabase(tag: string): Promise<ChaosDatabase>;
  /** Restarts the PostgreSQL server (only for a server this process controls). */
  restartServer?: (downMs: number) => Promise<void>;
  describe: string;
}

/** Databases created on `serverUrl` (an admin connection, e.g. the `postgres` database). */
export function serverEnvironment(
  serverUrl: string,
  restartServer?: (downMs: number) => Promise<void>,
  describe = 'server',
): ChaosEnvironment {
  return {
    describe,
    ...(restartServer ? { restartServer } : {}),
    async createDatabase(tag) {
      const name = `corral_chaos_${tag
        .replace(/[^a-z0-9]/gi, '_')
        .toLowerCase()
        .slice(0, 20)}_${Math.random().toString(16).slice(2, 8)}`;
      return createDatabaseOn(serverUrl, name);
    },
  };
}
