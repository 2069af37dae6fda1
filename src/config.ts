/**
 * Configuration, resolved once at the edge (flag > environment > default) and validated.
 * Nothing below the entry points reads `process.env`: components receive a `Config`.
 */
import { resolve } from 'node:path';
import { CorralError } from './errors.ts';
import { DEFAULT_PROGRESS_INTERVAL_MS } from './fabric/defaults.ts';
import { DEFAULT_CONTEXT_CACHE_BYTES } from './runtime/context-cache.ts';

export const DEAD_LETTER_MODES = ['continue', 'block'] as const;
export type DeadLetterMode = (typeof DEAD_LETTER_MODES)[number];

/*
 * The rules of each setting, checked by hand rather than by a zod schema: the configuration loads
 * on every command, and zod took ~40 ms of CPU of each start (a read command's whole start-up is
 * ~150 ms). The messages are the ones zod gave, word for word (test/unit/config.test.ts).
 */

type Checked<T> = { value: T } | { message: string };
type Rule<T> = (input: unknown) => Checked<T>;
/** A setting that may be absent (it then stays absent). */
type OptionalRule<T> = Rule<T | undefined> & { readonly optional: true };

/** zod's name for the type of a value it refused (`received …`). */
function typeName(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  if (typeof v === 'number' && !Number.isFinite(v)) return String(v);
  if (typeof v === 'object' && Object.getPrototypeOf(v) !== Object.prototype && v.constructor) return v.constructor.name;
  return typeof v;
}

/** An integer in [min, max]; a string is converted as `Number()` does (`' 12 '`, `'0x10'`, `'1e3'`). */
function int(min: number, max = Number.MAX_SAFE_INTEGER): Rule<number> {
  return (input) => {
    let n: unknown = input;
    try {
      n = Number(input);
    } catch {
      // a Symbol: refused as it is
    }
    if (typeof n !== 'number' || !Number.isFinite(n)) return { message: `Invalid input: expected number, received ${typeName(n)}` };
    if (!Number.isInteger(n)) return { message: 'Invalid input: expected int, received number' };
    if (n > Number.MAX_SAFE_INTEGER) return { message: `Too big: expected int to be <=${Number.MAX_SAFE_INTEGER}` };
    if (n < Number.MIN_SAFE_INTEGER) return { message: `Too small: expected int to be >=${Number.MIN_SAFE_INTEGER}` };
    if (n < min) return { message: `Too small: expected number to be >=${min}` };
    if (n > max) return { message: `Too big: expected number to be <=${max}` };
    return { value: n };
  };
}

function text(opts: {
  min?: number;
  length?: number;
  pattern?: RegExp | { test: (s: string) => boolean };
  message?: string;
}): Rule<string> {
  return (input) => {
    if (typeof input !== 'string') return { message: `Invalid input: expected string, received ${typeName(input)}` };
    if (opts.min !== undefined && input.length < opts.min)
      return { message: `Too small: expected string to have >=${opts.min} characters` };
    if (opts.length !== undefined && input.length !== opts.length) {
      const which = input.length < opts.length ? 'Too small' : 'Too big';
      return { message: `${which}: expected string to have exactly ${opts.length} characters` };
    }
    if (opts.pattern && !opts.pattern.test(input))
      return { message: opts.message ?? `Invalid string: must match pattern ${String(opts.pattern)}` };
    return { value: input };
  };
}

function oneOf<const T extends readonly string[]>(values: T): Rule<T[number]> {
  return (input) =>
    values.includes(input as string)
      ? { value: input as T[number] }
      : { message: `Invalid option: expected one of ${values.map((v) => JSON.stringify(v)).join('|')}` };
}

function flag(): Rule<boolean> {
  return (input) =>
    typeof input === 'boolean' ? { value: input } : { message: `Invalid input: expected boolean, received ${typeName(input)}` };
}

