/**
 * Configuration, resolved once at the edge (flag > environment > default) and validated.
 * Nothing below the entry points reads `process.env`: components receive a `Config`.
 */
import { resolve } from 'node:path';
import { z } from 'zod';
import { CorralError } from './errors.ts';
import { DEFAULT_PROGRESS_INTERVAL_MS } from './fabric/defaults.ts';
import { DEFAULT_CONTEXT_CACHE_BYTES } from './runtime/context-cache.ts';

export const DEAD_LETTER_MODES = ['continue', 'block'] as const;
export type DeadLetterMode = (typeof DEAD_LETTER_MODES)[number];

const int = (min: number, max = Number.MAX_SAFE_INTEGER) => z.coerce.number().int().min(min).max(max);

const configSchema = z
  .object({
    /** External PostgreSQL; when absent, the embedded server under `homeDir` is used. */
    databaseUrl: z.string().min(1).optional(),
    /** Folder for the embedded database and local state (git-ignored `.corral/`). */
    homeDir: z.string().min(1),
    /**
     * Run as root, where the embedded PostgreSQL's binaries and data go when the `postgres` OS
     * user cannot reach them in place (a checkout or CORRAL_HOME under a closed folder).
     */
    embeddedRootDir: z.string().min(1),
    /** The broker's ROUTER endpoint. */
    endpoint: z.string().regex(/^(tcp|ipc|inproc):\/\/.+/, 'expected tcp://host:port, ipc://path or inproc://name'),
    queueName: z.string().regex(/^[A-Za-z0-9_.-]{1,50}$/),
    bossSchema: z.string().regex(/^[a-z_][a-z0-9_]{0,62}$/),
    /** Lease granted to an activation per dispatch / heartbeat. */
    leaseMs: int(100),
    /** How often a worker reports progress on a running turn (extends the lease). */
    progressIntervalMs: int(50),
    workerHeartbeatMs: int(50),
    /** A worker silent for this long is stale: its unaccepted deliveries go elsewhere. */
    workerStaleMs: int(100),
    /** A warm activation with no current event is stopped after this long. */
    idleTimeoutMs: int(100),
    /**
     * After a busy spell, once no turn was fetched and none is in flight for this long, the daemon
     * gives the memory it grew to back to the system (one memory-reducing GC); 0 = never.
     */
    heapTrimIdleMs: int(0, 86_400_000),
    watchdogIntervalMs: int(10),
    /** On a graceful stop, how long in-flight turns may take to finish. */
    drainMs: int(0, 3_600_000),
    recoveryIntervalMs: int(100),
    /** pg-boss retry policy for actor events (seconds); the default is the 5–120 s contract. */
    retryLimit: int(0, 1000),
    retryDelaySeconds: int(1, 3600),
    retryDelayMaxSeconds: int(1, 86_400),
    /** Backstop: pg-boss expires an active job that no daemon settled for this long. */
    jobExpireSeconds: int(5, 7 * 86_400),
    /**
     * The daemon touches the jobs of its in-flight turns; pg-boss fails (retries) an active job
     * left untouched this long, e.g. when its daemon died before writing an activation.
     */
    jobHeartbeatSeconds: int(10, 3_600),
    deadLetterMode: z.enum(DEAD_LETTER_MODES),
    /** Completed actor events are deleted after this long (0 = never); failed ones never are. */
    completedRetentionSeconds: int(0, 10 * 365 * 86_400),
    fetchBatchSize: int(1, 500),
    /** Fallback poll for delayed retries (NOTIFY wakes new events at once). */
    pollIntervalMs: int(20),
    maxMessageBytes: int(1024),
    /**
     * Largest event payload accepted at enqueue (its JSON, in bytes). Well under
     * `maxMessageBytes`, so a turn_start always fits on the wire with its envelope.
     */
    maxEventBytes: int(16),
    /** `turn_start` context: at most this many latest transcript messages (0 = no context). */
    contextMessages: int(0, 1000),
    /**
     * `turn_start` context: at most this many bytes of message content (JSON). Capped at a quarter
     * of `maxMessageBytes` (the turn_start carries the event too), see `contextLimits`.
     */
    contextBytes: int(0),
    /**
     * Memory for the contexts kept between turns, so the database does not read them again (0 =
     * none kept); dropped whenever the daemon idles (see `heapTrimIdleMs`).
     */
    contextCacheBytes: int(0),
    /** Worker RPC: requests served at once per worker; more are answered `busy`. */
    rpcConcurrency: int(1, 1000),
    /** Worker RPC: a request not served within this long is answered `timeout`. */
    rpcTimeoutMs: int(10, 600_000),
    /** CURVE off (and any worker admitted). Never implied: `--insecure` or CORRAL_INSECURE=1. */
    insecure: z.boolean(),
    /** With `insecure`, also allow binding a non-loopback address. */
    insecureRemote: z.boolean(),
    /** The daemon's keypair file; default `<homeDir>/keys/daemon.key`, created on first start. */
    daemonKeyFile: z.string().min(1).optional(),
    /** The worker allow-list; default `<homeDir>/keys/workers.json`. */
    allowlistFile: z.string().min(1).optional(),
    /** How often the daemon checks the allow-list for changes (revocations take effect within this). */
    keyPollMs: int(20, 60_000),
    /** A worker's key file (`corral keys add-worker`). */
    workerKeyFile: z.string().min(1).optional(),
    /** The daemon's public key (Z85), overriding the one in the worker's key file. */
    serverKey: z.string().length(40).optional(),
    /** Most worker ids registered with one daemon at once. */
    maxWorkers: int(1, 100_000),
    /** Most connections to the broker at once (ZAP refuses the rest). */
    maxConnections: int(1, 1_000_000),
    /** A turn running longer than this is failed (retried), even while it reports progress. */
    maxTurnMs: int(100),
    metricsPort: int(0, 65_535).optional(),
    metricsHost: z.string().min(1),
    logLevel: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']),
    logPretty: z.boolean(),
  })
  .refine((c) => c.retryDelayMaxSeconds >= c.retryDelaySeconds, {
    message: 'retryDelayMaxSeconds must be >= retryDelaySeconds',
  })
  .refine((c) => c.progressIntervalMs < c.leaseMs, { message: 'progressIntervalMs must be shorter than leaseMs' })
  .refine((c) => c.maxEventBytes <= c.maxMessageBytes / 2, {
    message: 'maxEventBytes must be at most half of maxMessageBytes (a turn_start carries the event and its envelope)',
    path: ['maxEventBytes'],
  })
  .refine((c) => !c.insecure || c.insecureRemote || isLocalEndpoint(c.endpoint), {
    message: 'binding a non-loopback address without CURVE needs --insecure-remote (CORRAL_INSECURE_REMOTE=1) as well',
    path: ['insecureRemote'],
  });

