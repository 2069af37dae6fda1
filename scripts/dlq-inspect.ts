/**
 * `npm run dlq:inspect -- [list|show] …`: the read-only half of `corral dlq`.
 *
 *   npm run dlq:inspect                                  # list (default), oldest first, 50 at a time
 *   npm run dlq:inspect -- list --actor agent-1/s1 --since 2h --error timeout --json
 *   npm run dlq:inspect -- show <dead-letter-id>
 *
 * Same configuration (DATABASE_URL, CORRAL_*), output and exit codes as `corral dlq list|show`.
 */
import { configureList, configureShow, runScript } from '../src/cli/commands/dlq-cli.ts';
import { resolveConfig } from '../src/cli/context.ts';

process.exitCode = await runScript(
  'dlq:inspect',
  process.argv,
  (program, config, run, io) => {
    program.description('inspect dead-lettered events (list, show)');
    configureList(program.command('list', { isDefault: true }), config, run, io);
    configureShow(program.command('show'), config, run, io);
  },
  resolveConfig,
);
