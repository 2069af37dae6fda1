/**
 * `npm run dlq:replay -- <id…> | --all [--actor a/s] [--since 2h] [--error text] [--yes] [--json]`:
 * puts dead-lettered events back on their actors, per-actor order kept, idempotent.
 *
 *   npm run dlq:replay -- 0192f1c4-…                       # one dead letter
 *   npm run dlq:replay -- --all --actor agent-1/s1         # prints the plan, exits 2
 *   npm run dlq:replay -- --all --actor agent-1/s1 --yes   # does it
 *
 * Same configuration, output and exit codes as `corral dlq replay`.
 */
import { configureAct, runScript } from '../src/cli/commands/dlq-cli.ts';
import { resolveConfig } from '../src/cli/context.ts';

process.exitCode = await runScript(
  'dlq:replay',
  process.argv,
  (program, config, run, io) => configureAct(program, 'replay', config, run, io),
  resolveConfig,
);