/** True for loopback TCP, ipc:// and inproc:// endpoints: the only ones an open fabric may bind by default. */
export function isLocalEndpoint(endpoint: string): boolean {
  if (endpoint.startsWith('ipc://') || endpoint.startsWith('inproc://')) return true;
  const m = /^tcp:\/\/(.+):[^:]+$/.exec(endpoint);
  if (!m) return false;
  const host = m[1]!.replace(/^\[|\]$/g, '').toLowerCase();
  return host === 'localhost' || host === '::1' || /^127\.\d+\.\d+\.\d+$/.test(host);
}

export type Config = z.infer<typeof configSchema>;

export const DEFAULTS: Omit<Config, 'homeDir'> = {
  embeddedRootDir: '/var/lib/corral',
  endpoint: 'tcp://127.0.0.1:5555',
  queueName: 'actor-events',
  bossSchema: 'pgboss',
  leaseMs: 60_000,
  progressIntervalMs: DEFAULT_PROGRESS_INTERVAL_MS,
  workerHeartbeatMs: 2_000,
  workerStaleMs: 10_000,
  idleTimeoutMs: 300_000,
  heapTrimIdleMs: 10_000,
  watchdogIntervalMs: 1_000,
  drainMs: 10_000,
  recoveryIntervalMs: 30_000,
  retryLimit: 5,
  retryDelaySeconds: 5,
  retryDelayMaxSeconds: 120,
  jobExpireSeconds: 86_400,
  jobHeartbeatSeconds: 30,
  deadLetterMode: 'continue',
  completedRetentionSeconds: 7 * 86_400,
  fetchBatchSize: 50,
  pollIntervalMs: 1_000,
  maxMessageBytes: 1024 * 1024,
  maxEventBytes: 256 * 1024,
  contextMessages: 50,
  contextBytes: 64 * 1024,
  contextCacheBytes: DEFAULT_CONTEXT_CACHE_BYTES,
  rpcConcurrency: 8,
  rpcTimeoutMs: 10_000,
  insecure: false,
  insecureRemote: false,
  keyPollMs: 200,
  maxWorkers: 256,
  maxConnections: 1024,
  maxTurnMs: 6 * 3_600_000,
  metricsHost: '127.0.0.1',
  logLevel: 'info',
  logPretty: false,
};

