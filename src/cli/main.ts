/** The `corral` command line. Every command has `--help`; errors map to exit codes (see exit.ts). */
import { Command, CommanderError, InvalidArgumentError, Option } from 'commander';
import type { Config } from '../config.ts';
import { CorralError } from '../errors.ts';
import { exitCodeFor, messageFor, EXIT } from './exit.ts';
import { resolveConfig } from './context.ts';
import { runDaemonCommand } from './commands/daemon.ts';
import { runWorkerCommand } from './commands/worker.ts';
import { runSendCommand } from './commands/send.ts';
import { runTranscriptCommand } from './commands/transcript.ts';
import { runMigrateCommand, runStopEmbeddedCommand } from './commands/db.ts';
import { runCancelCommand, runSteerCommand } from './commands/steer.ts';
import { registerDlqCommands } from './commands/dlq.ts';
import { registerKeysCommands } from './commands/keys.ts';
import { runActorCommand, runStatusCommand } from './commands/status.ts';

export function intArg(min: number, max: number) {
  return (value: string): number => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < min || n > max) throw new InvalidArgumentError(`expected an integer in ${min}..${max}`);
    return n;
  };
}

interface Globals {
  logLevel?: Config['logLevel'];
  pretty?: boolean;
}

export function buildProgram(run: (p: Promise<number>) => void): Command {
  const program = new Command('corral')
    .description('corral: a durable actor runtime for long-lived AI-agent sessions (PostgreSQL + ZeroMQ)')
    .addOption(
      new Option('--log-level <level>', 'log level').choices(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']),
    )
    .option('--pretty', 'human-readable logs instead of JSON lines')
    .showHelpAfterError('(run with --help for usage)')
    .exitOverride();

  const config = (extra: Partial<Config> = {}): Config => {
    const g = program.opts<Globals>();
    return resolveConfig({
      ...(g.logLevel ? { logLevel: g.logLevel } : {}),
      ...(g.pretty ? { logPretty: true } : {}),
      ...extra,
    });
  };

  program
    .command('daemon')
    .description('apply migrations, then run the daemon (broker, queue consumer, watchdog, recovery)')
    .option('--workers <n>', 'also run N local example workers as supervised processes', intArg(0, 64), 0)
    .option('--worker-capacity <n>', 'concurrent turns per local worker', intArg(1, 1024), 1)
    .option('--endpoint <url>', 'ZeroMQ endpoint to bind (default CORRAL_ENDPOINT or tcp://127.0.0.1:5555)')
    .option('--metrics-port <port>', 'serve /metrics, /healthz, /readyz on this port (default CORRAL_METRICS_PORT; off when unset)', intArg(0, 65_535))
    .option('--metrics-host <host>', 'address for the metrics server (default CORRAL_METRICS_HOST or 127.0.0.1)')
    .option('--insecure', 'turn CURVE off: any process that reaches the endpoint may register as a worker (CORRAL_INSECURE=1)')
    .option('--insecure-remote', 'with --insecure, allow binding a non-loopback address (CORRAL_INSECURE_REMOTE=1)')
    .action((o: { workers: number; workerCapacity: number; endpoint?: string; metricsPort?: number; metricsHost?: string; insecure?: boolean; insecureRemote?: boolean }) =>
      run(
        runDaemonCommand(
          config({
            ...(o.insecure ? { insecure: true } : {}),
            ...(o.insecureRemote ? { insecureRemote: true } : {}),
            ...(o.endpoint ? { endpoint: o.endpoint } : {}),
            ...(o.metricsPort !== undefined ? { metricsPort: o.metricsPort } : {}),
            ...(o.metricsHost ? { metricsHost: o.metricsHost } : {}),
          }),
          o,
        ),
      ),
    );

  program
    .command('worker')
    .description('run the bundled example worker ({"text"}: echo, {"delayMs"}: wait, {"fail": true}: turn_error)')
    .option('--id <id>', 'worker id (default: <host>-<pid>)')
    .option('--endpoint <url>', "the daemon's endpoint (default CORRAL_ENDPOINT or tcp://127.0.0.1:5555)")
    .option('--capacity <n>', 'concurrent turns', intArg(1, 1024), 1)
    .option('--key-file <file>', 'key file from `corral keys add-worker` (CORRAL_WORKER_KEY_FILE; default: issued under CORRAL_HOME)')
    .option('--server-key <z85>', "the daemon's public key, overriding the key file's (CORRAL_SERVER_KEY)")
    .option('--insecure', 'connect without CURVE (only to a daemon started with --insecure)')
    .addOption(new Option('--duplicate-results', 'send every result twice (fault injection)').hideHelp())
    .action((o: { id?: string; endpoint?: string; capacity: number; duplicateResults?: boolean; keyFile?: string; serverKey?: string; insecure?: boolean }) =>
      run(
        runWorkerCommand(
          config({
            ...(o.keyFile ? { workerKeyFile: o.keyFile } : {}),
            ...(o.serverKey ? { serverKey: o.serverKey } : {}),
            ...(o.insecure ? { insecure: true } : {}),
          }),
          o,
        ),
      ),
    );

  program
    .command('send')
    .description('enqueue an event for an actor and print its id')
    .argument('<actor>', 'the actor key, <agent_uid>/<session_id>')
    .argument('<json>', 'the event payload, JSON (e.g. \'{"text":"hi"}\')')
    .action((actor: string, json: string) => run(runSendCommand(config(), actor, json, process.stdout)));

  program
    .command('transcript')
    .description("print an actor's committed transcript")
    .argument('<actor>', 'the actor key, <agent_uid>/<session_id>')
    .option('--json', 'JSON output')
    .action((actor: string, o: { json?: boolean }) => run(runTranscriptCommand(config(), actor, o, process.stdout)));

  program
    .command('steer')
    .description("steer an actor's live turn in place: the worker gets the input and a new revision")
    .argument('<actor>', 'the actor key, <agent_uid>/<session_id>')
    .argument('<json>', 'the steering input, JSON')
    .action((actor: string, json: string) => run(runSteerCommand(config(), actor, json, process.stdout)));

  program
    .command('cancel')
    .description("cancel an actor's live turn: the worker is told to stop, the turn is recorded as cancelled")
    .argument('<actor>', 'the actor key, <agent_uid>/<session_id>')
    .option('--reason <text>', 'why (recorded on the turn)')
    .action((actor: string, o: { reason?: string }) => run(runCancelCommand(config(), actor, o, process.stdout)));

  program
    .command('status')
    .description('queue depths, dead letters, live activations, workers, oldest waiting event')
    .option('--json', 'JSON output')
    .action((o: { json?: boolean }) => run(runStatusCommand(config(), o, process.stdout)));

  program
    .command('actor')
    .description("one actor: its activation, pending events, recent turns and dead letters")
    .argument('<actor>', 'the actor key, <agent_uid>/<session_id>')
    .option('--json', 'JSON output')
    .action((actor: string, o: { json?: boolean }) => run(runActorCommand(config(), actor, o, process.stdout)));

  registerDlqCommands(program, () => config(), run, { out: process.stdout, err: process.stderr });
  registerKeysCommands(program, () => config(), run, { out: process.stdout, err: process.stderr });

  const db = program.command('db').description('database maintenance');
  db.command('migrate')
    .description("apply corral's migrations and pg-boss's schema (safe with several daemons)")
    .action(() => run(runMigrateCommand(config(), process.stdout)));
  db.command('stop')
    .description('stop the embedded PostgreSQL under .corral/ (if running)')
    .action(() => run(runStopEmbeddedCommand(config(), process.stdout)));

  return program;
}

export async function main(argv: string[]): Promise<number> {
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

const code = await main(process.argv);
process.exitCode = code;