function optional<T>(rule: Rule<T>): OptionalRule<T> {
  return Object.assign((input: unknown) => (input === undefined ? { value: undefined } : rule(input)), { optional: true as const });
}

const RULES = {
  /** External PostgreSQL; when absent, the embedded server under `homeDir` is used. */
  databaseUrl: optional(
    text({
      min: 1,
      pattern: { test: isConnectionString },
      message: 'expected a postgres:// or postgresql:// URL (or a socket: a path starting with /, or socket://)',
    }),
  ),
  /** Folder for the embedded database and local state (git-ignored `.corral/`). */
  homeDir: text({ min: 1 }),
  /**
   * Run as root, where the embedded PostgreSQL's binaries and data go when the `postgres` OS
   * user cannot reach them in place (a checkout or CORRAL_HOME under a closed folder).
   */
  embeddedRootDir: text({ min: 1 }),
  /** The broker's ROUTER endpoint. */
  endpoint: text({ pattern: /^(tcp|ipc|inproc):\/\/.+/, message: 'expected tcp://host:port, ipc://path or inproc://name' }),
  queueName: text({ pattern: /^[A-Za-z0-9_.-]{1,50}$/ }),
  bossSchema: text({ pattern: /^[a-z_][a-z0-9_]{0,62}$/ }),
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
  deadLetterMode: oneOf(DEAD_LETTER_MODES),
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
  insecure: flag(),
  /** With `insecure`, also allow binding a non-loopback address. */
  insecureRemote: flag(),
  /** The daemon's keypair file; default `<homeDir>/keys/daemon.key`, created on first start. */
  daemonKeyFile: optional(text({ min: 1 })),
  /** The worker allow-list; default `<homeDir>/keys/workers.json`. */
  allowlistFile: optional(text({ min: 1 })),
  /** How often the daemon checks the allow-list for changes (revocations take effect within this). */
  keyPollMs: int(20, 60_000),
  /** A worker's key file (`corral keys add-worker`). */
  workerKeyFile: optional(text({ min: 1 })),
  /** The daemon's public key (Z85), overriding the one in the worker's key file. */
  serverKey: optional(text({ length: 40 })),
  /** Most worker ids registered with one daemon at once. */
  maxWorkers: int(1, 100_000),
  /** Most connections to the broker at once (ZAP refuses the rest). */
  maxConnections: int(1, 1_000_000),
  /** A turn running longer than this is failed (retried), even while it reports progress. */
  maxTurnMs: int(100),
  metricsPort: optional(int(0, 65_535)),
  metricsHost: text({ min: 1 }),
  logLevel: oneOf(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']),
  logPretty: flag(),
};

/** Conditions between settings, checked once every setting is valid; `key` is the one blamed. */
const CHECKS: readonly { holds: (c: Config) => boolean; message: string; key?: keyof Config }[] = [
  { holds: (c) => c.retryDelayMaxSeconds >= c.retryDelaySeconds, message: 'retryDelayMaxSeconds must be >= retryDelaySeconds' },
  { holds: (c) => c.progressIntervalMs < c.leaseMs, message: 'progressIntervalMs must be shorter than leaseMs' },
  {
    holds: (c) => c.maxEventBytes <= c.maxMessageBytes / 2,
    message: 'maxEventBytes must be at most half of maxMessageBytes (a turn_start carries the event and its envelope)',
    key: 'maxEventBytes',
  },
  {
    holds: (c) => !c.insecure || c.insecureRemote || isLocalEndpoint(c.endpoint),
    message: 'binding a non-loopback address without CURVE needs --insecure-remote (CORRAL_INSECURE_REMOTE=1) as well',
    key: 'insecureRemote',
  },
];

/**
 * Whether `s` is something pg takes as a connection string: a `postgres://` or `postgresql://`
 * URL, a `socket://` URL, or a Unix socket folder (`/run/postgresql [database]`). pg reads
 * anything else as a path relative to a host named "base" and fails with `getaddrinfo ENOTFOUND
 * base`, which names neither the setting nor what is wrong with it.
 */
export function isConnectionString(s: string): boolean {
  if (s.startsWith('/')) return true;
  if (!/^(postgres|postgresql|socket):\/\//i.test(s)) return false;
  // as pg-connection-string parses it: spaces and stray `%` encoded, then WHATWG URL, retried
  // with a dummy host for `user@/db?host=/socket`
  const text = / |%[^a-f0-9]|%[a-f0-9][^a-f0-9]/i.test(s) ? encodeURI(s).replace(/%25(\d\d)/g, '%$1') : s;
  return URL.canParse(text) || URL.canParse(text.replace('@/', '@dummy/'));
}

/** True for loopback TCP, ipc:// and inproc:// endpoints: the only ones an open fabric may bind by default. */
export function isLocalEndpoint(endpoint: string): boolean {
  if (endpoint.startsWith('ipc://') || endpoint.startsWith('inproc://')) return true;
  const m = /^tcp:\/\/(.+):[^:]+$/.exec(endpoint);
  if (!m) return false;
  const host = m[1]!.replace(/^\[|\]$/g, '').toLowerCase();
  return host === 'localhost' || host === '::1' || /^127\.\d+\.\d+\.\d+$/.test(host);
}

type Rules = typeof RULES;
type ValueOf<R> = R extends Rule<infer T> ? T : never;
type Values = { [K in keyof Rules]: ValueOf<Rules[K]> };
type OptionalKey = { [K in keyof Rules]: Rules[K] extends { optional: true } ? K : never }[keyof Rules];
/** The settings; each one's meaning is documented on its rule in `RULES`. */
export type Config = Pick<Values, Exclude<keyof Rules, OptionalKey>> & Partial<Pick<Values, OptionalKey>>;

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
  const c = validate(merged);
  return {
    ...c,
    homeDir: resolve(cwd, c.homeDir),
    embeddedRootDir: resolve(cwd, c.embeddedRootDir),
    ...(c.daemonKeyFile ? { daemonKeyFile: resolve(cwd, c.daemonKeyFile) } : {}),
    ...(c.allowlistFile ? { allowlistFile: resolve(cwd, c.allowlistFile) } : {}),
    ...(c.workerKeyFile ? { workerKeyFile: resolve(cwd, c.workerKeyFile) } : {}),
  };
}

/** `input` checked against `RULES`, then `CHECKS`: the first fault (in the order of `RULES`) is reported. */
function validate(input: Record<string, unknown>): Config {
  const out: Record<string, unknown> = {};
  let fault: { key?: string; message: string } | undefined;
  for (const [key, rule] of Object.entries(RULES) as [string, Rule<unknown>][]) {
    const checked = rule(input[key]);
    if ('message' in checked) {
      fault = { key, message: checked.message };
      break;
    }
    if (checked.value !== undefined) out[key] = checked.value;
  }
  const c = out as Config;
  if (!fault) {
    const failed = CHECKS.find((check) => !check.holds(c));
    if (failed) fault = { ...(failed.key ? { key: failed.key } : {}), message: failed.message };
  }
  if (fault) {
    const envName = fault.key ? ENV_NAMES[fault.key as keyof Config] : undefined;
    const where = fault.key ? `${fault.key}${envName ? ` (${envName})` : ''}: ` : '';
    throw new CorralError('invalid_config', `invalid configuration: ${where}${fault.message}`);
  }
  return c;
}

/** The effective context limits of `turn_start`: the byte budget capped at a quarter of the wire limit. */
export function contextLimits(c: Config): { maxMessages: number; maxBytes: number } {
  return { maxMessages: c.contextMessages, maxBytes: Math.min(c.contextBytes, Math.floor(c.maxMessageBytes / 4)) };
}

/** The connection string with its password masked, for logs. */
export function maskUrl(url: string): string {
  return url.replace(/(\/\/[^:/@]+:)[^@]*@/, '$1****@');
}
