/**
 * The commander wiring of `corral dlq list | show | replay | discard` and of the operator scripts
 * (scripts/dlq-*.ts). Light on purpose: the work (dlq.ts, the database) loads only when a command
 * runs, so `--help` and argument errors answer at once.
 */
import { Command, CommanderError } from 'commander';
import type { Config } from '../../config.ts';
import { EXIT, dropOutputOnClosedPipe, exitCodeFor, messageFor } from '../exit.ts';
import { intArg } from '../args.ts';
import type { ActFlags, Io, ListFlags } from './dlq.ts';

/** A positive integer up to `max`. */
export const positiveInt = (max: number) => intArg(1, max);

type ConfigFn = () => Config;
type RunFn = (p: Promise<number>) => void;

const filterOptions = (cmd: Command): Command =>
  cmd
    .option('--actor <agent_uid/session_id>', 'only dead letters of this actor')
    .option('--since <duration>', 'only dead-lettered within this long (30m, 2h, 1d, 1h30m, PT2H)')
    .option('--error <text>', 'only those whose last error contains this text (case-insensitive)');

export function configureList(cmd: Command, config: ConfigFn, run: RunFn, io: Io): Command {
  return filterOptions(cmd.description('list dead letters, oldest first'))
    .option('--limit <n>', 'at most this many', positiveInt(10_000), 50)
    .option('--after <id>', 'continue after this dead letter id (paging)')
    .option('--json', 'JSON output')
    .action((o: ListFlags) => run(import('./dlq.ts').then((m) => m.runDlqList(config(), o, io))));
}

export function configureShow(cmd: Command, config: ConfigFn, run: RunFn, io: Io): Command {
  return cmd
    .description("show a dead letter: payload, every attempt's error, the actor's current state")
    .argument('<id>', 'the dead letter id (from `dlq list`)')
    .option('--json', 'JSON output')
    .action((id: string, o: { json?: boolean }) => run(import('./dlq.ts').then((m) => m.runDlqShow(config(), id, o, io))));
}

export function configureAct(cmd: Command, action: 'replay' | 'discard', config: ConfigFn, run: RunFn, io: Io): Command {
  const description =
    action === 'replay'
      ? 'put dead-lettered events back on their actors (order kept, idempotent)'
      : 'delete dead letters (in mode block also the failed original, unblocking the actor); payloads are kept on record';
  return filterOptions(cmd.description(description).argument('[ids...]', 'dead letter ids'))
    .option('--all', `${action} every dead letter matching the filters (or all)`)
    .option('--yes', 'really do it (required with --all or filters)')
    .option('--json', 'JSON output')
    .action((ids: string[], o: ActFlags) => run(import('./dlq.ts').then((m) => m.runDlqAct(config(), action, ids, o, io))));
}

/** Adds `dlq list|show|replay|discard` under `program` (inheriting its error handling). */
export function registerDlqCommands(program: Command, config: ConfigFn, run: RunFn, io: Io): void {
  const dlq = program.command('dlq').description('inspect, replay and discard dead-lettered events');
  configureList(dlq.command('list'), config, run, io);
  configureShow(dlq.command('show'), config, run, io);
  configureAct(dlq.command('replay'), 'replay', config, run, io);
  configureAct(dlq.command('discard'), 'discard', config, run, io);
}

/**
 * Runs a stand-alone operator script (scripts/dlq-*.ts) with the CLI's conventions: global
 * `--log-level`/`--pretty`, errors on stderr, exit codes as for `corral`.
 */
export async function runScript(
  name: string,
  argv: string[],
  build: (program: Command, config: ConfigFn, run: RunFn, io: Io) => void,
  resolve: (overrides: Partial<Config>) => Config,
): Promise<number> {
  dropOutputOnClosedPipe();
  let pending: Promise<number> | undefined;
  const program = new Command(name)
    .option('--log-level <level>', 'log level')
    .option('--pretty', 'human-readable logs')
    .showHelpAfterError('(run with --help for usage)')
    .exitOverride();
  const config: ConfigFn = () => {
    const g = program.opts<{ logLevel?: Config['logLevel']; pretty?: boolean }>();
    return resolve({ ...(g.logLevel ? { logLevel: g.logLevel } : {}), ...(g.pretty ? { logPretty: true } : {}) });
  };
  build(program, config, (p) => (pending = p), { out: process.stdout, err: process.stderr });
  try {
    await program.parseAsync(argv);
    if (!pending) {
      program.outputHelp();
      return EXIT.usage;
    }
    return await pending;
  } catch (e) {
    if (e instanceof CommanderError) {
      return e.code === 'commander.helpDisplayed' || e.code === 'commander.help' ? EXIT.ok : EXIT.usage;
    }
    process.stderr.write(`${name}: ${messageFor(e)}\n`);
    return exitCodeFor(e);
  }
}
