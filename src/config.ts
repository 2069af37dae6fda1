/**
 * Configuration, resolved once at the edge (flag > environment > default) and validated.
 * Nothing below the entry points reads `process.env`: components receive a `Config`.
 */
import { resolve } from 'node:path';
import { CorralError } from './base/errors.ts';
import { SERVED_SHARDS_PATTERN } from './base/shard-map.ts';
import {
  DEFAULT_CONTEXT_CACHE_BYTES,
  DEFAULT_EMBEDDED_ROOT,
  DEFAULT_HEARTBEAT_INTERVAL_MS,
  DEFAULT_MAX_EVENT_BYTES,
  DEFAULT_MAX_MESSAGE_BYTES,
  DEFAULT_RECEIVE_HWM,
  DEFAULT_PROGRESS_INTERVAL_MS,
  DEFAULT_STREAM_CHUNK_BYTES,
  AVAILABLE_INPUT_POLICIES,
} from './base/defaults.ts';

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

/** A yes/no setting: its environment variable is true for `1`, `true` or `yes`. */
function flag(): Rule<boolean> & { readonly boolean: true } {
  const rule: Rule<boolean> = (input) =>
    typeof input === 'boolean' ? { value: input } : { message: `Invalid input: expected boolean, received ${typeName(input)}` };
  return Object.assign(rule, { boolean: true as const });
}

function optional<T>(rule: Rule<T>): OptionalRule<T> {
  return Object.assign((input: unknown) => (input === undefined ? { value: undefined } : rule(input)), { optional: true as const });
}

/**
 * One setting: the environment variable that sets it, its default, its rule. A setting without
 * a default has an optional rule and stays unset unless a flag or the environment sets it.
 */
interface Setting<T> {
  env: string;
  default?: T;
  rule: Rule<T>;
}

function setting<T>(s: { env: string; rule: OptionalRule<T> }): Setting<T | undefined> & { rule: OptionalRule<T> };
function setting<T>(s: { env: string; default: NoInfer<T>; rule: Rule<T> }): Setting<T> & { default: T };
function setting<T>(s: Setting<T>): Setting<T> {
  return s;
}

/**
 * Every setting, in one table: flag > environment variable > default, then the rule. The order is
 * the order faults are looked for in. `DEFAULTS` and `ENV_NAMES` are read off it, and a test keeps
 * the README's configuration table equal to them.
 */
