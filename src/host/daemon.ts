/**
 * `createDaemon`: the daemon inside the application's own process (as pg-boss runs in-process),
 * with `start()` and `stop()`. It resolves the database (`databaseUrl`, or the embedded
 * PostgreSQL under `homeDir`, started if nothing runs it), binds the metrics server when
 * `metricsPort` is set and the HTTP API when `httpPort` is, runs local example worker processes when asked, and stops everything it
 * started. `corral daemon` (src/cli/commands/daemon.ts) is a thin wrapper of it: arguments,
 * signals and printing.
 *
 * Rules:
 * H1 `start()` resolves once the daemon runs: migrated, broker bound, loops started. When a step
 *    fails (the endpoint or the metrics port in use, the database unreachable) it first releases
 *    everything it took, the embedded PostgreSQL it started included, then rejects with that
 *    step's error.
 * H2 `stop()` may be called at any time, and more than once (a later call waits for the first).
 *    Before `start()` it only marks the daemon stopped; during `start()` it lets the step under
 *    way finish, then releases everything (`start()` rejects `shutdown`); while running it stops
 *    fetching, lets in-flight turns finish for `drainMs`, then stops the loops and the local
 *    workers, the metrics server and the embedded PostgreSQL this daemon started.
 * H3 `done` settles once the daemon has stopped: it resolves after `stop()`, and rejects when
 *    `start()` failed or when the daemon's supervisor gave up (the daemon then stops itself
 *    first). It is pre-marked as handled: dropping it never crashes the process.
 */
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { hostname } from 'node:os';
import { fileURLToPath } from 'node:url';
import { settlesWithin, systemClock, type Clock } from '../base/clock.ts';
import { DEFAULTS, ENV_NAMES, loadConfig, type Config } from '../config.ts';
import { Daemon } from '../daemon/daemon.ts';
import type { DaemonState } from '../daemon/state.ts';
import { resolveDatabase, stopEmbeddedIfStartedHere, type ResolvedDatabase } from '../db/postgres/resolve.ts';
import { markDaemonStarting } from '../db/postgres/setup-lock.ts';
import { DEFAULT_WORKER_CAPACITY, STOP_WITH_PARENT_ENV } from '../base/defaults.ts';
import { CorralError, toError } from '../base/errors.ts';
import { ensureLocalWorkerKey, keyPaths } from '../fabric/keys.ts';
import { createLogger, type Logger } from '../base/logger.ts';
import { listenForObservability, observabilityChild } from '../observability/daemon-child.ts';
import type { ObservabilityServer } from '../observability/http.ts';
import { createMetrics, type Metrics } from '../observability/metrics.ts';
import { processChild, type ChildSpec } from '../supervisor/index.ts';
import type { HostedApi } from './http-api.ts';
import { registerDaemonInternals } from './internals.ts';
import type { TurnTracer } from '../base/turn-tracer.ts';
import { tracingSettings } from '../observability/tracing-settings.ts';

export type { Config, DeadLetterMode } from '../config.ts';
export { CorralError, type ErrorCode } from '../base/errors.ts';
export type { Logger } from '../base/logger.ts';

const CORRAL_BIN = fileURLToPath(new URL('../../bin/corral.js', import.meta.url));
/** The most the HTTP API or the metrics server may take to close. */
const RELEASE_STEP_MS = 3_000;
/** The longest a stop waits for the last spans to be exported (a collector that is away is retried for its exporter's timeout). */
const TRACE_FLUSH_MS = 1_500;
/** The most stopping the embedded PostgreSQL may take (a fast shutdown, a checkpoint included). */
const EMBEDDED_STOP_MS = 15_000;

/** Local example worker processes, supervised by the daemon (`corral daemon --workers N`). */
export interface LocalWorkersOptions {
  /** How many, 0..64. */
  count: number;
  /** Concurrent turns of each. Default 32. */
  capacity?: number;
}

/**
 * The settings of src/config.ts (the README's configuration table: `databaseUrl`, `homeDir`,
 * `endpoint`, `drainMs`, `metricsPort`, …) and what only an embedding application can give.
 */
export interface DaemonOptions extends Partial<Config> {
  /** Where the daemon logs (pino). Default: JSON lines on stdout at `logLevel` (`info`). */
  logger?: Logger;
  clock?: Clock;
  /**
   * Environment variables read for the settings not given here (`CORRAL_ENDPOINT`, …). Default
   * none: pass `process.env` to configure the daemon as `corral daemon` is.
   */
  env?: Record<string, string | undefined>;
  localWorkers?: LocalWorkersOptions;
  /** Do not apply migrations on start (they were applied already). */
  skipMigrations?: boolean;
}

