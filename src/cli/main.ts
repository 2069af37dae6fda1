/**
 * The `corral` command line. Every command has `--help`; errors map to exit codes (see exit.ts).
 *
 * Start-up time is part of the interface (`corral send` runs in scripts, `--help` at a prompt):
 * this module loads only commander; the configuration module loads before an action runs, and
 * each command's module (with the database, pg-boss or ZeroMQ it needs) when it runs.
 */
import { Command, CommanderError, Option } from 'commander';
import type * as ConfigModule from '../config.ts';
import type { Config } from '../config.ts';
import { CorralError } from '../base/errors.ts';
import { dropOutputOnClosedPipe, exitCodeFor, messageFor, EXIT } from './exit.ts';
import { registerDlqCommands } from './commands/dlq-cli.ts';
import { registerKeysCommands } from './commands/keys.ts';
import { registerPolicyCommands } from './commands/policy.ts';
import { registerRetentionCommands } from './commands/retention.ts';
import { registerTokensCommands } from './commands/tokens.ts';
import { registerConsoleCommand } from './commands/console.ts';
import { registerShardsCommands } from './commands/shards.ts';
import { registerSinksCommands } from './commands/sinks.ts';
import { registerOutboxCommands } from './commands/outbox.ts';
import { intArg } from './args.ts';
import { DEFAULT_WORKER_CAPACITY } from '../base/defaults.ts';

const MIGRATE_HELP = `
--shards N sets up a deployment of N shards on this database (the catalog, shard 0): corral's
tables and pg-boss's in corral_s<k> and pgboss_s<k> for each shard k, at the database
"corral shards set-url" names for it. N is fixed once any shard holds an actor or an event.
Each shard's SQL enqueue takes only its own actors' events (wrong_shard names the right one).
A daemon serves every shard (corral daemon --shards all) or the ones it is given (--shards 0,3);
see docs/scaling.md, "Shards".`;

interface Globals {
  logLevel?: Config['logLevel'];
  pretty?: boolean;
}