/** Environment variable for each setting (documented in the README). */
export const ENV_NAMES: Partial<Record<keyof Config, string>> = {
  databaseUrl: 'DATABASE_URL',
  homeDir: 'CORRAL_HOME',
  embeddedRootDir: 'CORRAL_EMBEDDED_ROOT',
  endpoint: 'CORRAL_ENDPOINT',
  queueName: 'CORRAL_QUEUE',
  bossSchema: 'CORRAL_BOSS_SCHEMA',
  leaseMs: 'CORRAL_LEASE_MS',
  progressIntervalMs: 'CORRAL_PROGRESS_INTERVAL_MS',
  workerHeartbeatMs: 'CORRAL_WORKER_HEARTBEAT_MS',
  workerStaleMs: 'CORRAL_WORKER_STALE_MS',
  idleTimeoutMs: 'CORRAL_IDLE_TIMEOUT_MS',
  heapTrimIdleMs: 'CORRAL_HEAP_TRIM_IDLE_MS',
  watchdogIntervalMs: 'CORRAL_WATCHDOG_INTERVAL_MS',
  drainMs: 'CORRAL_DRAIN_MS',
  recoveryIntervalMs: 'CORRAL_RECOVERY_INTERVAL_MS',
  retryLimit: 'CORRAL_RETRY_LIMIT',
  retryDelaySeconds: 'CORRAL_RETRY_DELAY_S',
  retryDelayMaxSeconds: 'CORRAL_RETRY_DELAY_MAX_S',
  jobExpireSeconds: 'CORRAL_JOB_EXPIRE_S',
  jobHeartbeatSeconds: 'CORRAL_JOB_HEARTBEAT_S',
  deadLetterMode: 'CORRAL_DEAD_LETTER_MODE',
  completedRetentionSeconds: 'CORRAL_COMPLETED_RETENTION_S',
  fetchBatchSize: 'CORRAL_FETCH_BATCH',
  pollIntervalMs: 'CORRAL_POLL_INTERVAL_MS',
  maxMessageBytes: 'CORRAL_MAX_MESSAGE_BYTES',
  maxEventBytes: 'CORRAL_MAX_EVENT_BYTES',
  contextMessages: 'CORRAL_CONTEXT_MESSAGES',
  contextBytes: 'CORRAL_CONTEXT_BYTES',
  contextCacheBytes: 'CORRAL_CONTEXT_CACHE_BYTES',
  rpcConcurrency: 'CORRAL_RPC_CONCURRENCY',
  rpcTimeoutMs: 'CORRAL_RPC_TIMEOUT_MS',
  insecure: 'CORRAL_INSECURE',
  insecureRemote: 'CORRAL_INSECURE_REMOTE',
  daemonKeyFile: 'CORRAL_DAEMON_KEY_FILE',
  allowlistFile: 'CORRAL_ALLOWLIST_FILE',
  keyPollMs: 'CORRAL_KEY_POLL_MS',
  workerKeyFile: 'CORRAL_WORKER_KEY_FILE',
  serverKey: 'CORRAL_SERVER_KEY',
  maxWorkers: 'CORRAL_MAX_WORKERS',
  maxConnections: 'CORRAL_MAX_CONNECTIONS',
  maxTurnMs: 'CORRAL_MAX_TURN_MS',
  metricsPort: 'CORRAL_METRICS_PORT',
  metricsHost: 'CORRAL_METRICS_HOST',
  logLevel: 'CORRAL_LOG_LEVEL',
  logPretty: 'CORRAL_LOG_PRETTY',
};

const BOOLEAN_KEYS = new Set(['logPretty', 'insecure', 'insecureRemote']);

/**
 * Resolves the configuration: `overrides` (flags) win over `env`, which wins over defaults.
 * Throws `CorralError('invalid_config')` naming the variable at fault.
 */
export function loadConfig(overrides: Partial<Config> = {}, env: Record<string, string | undefined> = {}, cwd = process.cwd()): Config {
  const fromEnv: Record<string, unknown> = {};
  for (const [key, name] of Object.entries(ENV_NAMES)) {
    const raw = name ? env[name] : undefined;
    if (raw === undefined || raw === '') continue;
    fromEnv[key] = BOOLEAN_KEYS.has(key) ? ['1', 'true', 'yes'].includes(raw.toLowerCase()) : raw;
  }
  const defined = Object.fromEntries(Object.entries(overrides).filter(([, v]) => v !== undefined));
  const merged = { ...DEFAULTS, homeDir: '.corral', ...fromEnv, ...defined };
  const parsed = configSchema.safeParse(merged);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const key = String(issue.path[0] ?? '');
    const envName = ENV_NAMES[key as keyof Config];
    const where = key ? `${key}${envName ? ` (${envName})` : ''}: ` : '';
    throw new CorralError('invalid_config', `invalid configuration: ${where}${issue.message}`);
  }
  const c = parsed.data;
  return {
    ...c,
    homeDir: resolve(cwd, c.homeDir),
    embeddedRootDir: resolve(cwd, c.embeddedRootDir),
    ...(c.daemonKeyFile ? { daemonKeyFile: resolve(cwd, c.daemonKeyFile) } : {}),
    ...(c.allowlistFile ? { allowlistFile: resolve(cwd, c.allowlistFile) } : {}),
    ...(c.workerKeyFile ? { workerKeyFile: resolve(cwd, c.workerKeyFile) } : {}),
  };
}

/** The effective context limits of `turn_start`: the byte budget capped at a quarter of the wire limit. */
export function contextLimits(c: Config): { maxMessages: number; maxBytes: number } {
  return { maxMessages: c.contextMessages, maxBytes: Math.min(c.contextBytes, Math.floor(c.maxMessageBytes / 4)) };
}

/** The connection string with its password masked, for logs. */
export function maskUrl(url: string): string {
  return url.replace(/(\/\/[^:/@]+:)[^@]*@/, '$1****@');
}