export interface StopDaemonOptions {
  /** How long in-flight turns may take to finish. Default: the `drainMs` setting (10 s). */
  drainMs?: number;
}

export type { DaemonState };

/** A daemon created by `createDaemon`. */
export interface CorralDaemon {
  /** The settings, resolved and validated. */
  readonly config: Config;
  readonly state: DaemonState;
  /** The endpoint bound (with the port picked when the setting's is 0); `undefined` until started. */
  readonly endpoint: string | undefined;
  /** The database in use (the embedded server's URL when `databaseUrl` is unset); `undefined` until started. */
  readonly databaseUrl: string | undefined;
  /** The daemon's CURVE public key (`server_key` of its workers' key files); `undefined` insecure or until started. */
  readonly serverPublicKey: string | undefined;
  /** `http://host:port` of `/metrics`, `/healthz`, `/readyz` when `metricsPort` is set; else `undefined`. */
  readonly metricsUrl: string | undefined;
  /** `http://host:port` of the HTTP API (docs/http.md) when `httpPort` is set (and not 0) and the daemon runs; else `undefined`. */
  readonly httpUrl: string | undefined;
  /** Settles once the daemon has stopped (rule H3). */
  readonly done: Promise<void>;
  /** Resolves once the daemon runs; rejects with why it cannot (rule H1). */
  start(): Promise<void>;
  /** Drains and stops everything this daemon started (rule H2). */
  stop(opts?: StopDaemonOptions): Promise<void>;
}

/** Builds a daemon; nothing happens until `start()`. Throws `invalid_config` / `invalid_argument` for bad options. */
export function createDaemon(options: DaemonOptions = {}): CorralDaemon {
  return new HostedDaemon(options);
}

/**
 * The id of the daemon's local worker `n`: `<host>-local-<n>` on the default endpoint; on any
 * other, a short tag of the endpoint goes in (`<host>-local-<tag>-<n>`). Two daemons on one host
 * (they cannot share an endpoint) so never give their workers the same id, which would be one
 * `corral.workers` row for two workers. The id stays the same across restarts, and so does its key.
 */
export function localWorkerId(host: string, endpoint: string, n: number): string {
  const name = host.replace(/[^A-Za-z0-9._:-]/g, '-').slice(0, 40);
  if (endpoint === DEFAULTS.endpoint) return `${name}-local-${n}`;
  return `${name}-local-${createHash('sha256').update(endpoint).digest('hex').slice(0, 6)}-${n}`;
}

const OWN_OPTIONS = new Set(['logger', 'clock', 'env', 'localWorkers', 'skipMigrations']);

/** The settings among `options`; an option that is neither a setting nor one of ours is a mistake, said at once. */
function settingsOf(options: DaemonOptions): Partial<Config> {
  const settings: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(options)) {
    if (OWN_OPTIONS.has(key)) continue;
    if (!(key in ENV_NAMES)) throw new CorralError('invalid_argument', `createDaemon: unknown option ${JSON.stringify(key)}`);
    settings[key] = value;
  }
  return settings as Partial<Config>;
}

/**
 * The daemon's own workers: each gets its key file under `CORRAL_HOME/keys/workers/` (issued on
 * first start, reused afterwards) and is started with `--key-file`, so `npm start` needs no
 * set-up step and still runs CURVE with a per-worker key.
 */
function localWorkers(opts: LocalWorkersOptions, config: Config): (endpoint: string) => ChildSpec<Daemon>[] {
  const host = hostname();
  const capacity = opts.capacity ?? DEFAULT_WORKER_CAPACITY;
  return (endpoint) =>
    Array.from({ length: opts.count }, (_, i) => {
      // the configured endpoint, not the bound one: with port 0 the id would change at every start
      const id = localWorkerId(host, config.endpoint, i + 1);
      const security = config.insecure
        ? ['--insecure']
        : [
            '--key-file',
            ensureLocalWorkerKey(
              keyPaths(config.homeDir, {
                ...(config.daemonKeyFile ? { daemonKeyFile: config.daemonKeyFile } : {}),
                ...(config.allowlistFile ? { allowlistFile: config.allowlistFile } : {}),
              }),
              id,
            ),
          ];
      return {
        name: `worker:${id}`,
        policy: 'permanent' as const,
        restartDelayMs: 200,
        factory: processChild({
          command: process.execPath,
          args: [CORRAL_BIN, 'worker', '--id', id, '--endpoint', endpoint, '--capacity', String(capacity), ...security],
          // a child inherits its parent's environment, as any spawned process does
          env: { ...process.env, CORRAL_LOG_LEVEL: config.logLevel, [STOP_WITH_PARENT_ENV]: '1' },
          killTimeoutMs: 5_000,
        }),
      };
    });
}