export function buildProgram(run: (p: Promise<number>) => void): Command {
  const program = new Command('corral')
    .description('corral: a durable actor runtime for long-lived AI-agent sessions (PostgreSQL + ZeroMQ)')
    .addOption(new Option('--log-level <level>', 'log level').choices(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']))
    .option('--pretty', 'human-readable logs instead of JSON lines')
    .showHelpAfterError('(run with --help for usage)')
    .exitOverride();

  let loadConfig: typeof ConfigModule.loadConfig | undefined;
  program.hook('preAction', async () => {
    loadConfig ??= (await import('../config.ts')).loadConfig;
  });
  const config = (extra: Partial<Config> = {}): Config => {
    const g = program.opts<Globals>();
    if (!loadConfig) throw new CorralError('internal', 'configuration read before the command ran');
    return loadConfig(
      {
        ...(g.logLevel ? { logLevel: g.logLevel } : {}),
        ...(g.pretty ? { logPretty: true } : {}),
        ...extra,
      },
      process.env,
    );
  };

  program
    .command('daemon')
    .description('apply migrations, then run the daemon (broker, queue consumer, watchdog, recovery)')
    .option('--workers <n>', 'also run N local example workers as supervised processes', intArg(0, 64), 0)
    .option('--worker-capacity <n>', 'concurrent turns per local worker', intArg(1, 1024), DEFAULT_WORKER_CAPACITY)
    .option('--endpoint <url>', 'ZeroMQ endpoint to bind (default CORRAL_ENDPOINT or tcp://127.0.0.1:5555)')
    .option(
      '--metrics-port <port>',
      'serve /metrics, /healthz, /readyz on this port (default CORRAL_METRICS_PORT; off when unset)',
      intArg(0, 65_535),
    )
    .option('--metrics-host <host>', 'address for the metrics server (default CORRAL_METRICS_HOST or 127.0.0.1)')
    .option(
      '--http-port <port>',
      'serve the HTTP API (docs/http.md) on this port (default CORRAL_HTTP_PORT; off when unset or 0)',
      intArg(0, 65_535),
    )
    .option('--http-host <host>', 'address for the HTTP API (default CORRAL_HTTP_HOST or 127.0.0.1; loopback unless behind TLS)')
    .option('--http-ui', 'with --http-port, also serve the chat page at / (CORRAL_HTTP_UI=1)')
    .option('--shards <list>', 'the shards to serve of a sharded deployment: all, or numbers such as 0,3 (default CORRAL_SHARDS or all)')
    .option('--insecure', 'turn CURVE off: any process that reaches the endpoint may register as a worker (CORRAL_INSECURE=1)')
    .option('--insecure-remote', 'with --insecure, allow binding a non-loopback address (CORRAL_INSECURE_REMOTE=1)')
    .action(
      (o: {
        workers: number;
        workerCapacity: number;
        endpoint?: string;
        metricsPort?: number;
        metricsHost?: string;
        httpPort?: number;
        httpHost?: string;
        httpUi?: boolean;
        shards?: string;
        insecure?: boolean;
        insecureRemote?: boolean;
      }) =>
        run(
          import('./commands/daemon.ts').then((m) =>
            m.runDaemonCommand(
              config({
                ...(o.insecure ? { insecure: true } : {}),
                ...(o.insecureRemote ? { insecureRemote: true } : {}),
                ...(o.endpoint ? { endpoint: o.endpoint } : {}),
                ...(o.metricsPort !== undefined ? { metricsPort: o.metricsPort } : {}),
                ...(o.metricsHost ? { metricsHost: o.metricsHost } : {}),
                ...(o.httpPort !== undefined ? { httpPort: o.httpPort } : {}),
                ...(o.httpHost ? { httpHost: o.httpHost } : {}),
                ...(o.httpUi ? { httpUi: true } : {}),
                ...(o.shards ? { shards: o.shards } : {}),
              }),
              o,
            ),
          ),
        ),
    );

  program
    .command('worker')
    .description('run the bundled example worker ({"text"}: echo, {"delayMs"}: wait, {"fail": true}: turn_error)')
    .option('--id <id>', 'worker id (default: <host>-<pid>)')
    .option('--endpoint <url>', "the daemon's endpoint (default CORRAL_ENDPOINT or tcp://127.0.0.1:5555)")
    .option(
      '--capacity <n>',
      'concurrent turns (size by turn length × turns/s wanted; see docs/benchmarks.md)',
      intArg(1, 1024),
      DEFAULT_WORKER_CAPACITY,
    )
    .option('--key-file <file>', 'key file from `corral keys add-worker` (CORRAL_WORKER_KEY_FILE; default: issued under CORRAL_HOME)')
    .option('--server-key <z85>', "the daemon's public key, overriding the key file's (CORRAL_SERVER_KEY)")
    .option('--insecure', 'connect without CURVE (only to a daemon started with --insecure)')
    .addOption(new Option('--duplicate-results', 'send every result twice (fault injection)').hideHelp())
    .action(
      (o: {
        id?: string;
        endpoint?: string;
        capacity: number;
        duplicateResults?: boolean;
        keyFile?: string;
        serverKey?: string;
        insecure?: boolean;
      }) =>
        run(
          import('./commands/worker.ts').then((m) =>
            m.runWorkerCommand(
              config({
                ...(o.keyFile ? { workerKeyFile: o.keyFile } : {}),
                ...(o.serverKey ? { serverKey: o.serverKey } : {}),
                ...(o.insecure ? { insecure: true } : {}),
              }),
              o,
            ),
          ),
        ),
    );

  program
    .command('send')
    .summary('enqueue an event for an actor and print its id')
    .description(
      'enqueue an event for an actor and print its id. The event is JSON: the argument, a file (--file) or standard ' +
        'input (-); at most CORRAL_MAX_EVENT_BYTES (default 256 KiB). Arguments are limited by the OS (about 128 KiB): ' +
        'send larger events from a file or standard input.',
    )
    .argument('<actor>', 'the actor key, <agent_uid>/<session_id>')
    .argument('[json]', 'the event payload, JSON (e.g. \'{"text":"hi"}\'); - reads it from standard input')
    .option('--file <path>', 'read the event from this file (- for standard input): for events too large for an argument')
    .addHelpText(
      'after',
      '\nExamples:\n  corral send a/s1 \'{"text":"hi"}\'\n  corral send a/s1 --file event.json\n  make-event | corral send a/s1 -',
    )
    .action((actor: string, json: string | undefined, o: { file?: string }) =>
      run(
        import('./commands/send.ts').then((m) =>
          m.runSendCommand(config(), actor, { json, file: o.file }, { out: process.stdout, err: process.stderr, stdin: process.stdin }),
        ),
      ),
    );

  program
    .command('transcript')
    .description("print an actor's committed transcript")
    .argument('<actor>', 'the actor key, <agent_uid>/<session_id>')
    .option('--json', 'JSON output')
    .action((actor: string, o: { json?: boolean }) =>
      run(import('./commands/transcript.ts').then((m) => m.runTranscriptCommand(config(), actor, o, process.stdout))),
    );

  program
    .command('watch')
    .description("follow an actor's live turns: each turn's start, what its worker streams, then the committed turn")
    .argument('<actor>', 'the actor key, <agent_uid>/<session_id>')
    .option('--json', 'one JSON event per line: {"id","type","data"}, types turn_started, chunk, turn_committed, turn_failed, reset, error')
    .option('--once', 'exit once a turn has ended (committed or failed)')
    .option('--last-event-id <id>', 'resume right after this event id (from an earlier --json line)')
    .option('--url <url>', "a remote daemon's HTTP API (e.g. http://host:8080) instead of the database; the token in CORRAL_TOKEN")
    .addHelpText(
      'after',
      '\nExamples:\n  corral watch a/s1\n  corral watch a/s1 --json | jq -c .\n  corral watch a/s1 --once --json\n  CORRAL_TOKEN=crl_… corral watch a/s1 --url http://daemon-host:8080',
    )
    .action((actor: string, o: { json?: boolean; once?: boolean; lastEventId?: string; url?: string }) =>
      run(
        import('./commands/watch.ts').then((m) => {
          const stop = new AbortController();
          const onSignal = () => stop.abort();
          process.once('SIGINT', onSignal);
          process.once('SIGTERM', onSignal);
          return m.runWatchCommand(config(), actor, o, { out: process.stdout, err: process.stderr, signal: stop.signal }).finally(() => {
            process.off('SIGINT', onSignal);
            process.off('SIGTERM', onSignal);
          });
        }),
      ),
    );

  program
    .command('steer')
    .description("steer an actor's live turn in place: the worker gets the input and a new revision")
    .argument('<actor>', 'the actor key, <agent_uid>/<session_id>')
    .argument('[json]', 'the steering input, JSON; - reads it from standard input')
    .option('--file <path>', 'read the steering input from this file (- for standard input)')
    .action((actor: string, json: string | undefined, o: { file?: string }) =>
      run(
        import('./commands/steer.ts').then((m) =>
          m.runSteerCommand(config(), actor, { json, file: o.file }, { out: process.stdout, stdin: process.stdin }),
        ),
      ),
    );

  program
    .command('cancel')
    .description("cancel an actor's live turn: the worker is told to stop, the turn is recorded as cancelled")
    .argument('<actor>', 'the actor key, <agent_uid>/<session_id>')
    .option('--reason <text>', 'why (recorded on the turn)')
    .action((actor: string, o: { reason?: string }) =>
      run(import('./commands/steer.ts').then((m) => m.runCancelCommand(config(), actor, o, process.stdout))),
    );

  program
    .command('status')
    .description('live daemons, queue depths, dead letters, live activations, workers (stale when silent), oldest waiting event')
    .option('--json', 'JSON output')
    .action((o: { json?: boolean }) => run(import('./commands/status.ts').then((m) => m.runStatusCommand(config(), o, process.stdout))));

  program
    .command('actor')
    .description('one actor: its activation, pending events, recent turns and dead letters')
    .argument('<actor>', 'the actor key, <agent_uid>/<session_id>')
    .option('--json', 'JSON output')
    .action((actor: string, o: { json?: boolean }) =>
      run(import('./commands/status.ts').then((m) => m.runActorCommand(config(), actor, o, process.stdout))),
    );

  program
    .command('turn')
    .description('every attempt of one event of an actor: status, fence, worker, its trace and span (docs/observability.md)')
    .argument('<actor>', 'the actor key, <agent_uid>/<session_id>')
    .argument('<event-id>', 'the event id, as `corral send` printed it')
    .option('--json', 'JSON output')
    .action((actor: string, eventId: string, o: { json?: boolean }) =>
      run(import('./commands/status.ts').then((m) => m.runTurnCommand(config(), actor, eventId, o, process.stdout))),
    );

  registerDlqCommands(program, () => config(), run, { out: process.stdout, err: process.stderr });
  registerKeysCommands(program, () => config(), run, { out: process.stdout, err: process.stderr });
  registerRetentionCommands(program, () => config(), run, { out: process.stdout, err: process.stderr });
  registerPolicyCommands(program, () => config(), run, { out: process.stdout, err: process.stderr });
  registerTokensCommands(program, () => config(), run, { out: process.stdout, err: process.stderr });
  registerConsoleCommand(program, () => config(), run, { out: process.stdout, err: process.stderr });
  registerSinksCommands(program, () => config(), run, { out: process.stdout, err: process.stderr });
  registerOutboxCommands(program, () => config(), run, { out: process.stdout, err: process.stderr });
  registerShardsCommands(program, () => config(), run, { out: process.stdout, err: process.stderr });

  const db = program.command('db').description('database maintenance');
  db.command('migrate')
    .description("apply corral's migrations and pg-boss's schema (safe with several daemons)")
    .option('--shards <n>', 'spread actors over N shards, fixed once keys are placed (default: as set, else 1)', intArg(1, 1024))
    .addHelpText('after', MIGRATE_HELP)
    .action((o: { shards?: number }) => run(import('./commands/db.ts').then((m) => m.runMigrateCommand(config(), process.stdout, o))));
  db.command('stop')
    .description('stop the embedded PostgreSQL under .corral/ (if running)')
    .action(() => run(import('./commands/db.ts').then((m) => m.runStopEmbeddedCommand(config(), process.stdout))));

  return program;
}

export async function main(argv: string[]): Promise<number> {
  dropOutputOnClosedPipe();
  let pending: Promise<number> | undefined;
  const program = buildProgram((p) => {
    pending = p;
  });
  try {
    await program.parseAsync(argv);
  } catch (e) {
    if (e instanceof CommanderError) {
      if (e.code === 'commander.helpDisplayed' || e.code === 'commander.version' || e.code === 'commander.help') return 0;
      if (e.code === 'commander.executeSubCommandAsync') return e.exitCode;
      return EXIT.usage;
    }
    process.stderr.write(`corral: ${messageFor(e)}\n`);
    return exitCodeFor(e);
  }
  if (!pending) {
    program.outputHelp();
    return EXIT.usage;
  }
  try {
    return await pending;
  } catch (e) {
    process.stderr.write(`corral: ${messageFor(e)}\n`);
    if (!(e instanceof CorralError) && process.env.CORRAL_DEBUG) console.error(e);
    return exitCodeFor(e);
  }
}

/**
 * Once a command is done, the process exits when nothing is left to run; should something still
 * hold it open (a socket, a timer, a child that will not end), it exits after EXIT_GRACE_MS anyway,
 * naming what was left, instead of hanging: a stopped daemon must not outlive its stop.
 */
const EXIT_GRACE_MS = 2_000;

const code = await main(process.argv);
process.exitCode = code;
setTimeout(() => {
  const left = process.getActiveResourcesInfo().filter((r) => r !== 'Timeout' && r !== 'TTYWrap');
  process.stderr.write(`corral: exiting ${EXIT_GRACE_MS} ms after the command ended, with ${left.join(', ') || 'nothing'} still open\n`);
  process.exit(code);
}, EXIT_GRACE_MS).unref();