const SETTINGS = {
  /** External PostgreSQL; when absent, the embedded server under `homeDir` is used. */
  databaseUrl: setting({
    env: 'DATABASE_URL',
    rule: optional(
      text({
        min: 1,
        pattern: { test: isConnectionString },
        message: 'expected a postgres:// or postgresql:// URL (or a socket: a path starting with /, or socket://)',
      }),
    ),
  }),
  /** Folder for the embedded database and local state (git-ignored `.corral/`). */
  homeDir: setting({ env: 'CORRAL_HOME', default: '.corral', rule: text({ min: 1 }) }),
  /**
   * Run as root, where the embedded PostgreSQL's binaries and data go when the `postgres` OS
   * user cannot reach them in place (a checkout or CORRAL_HOME under a closed folder).
   */
  embeddedRootDir: setting({ env: 'CORRAL_EMBEDDED_ROOT', default: DEFAULT_EMBEDDED_ROOT, rule: text({ min: 1 }) }),
  /**
   * How long a command waits for the database's set-up when it finds it under way (a daemon
   * migrating on its first start, src/db/postgres/setup-lock.ts) before it gives up.
   */
  setupWaitMs: setting({ env: 'CORRAL_SETUP_WAIT_MS', default: 60_000, rule: int(0, 3_600_000) }),
  /** The broker's ROUTER endpoint. */
  endpoint: setting({
    env: 'CORRAL_ENDPOINT',
    default: 'tcp://127.0.0.1:5555',
    rule: text({ pattern: /^(tcp|ipc|inproc):\/\/.+/, message: 'expected tcp://host:port, ipc://path or inproc://name' }),
  }),
  queueName: setting({ env: 'CORRAL_QUEUE', default: 'actor-events', rule: text({ pattern: /^[A-Za-z0-9_.-]{1,50}$/ }) }),
  bossSchema: setting({ env: 'CORRAL_BOSS_SCHEMA', default: 'pgboss', rule: text({ pattern: /^[a-z_][a-z0-9_]{0,62}$/ }) }),
  /** Lease granted to an activation per dispatch / heartbeat. */
  leaseMs: setting({ env: 'CORRAL_LEASE_MS', default: 60_000, rule: int(100) }),
  /** How often a worker reports progress on a running turn (extends the lease). */
  progressIntervalMs: setting({ env: 'CORRAL_PROGRESS_INTERVAL_MS', default: DEFAULT_PROGRESS_INTERVAL_MS, rule: int(50) }),
  workerHeartbeatMs: setting({ env: 'CORRAL_WORKER_HEARTBEAT_MS', default: DEFAULT_HEARTBEAT_INTERVAL_MS, rule: int(50) }),
  /**
   * The turns a worker is given before it has accepted or committed any; one more for each it
   * accepts or commits, up to its capacity (a worker that registers a large capacity and takes
   * nothing is never handed a whole batch).
   */
  workerInitialTurns: setting({ env: 'CORRAL_WORKER_INITIAL_TURNS', default: 4, rule: int(1, 1024) }),
  /** A worker silent for this long is stale: its unaccepted deliveries go elsewhere. */
  workerStaleMs: setting({ env: 'CORRAL_WORKER_STALE_MS', default: 10_000, rule: int(100) }),
  /** A warm activation with no current event is stopped after this long. */
  idleTimeoutMs: setting({ env: 'CORRAL_IDLE_TIMEOUT_MS', default: 300_000, rule: int(100) }),
  /**
   * After a busy spell, once no turn was fetched and none is in flight for this long, the daemon
   * gives the memory it grew to back to the system (one memory-reducing GC); 0 = never.
   */
  heapTrimIdleMs: setting({ env: 'CORRAL_HEAP_TRIM_IDLE_MS', default: 10_000, rule: int(0, 86_400_000) }),
  watchdogIntervalMs: setting({ env: 'CORRAL_WATCHDOG_INTERVAL_MS', default: 1_000, rule: int(10) }),
  /** On a graceful stop, how long in-flight turns may take to finish. */
  drainMs: setting({ env: 'CORRAL_DRAIN_MS', default: 10_000, rule: int(0, 3_600_000) }),
  recoveryIntervalMs: setting({ env: 'CORRAL_RECOVERY_INTERVAL_MS', default: 30_000, rule: int(100) }),
  /** pg-boss retry policy for actor events (seconds); the default is the 5–120 s contract. */
  retryLimit: setting({ env: 'CORRAL_RETRY_LIMIT', default: 5, rule: int(0, 1000) }),
  retryDelaySeconds: setting({ env: 'CORRAL_RETRY_DELAY_S', default: 5, rule: int(1, 3600) }),
  retryDelayMaxSeconds: setting({ env: 'CORRAL_RETRY_DELAY_MAX_S', default: 120, rule: int(1, 86_400) }),
  /**
   * Retries of an outbox message after its first attempt (src/outbox/sender.ts), with the
   * events' delays (CORRAL_RETRY_DELAY_S, _DELAY_MAX_S); then it is dead-lettered.
   */
  outboxRetryLimit: setting({ env: 'CORRAL_OUTBOX_RETRY_LIMIT', default: 8, rule: int(0, 1000) }),
  /** Backstop: pg-boss expires an active job that no daemon settled for this long. */
  jobExpireSeconds: setting({ env: 'CORRAL_JOB_EXPIRE_S', default: 86_400, rule: int(5, 7 * 86_400) }),
  /**
   * The daemon touches the jobs of its in-flight turns; pg-boss fails (retries) an active job
   * left untouched this long, e.g. when its daemon died before writing an activation.
   */
  jobHeartbeatSeconds: setting({ env: 'CORRAL_JOB_HEARTBEAT_S', default: 30, rule: int(10, 3_600) }),
  deadLetterMode: setting({ env: 'CORRAL_DEAD_LETTER_MODE', default: 'continue', rule: oneOf(DEAD_LETTER_MODES) }),
  /**
   * What an event sent to a busy actor does, for actors and agents without a policy of their own
   * (`corral policy`): `queue` (a turn of its own, after the others) or `reject` (`actor_busy`).
   * Embedded in the send functions the daemon installs.
   */
  inputPolicy: setting({ env: 'CORRAL_INPUT_POLICY', default: 'queue', rule: oneOf(AVAILABLE_INPUT_POLICIES) }),
  /** Completed actor events are deleted after this long (0 = never); failed ones never are. */
  completedRetentionSeconds: setting({ env: 'CORRAL_COMPLETED_RETENTION_S', default: 7 * 86_400, rule: int(0, 10 * 365 * 86_400) }),
  /**
   * Finished deliveries and ended activations (runtime projections) are deleted after this long
   * (0 = never); an actor's latest activation, and the delivery of a turn still started, stay.
   */
  runtimeRetentionSeconds: setting({ env: 'CORRAL_RUNTIME_RETENTION_S', default: 86_400, rule: int(0, 10 * 365 * 86_400) }),
  fetchBatchSize: setting({ env: 'CORRAL_FETCH_BATCH', default: 50, rule: int(1, 500) }),
  /** Fallback poll for delayed retries (NOTIFY wakes new events at once). */
  pollIntervalMs: setting({ env: 'CORRAL_POLL_INTERVAL_MS', default: 1_000, rule: int(20) }),
  maxMessageBytes: setting({ env: 'CORRAL_MAX_MESSAGE_BYTES', default: DEFAULT_MAX_MESSAGE_BYTES, rule: int(1024) }),
  /** Frames the broker's socket reads ahead per connection (ZMQ_RCVHWM): what one flooding peer can park in the daemon. */
  receiveHighWaterMark: setting({ env: 'CORRAL_RECEIVE_HWM', default: DEFAULT_RECEIVE_HWM, rule: int(1, 100_000) }),
  /**
   * Largest event payload accepted at enqueue (its JSON, in bytes). Well under
   * `maxMessageBytes`, so a turn_start always fits on the wire with its envelope.
   */
  maxEventBytes: setting({ env: 'CORRAL_MAX_EVENT_BYTES', default: DEFAULT_MAX_EVENT_BYTES, rule: int(16) }),
  /** `turn_start` context: at most this many latest transcript messages (0 = no context). */
  contextMessages: setting({ env: 'CORRAL_CONTEXT_MESSAGES', default: 50, rule: int(0, 1000) }),
  /**
   * `turn_start` context: at most this many bytes of message content (JSON). Capped at a quarter
   * of `maxMessageBytes` (the turn_start carries the event too), see `contextLimits`.
   */
  contextBytes: setting({ env: 'CORRAL_CONTEXT_BYTES', default: 64 * 1024, rule: int(0) }),
  /**
   * Memory for the contexts kept between turns, so the database does not read them again (0 =
   * none kept); dropped whenever the daemon idles (see `heapTrimIdleMs`).
   */
  contextCacheBytes: setting({ env: 'CORRAL_CONTEXT_CACHE_BYTES', default: DEFAULT_CONTEXT_CACHE_BYTES, rule: int(0) }),
  /** Worker RPC: requests served at once per worker; more are answered `busy`. */
  rpcConcurrency: setting({ env: 'CORRAL_RPC_CONCURRENCY', default: 8, rule: int(1, 1000) }),
  /** Worker RPC: requests one worker may start per second (a burst of one second's worth); more are answered `busy`. */
  rpcPerSecond: setting({ env: 'CORRAL_RPC_PER_SECOND', default: 200, rule: int(1, 100_000) }),
  /** Worker RPC: a request not served within this long is answered `timeout`. */
  rpcTimeoutMs: setting({ env: 'CORRAL_RPC_TIMEOUT_MS', default: 10_000, rule: int(10, 600_000) }),
  /** Live turns: the largest `turn_chunk` frame relayed (bytes); a larger one is dropped and counted. */
  streamChunkBytes: setting({ env: 'CORRAL_STREAM_CHUNK_BYTES', default: DEFAULT_STREAM_CHUNK_BYTES, rule: int(256) }),
  /** Live turns: most chunk bytes one attempt may stream; the rest of its chunks are dropped and counted. */
  streamTurnBytes: setting({ env: 'CORRAL_STREAM_TURN_BYTES', default: 8 * 1024 * 1024, rule: int(256) }),
  /** Live turns: most chunk bytes waiting to be written, daemon-wide; beyond it chunks are dropped and counted. */
  streamBacklogBytes: setting({ env: 'CORRAL_STREAM_BACKLOG_BYTES', default: 32 * 1024 * 1024, rule: int(1024) }),
  /** CURVE off (and any worker admitted). Never implied: `--insecure` or CORRAL_INSECURE=1. */
  insecure: setting({ env: 'CORRAL_INSECURE', default: false, rule: flag() }),
  /** With `insecure`, also allow binding a non-loopback address. */
  insecureRemote: setting({ env: 'CORRAL_INSECURE_REMOTE', default: false, rule: flag() }),
  /** The daemon's keypair file; default `<homeDir>/keys/daemon.key`, created on first start. */
  daemonKeyFile: setting({ env: 'CORRAL_DAEMON_KEY_FILE', rule: optional(text({ min: 1 })) }),
  /** The worker allow-list; default `<homeDir>/keys/workers.json`. */
  allowlistFile: setting({ env: 'CORRAL_ALLOWLIST_FILE', rule: optional(text({ min: 1 })) }),
  /** How often the daemon checks the allow-list for changes (revocations take effect within this). */
  keyPollMs: setting({ env: 'CORRAL_KEY_POLL_MS', default: 200, rule: int(20, 60_000) }),
  /** A worker's key file (`corral keys add-worker`). */
  workerKeyFile: setting({ env: 'CORRAL_WORKER_KEY_FILE', rule: optional(text({ min: 1 })) }),
  /** The daemon's public key (Z85), overriding the one in the worker's key file. */
  serverKey: setting({ env: 'CORRAL_SERVER_KEY', rule: optional(text({ length: 40 })) }),
  /** An HTTP API token (`corral tokens create`), for commands that reach a remote daemon's API (`corral watch --url`). */
  apiToken: setting({ env: 'CORRAL_TOKEN', rule: optional(text({ min: 1 })) }),
  /** Most worker ids registered with one daemon at once. */
  /** The shards a daemon serves: `all` or a list (src/base/shard-map.ts; docs/scaling.md). */
  shards: setting({
    env: 'CORRAL_SHARDS',
    default: 'all',
    rule: text({ pattern: SERVED_SHARDS_PATTERN, message: 'Invalid string: expected all or shard numbers such as 0,3,5' }),
  }),
  maxWorkers: setting({ env: 'CORRAL_MAX_WORKERS', default: 256, rule: int(1, 100_000) }),
  /** Most connections to the broker at once (ZAP refuses the rest). */
  maxConnections: setting({ env: 'CORRAL_MAX_CONNECTIONS', default: 1024, rule: int(1, 1_000_000) }),
  /** Most connections one worker key may hold (ZAP refuses the rest): one key cannot take another's. */
  maxConnectionsPerKey: setting({ env: 'CORRAL_MAX_CONNECTIONS_PER_KEY', default: 4, rule: int(1, 1_000_000) }),
  /** Registrations accepted per worker key per second, in bursts of up to 5× (at least 5); more are refused `rate_limited`. */
  maxRegistrationRate: setting({ env: 'CORRAL_MAX_REGISTRATION_RATE', default: 1, rule: int(1, 10_000) }),
  /** A turn running longer than this is failed (retried), even while it reports progress. */
  maxTurnMs: setting({ env: 'CORRAL_MAX_TURN_MS', default: 6 * 3_600_000, rule: int(100) }),
  metricsPort: setting({ env: 'CORRAL_METRICS_PORT', rule: optional(int(0, 65_535)) }),
  metricsHost: setting({ env: 'CORRAL_METRICS_HOST', default: '127.0.0.1', rule: text({ min: 1 }) }),
  /** The HTTP API (src/http/): served on this port when set; unset or 0, the API is off. */
  httpPort: setting({ env: 'CORRAL_HTTP_PORT', rule: optional(int(0, 65_535)) }),
  /** The HTTP API's address: loopback unless a TLS proxy in front of it or a trusted network allows more. */
  httpHost: setting({ env: 'CORRAL_HTTP_HOST', default: '127.0.0.1', rule: text({ min: 1 }) }),
  /**
   * The HTTP API also serves the chat page (examples/chat/) at `/`: a browser page that sends
   * messages and shows replies as they stream. Off by default: nothing but /v1 is served.
   */
  httpUi: setting({ env: 'CORRAL_HTTP_UI', default: false, rule: flag() }),
  /** Most live streams (SSE) the HTTP API serves at once; more are refused `too_many_streams`. */
  httpMaxStreams: setting({ env: 'CORRAL_HTTP_MAX_STREAMS', default: 1_000, rule: int(1, 1_000_000) }),
  /** Most live streams of one actor at once; more are refused `too_many_streams`. */
  httpMaxStreamsPerActor: setting({ env: 'CORRAL_HTTP_MAX_STREAMS_PER_ACTOR', default: 20, rule: int(1, 1_000_000) }),
  /** Most live streams one token holds open at once; more are refused `too_many_streams`. */
  httpMaxStreamsPerToken: setting({ env: 'CORRAL_HTTP_MAX_STREAMS_PER_TOKEN', default: 16, rule: int(1, 1_000_000) }),
  /** Streams one token may open per second (a burst of twice that); more are refused `rate_limited`. */
  httpStreamOpensPerSecond: setting({ env: 'CORRAL_HTTP_STREAM_OPENS_PER_S', default: 5, rule: int(1, 100_000) }),
  /** Most connections the HTTP API holds at once; a request on one past it is refused `rate_limited` and its connection closed. */
  httpMaxConnections: setting({ env: 'CORRAL_HTTP_MAX_CONNECTIONS', default: 2_048, rule: int(1, 1_000_000) }),
  /**
   * Failed authentications (a token unknown, revoked or expired, a malformed header) one client
   * address may have per minute; past it, its requests are refused `rate_limited` until the minute is over.
   */
  httpAuthFailuresPerMinute: setting({ env: 'CORRAL_HTTP_AUTH_FAILURES_PER_MIN', default: 30, rule: int(1, 1_000_000) }),
  /**
   * A stream whose socket holds more than this many bytes not yet taken by its client is ended:
   * a client that does not read is dropped, never buffered for without limit.
   */
  httpStreamBufferBytes: setting({ env: 'CORRAL_HTTP_STREAM_BUFFER_BYTES', default: 1024 * 1024, rule: int(4_096, 1024 ** 3) }),
  logLevel: setting({
    env: 'CORRAL_LOG_LEVEL',
    default: 'info',
    rule: oneOf(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']),
  }),
  logPretty: setting({ env: 'CORRAL_LOG_PRETTY', default: false, rule: flag() }),
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
    holds: (c) => c.streamChunkBytes <= c.maxMessageBytes && c.streamChunkBytes <= c.streamTurnBytes,
    message: 'streamChunkBytes must be at most maxMessageBytes and at most streamTurnBytes',
    key: 'streamChunkBytes',
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

type Settings = typeof SETTINGS;
type ValueOf<S> = S extends { rule: Rule<infer T> } ? T : never;
type Values = { [K in keyof Settings]: ValueOf<Settings[K]> };
type OptionalKey = { [K in keyof Settings]: Settings[K]['rule'] extends { optional: true } ? K : never }[keyof Settings];
type RequiredKey = Exclude<keyof Settings, OptionalKey>;
/** The settings; each one's meaning is documented on its row of `SETTINGS`. */
export type Config = Pick<Values, RequiredKey> & Partial<Pick<Values, OptionalKey>>;

const SETTING_ROWS = Object.entries(SETTINGS) as [keyof Config, Setting<unknown>][];

/** The default of every setting that has one (all but the optional ones). */
export const DEFAULTS: Readonly<Pick<Config, RequiredKey>> = Object.freeze(
  Object.fromEntries(SETTING_ROWS.filter(([, s]) => s.default !== undefined).map(([k, s]) => [k, s.default])) as Pick<Config, RequiredKey>,
);

/** The environment variable of every setting (documented in the README). */
export const ENV_NAMES: Readonly<Record<keyof Config, string>> = Object.freeze(
  Object.fromEntries(SETTING_ROWS.map(([k, s]) => [k, s.env])) as Record<keyof Config, string>,
);

/**
 * Resolves the configuration: `overrides` (flags) win over `env`, which wins over defaults.
 * Throws `CorralError('invalid_config')` naming the variable at fault.
 */
export function loadConfig(overrides: Partial<Config> = {}, env: Record<string, string | undefined> = {}, cwd = process.cwd()): Config {
  const fromEnv: Record<string, unknown> = {};
  for (const [key, { env: name, rule }] of SETTING_ROWS) {
    const raw = env[name];
    if (raw === undefined || raw === '') continue;
    fromEnv[key] = 'boolean' in rule ? ['1', 'true', 'yes'].includes(raw.toLowerCase()) : raw;
  }
  const defined = Object.fromEntries(Object.entries(overrides).filter(([, v]) => v !== undefined));
  const merged = { ...DEFAULTS, ...fromEnv, ...defined };
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

/** `input` checked against the rules of `SETTINGS`, then `CHECKS`: the first fault (in table order) is reported. */
function validate(input: Record<string, unknown>): Config {
  const out: Record<string, unknown> = {};
  let fault: { key?: string; message: string } | undefined;
  for (const [key, { rule }] of SETTING_ROWS) {
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
export function contextLimits(c: Pick<Config, 'contextMessages' | 'contextBytes' | 'maxMessageBytes'>): {
  maxMessages: number;
  maxBytes: number;
} {
  return { maxMessages: c.contextMessages, maxBytes: Math.min(c.contextBytes, Math.floor(c.maxMessageBytes / 4)) };
}

/** The connection string with its password masked, for logs. */
export function maskUrl(url: string): string {
  return url.replace(/(\/\/[^:/@]+:)[^@]*@/, '$1****@');
}