class HostedDaemon implements CorralDaemon {
  readonly config: Config;
  readonly done: Promise<void>;
  private readonly log: Logger;
  private readonly clock: Clock;
  private readonly options: DaemonOptions;
  private _state: DaemonState = 'idle';
  private core: Daemon | undefined;
  private database: ResolvedDatabase | undefined;
  private server: ObservabilityServer | undefined;
  private api: HostedApi | undefined;
  /** Spans of turns and outbox requests, when an OTLP endpoint is set (docs/observability.md). */
  private tracer: TurnTracer | undefined;
  private starting: Promise<void> | undefined;
  private halting: Promise<void> | undefined;
  /** `stop()` was called (the supervisor ending on its own is not a stop asked for). */
  private stopAsked = false;
  private settleDone!: (error?: unknown) => void;

  constructor(options: DaemonOptions) {
    const count = options.localWorkers?.count ?? 0;
    if (!Number.isInteger(count) || count < 0 || count > 64) {
      throw new CorralError('invalid_argument', 'localWorkers.count must be an integer in 0..64');
    }
    this.options = options;
    this.config = loadConfig(settingsOf(options), options.env ?? {});
    this.log = options.logger ?? createLogger({ level: this.config.logLevel, pretty: this.config.logPretty });
    this.clock = options.clock ?? systemClock;
    this.done = new Promise<void>((resolve, reject) => {
      this.settleDone = (e) => (e === undefined ? resolve() : reject(toError(e)));
    });
    this.done.catch(() => undefined);
    registerDaemonInternals(this, () => this.core);
  }

  get state(): DaemonState {
    return this._state;
  }

  get endpoint(): string | undefined {
    return this.core?.broker.endpoint || undefined;
  }

  get databaseUrl(): string | undefined {
    return this.database?.url;
  }

  get serverPublicKey(): string | undefined {
    return this.core?.security?.keys.publicKey;
  }

  get metricsUrl(): string | undefined {
    return this.server?.url;
  }

  get httpUrl(): string | undefined {
    return this.api?.url;
  }

  start(): Promise<void> {
    this.starting ??= this.startOnce();
    return this.starting;
  }

  private async startOnce(): Promise<void> {
    if (this._state !== 'idle') throw new CorralError('shutdown', 'the daemon was stopped before it started');
    this._state = 'starting';
    const { config } = this;
    // U2 of src/db/postgres/setup-lock.ts: commands of this home wait for the set-up instead of refusing it
    const unmark = config.databaseUrl && !existsSync(config.homeDir) ? () => undefined : markDaemonStarting(config.homeDir);
    try {
      // first: a malformed OTEL_* setting stops the start before anything else is set up
      this.tracer = await turnTracerFromEnv(this.options.env ?? {});
      const database = (this.database = await resolveDatabase(config, this.log));
      this.throwIfStopAsked();
      const metrics =
        config.metricsPort !== undefined
          ? createMetrics({ onError: (e) => this.log.warn({ err: e.message }, 'metrics: database snapshot failed') })
          : undefined;
      const children = this.extraChildren(metrics);
      const core = (this.core = new Daemon({
        config,
        databaseUrl: database.url,
        logger: this.log,
        clock: this.clock,
        ...(this.options.skipMigrations ? { skipMigrations: true } : {}),
        ...(metrics ? { metrics: metrics.runtime } : {}),
        ...(children ? { extraChildren: children } : {}),
        ...(this.tracer ? { tracer: this.tracer } : {}),
      }));
      if (metrics && config.metricsPort !== undefined) {
        // bound before the daemon starts: a port in use stops it at once (observability/daemon-child.ts)
        this.server = await listenForObservability(core, { host: config.metricsHost, port: config.metricsPort, metrics, logger: this.log });
      }
      await core.prepare();
      unmark();
      this.throwIfStopAsked();
      if (config.httpPort) {
        // after the migrations (the API's client needs the schema), before turns run: a port in
        // use stops the daemon as a metrics port does
        const { startHostedApi } = await import('./http-api.ts');
        this.api = await startHostedApi(config, database.url, this.log);
        this.throwIfStopAsked();
      }
      const handle = core.startSupervisor();
      this._state = 'running';
      handle.done.then(
        () => this.supervisorEnded(undefined),
        (e: unknown) => this.supervisorEnded(e),
      );
      this.log.info(
        {
          endpoint: core.broker.endpoint,
          workers: this.options.localWorkers?.count ?? 0,
          database: database.embedded ? 'embedded' : 'DATABASE_URL',
          ...(this.server ? { metrics: `${config.metricsHost}:${this.server.port}` } : {}),
          ...(this.api ? { http: this.api.url } : {}),
        },
        'corral daemon running',
      );
    } catch (e) {
      unmark();
      // H1: nothing may keep running: a daemon that cannot start holds no connection or port
      await this.release(undefined);
      this._state = 'stopped';
      this.settleDone(this.stopAsked ? undefined : e);
      throw e;
    }
  }

  private throwIfStopAsked(): void {
    if (this.stopAsked) throw new CorralError('shutdown', 'the daemon was stopped while it started');
  }

  private extraChildren(metrics: Metrics | undefined): ((endpoint: string) => ChildSpec<Daemon>[]) | undefined {
    const { config } = this;
    const count = this.options.localWorkers?.count ?? 0;
    const workers = count > 0 ? localWorkers({ ...this.options.localWorkers, count }, config) : undefined;
    const serving = metrics !== undefined && config.metricsPort !== undefined;
    if (!workers && !serving) return undefined;
    return (endpoint) => {
      const http = serving
        ? observabilityChild({
            host: config.metricsHost,
            port: config.metricsPort!,
            metrics,
            logger: this.log,
            ...(this.server ? { server: this.server } : {}),
          })
        : undefined;
      return [...(http ? [http] : []), ...(workers?.(endpoint) ?? [])];
    };
  }

  stop(opts: StopDaemonOptions = {}): Promise<void> {
    this.stopAsked = true;
    return this.halt(opts).then(() => this.settleDone());
  }

  /** The one stop (H2), whoever asked for it. */
  private halt(opts: StopDaemonOptions): Promise<void> {
    this.halting ??= this.haltOnce(opts);
    return this.halting;
  }

  private async haltOnce(opts: StopDaemonOptions): Promise<void> {
    const askedAtMs = this.clock.nowMs();
    if (this._state === 'idle') {
      this._state = 'stopped';
      return;
    }
    // a start under way ends first: running, or released (H1) at its next step
    if (this.starting) await this.starting.catch(() => undefined);
    if (this._state === 'running') {
      this._state = 'stopping';
      await this.release(opts.drainMs);
      this._state = 'stopped';
    }
    this.log.info({ stopMs: this.clock.nowMs() - askedAtMs }, 'corral daemon stopped');
  }

  /** H3: the supervisor ended without a stop asked for (it gave up): stop the rest, then say so. */
  private supervisorEnded(e: unknown): void {
    if (e !== undefined) this.log.error({ err: toError(e) }, 'daemon supervisor ended with an error');
    if (this.stopAsked) return;
    void this.halt({}).then(() => this.settleDone(e ?? new CorralError('internal', 'the daemon supervisor ended')));
  }

  /**
   * Stops what was started, each part whatever the others do, and each within a bound (the
   * daemon's own steps are bounded inside it): an HTTP client that keeps a stream open, a metrics
   * scrape or a server that will not stop cannot hold the stop, it is logged and gone past.
   */
  private async release(drainMs: number | undefined): Promise<void> {
    // the API first: no event is taken once the daemon is on its way out
    await this.releaseStep('the HTTP API', RELEASE_STEP_MS, this.api?.close());
    await this.core
      ?.stop({ deadlineMs: 10_000, ...(drainMs === undefined ? {} : { drainMs }) })
      .catch((e: unknown) => this.log.warn({ err: toError(e) }, 'the daemon did not stop cleanly'));
    await this.releaseStep('the metrics server', RELEASE_STEP_MS, this.server?.close());
    // the spans of the last turns go out before the process ends
    await this.releaseStep('the trace exporter', TRACE_FLUSH_MS, this.tracer?.shutdown());
    await this.releaseStep('the embedded PostgreSQL', EMBEDDED_STOP_MS, stopEmbeddedIfStartedHere(this.database?.embedded, this.log));
  }

  private async releaseStep(what: string, ms: number, step: Promise<unknown> | undefined): Promise<void> {
    if (!step) return;
    const work = step.catch((e: unknown) => this.log.warn({ step: what, err: toError(e) }, `${what} did not close cleanly`));
    if (!(await settlesWithin(this.clock, ms, work)))
      this.log.warn({ step: what, waitedMs: ms }, `${what} did not close in time; going on`);
  }
}

/**
 * The daemon's tracer when `env` sets an OTLP endpoint (OpenTelemetry's variables); undefined,
 * loading no OpenTelemetry code, otherwise.
 */
async function turnTracerFromEnv(env: Record<string, string | undefined>): Promise<TurnTracer | undefined> {
  const settings = tracingSettings(env, 'corral-daemon');
  if (!settings) return undefined;
  const { createTurnTracer } = await import('../observability/tracing.ts');
  return createTurnTracer(settings);
}
