/**
 * `corral sinks add | list | show | remove | enable`: the webhook sinks the outbox delivers to
 * (src/outbox/sinks.ts). `add` prints the sink's signing secret once on standard output (the
 * receiver checks signatures with it); `show --secret` prints it again.
 *
 * Exit codes: 0 done, 1 error (a name taken), 2 bad arguments, 3 nothing matched (an unknown
 * name). The database and the operations load only when a command runs.
 */
import { readFile } from 'node:fs/promises';
import type { Command } from 'commander';
import type { Config } from '../../config.ts';
import { CorralError } from '../../base/errors.ts';
import { intArg } from '../args.ts';
import { withDatabase, type ConfigFn, type Io, type RunFn } from './table-commands.ts';

const AFTER_ADD = `
Each message is POSTed to the URL as application/json with the Standard Webhooks headers:
webhook-id (the same on every retry: the receiver's idempotency key), webhook-timestamp and
webhook-signature ("v1," + base64 HMAC-SHA256 of "<id>.<timestamp>.<body>", keyed by the
secret's decoded bytes). See docs/operations.md, "Webhook sinks".

The secret (whsec_ + base64) is printed on standard output, alone; without --secret-file one is
made (32 random bytes).

Examples:
  corral sinks add slack-bridge --url https://bridge.example.com/corral
  corral sinks add crm --url https://crm.example.com/hooks --secret-file crm.secret --timeout 5s --concurrency 8`;

export async function runSinksAdd(
  config: Config,
  name: string,
  flags: { url?: string; secretFile?: string; timeout?: string; concurrency?: number },
  io: Io,
): Promise<number> {
  if (!flags.url) throw new CorralError('invalid_argument', 'corral sinks add needs --url');
  const secret = flags.secretFile === undefined ? undefined : await readSecretFile(flags.secretFile);
  const ops = await import('../../outbox/sinks.ts');
  const made = await withDatabase(config, (db) =>
    ops.addSink(db, { name, url: flags.url!, secret, timeout: flags.timeout, concurrency: flags.concurrency }),
  );
  io.out.write(`${made.secret}\n`);
  io.err.write(`sink ${made.name} added: ${made.url} (timeout ${made.timeoutMs} ms, ${made.concurrency} at once)\n`);
  return 0;
}

async function readSecretFile(path: string): Promise<string> {
  try {
    return (await readFile(path, 'utf8')).trim();
  } catch (e) {
    throw new CorralError('invalid_argument', `cannot read --secret-file ${path}: ${(e as Error).message}`);
  }
}

export async function runSinksList(config: Config, flags: { json?: boolean }, io: Io): Promise<number> {
  const ops = await import('../../outbox/sinks.ts');
  const list = await withDatabase(config, (db) => ops.listSinkViews(db));
  if (flags.json) {
    io.out.write(`${JSON.stringify({ sinks: list }, null, 2)}\n`);
    return 0;
  }
  if (list.length === 0) {
    io.out.write('no sinks: add one with corral sinks add NAME --url URL\n');
    return 0;
  }
  const { renderTable } = await import('./status.ts');
  io.out.write(
    renderTable(
      ['NAME', 'URL', 'TIMEOUT', 'AT ONCE', 'PENDING', 'DEAD', 'STATE'],
      list.map((s) => [
        s.name,
        s.url,
        `${s.timeoutMs} ms`,
        String(s.concurrency),
        String(s.pending),
        String(s.dead),
        s.disabledAt ? `disabled: ${s.disabledReason ?? ''}` : 'enabled',
      ]),
      120,
    ),
  );
  return 0;
}

export async function runSinksShow(config: Config, name: string, flags: { secret?: boolean; json?: boolean }, io: Io): Promise<number> {
  const ops = await import('../../outbox/sinks.ts');
  const s = await withDatabase(config, (db) => ops.showSink(db, name, { secret: flags.secret ?? false }));
  if (flags.secret && !flags.json) {
    io.out.write(`${s.secret}\n`);
    return 0;
  }
  io.out.write(`${JSON.stringify(s, null, 2)}\n`);
  return 0;
}

export async function runSinksRemove(config: Config, name: string, flags: { force?: boolean }, io: Io): Promise<number> {
  const ops = await import('../../outbox/sinks.ts');
  const r = await withDatabase(config, (db) => ops.removeSink(db, name, { force: flags.force ?? false }));
  const dropped = r.pendingDropped > 0 ? ` (${r.pendingDropped} pending message${r.pendingDropped === 1 ? '' : 's'} dropped unsent)` : '';
  io.out.write(`sink ${name} removed${dropped}\n`);
  return 0;
}

export async function runSinksEnable(config: Config, name: string, io: Io): Promise<number> {
  const ops = await import('../../outbox/sinks.ts');
  const s = await withDatabase(config, (db) => ops.enableSink(db, name));
  io.out.write(`sink ${s.name} enabled\n`);
  return 0;
}

/** Adds `sinks add|list|show|remove|enable` under `program`. */
export function registerSinksCommands(program: Command, config: ConfigFn, run: RunFn, io: Io): void {
  const cmd = program.command('sinks').description('webhook sinks the outbox delivers to: add, list, show, remove, enable');
  cmd
    .command('add')
    .description('add a sink and print its signing secret (once, alone, on standard output)')
    .argument('<name>', 'a name for it, 1-64 characters of A-Z a-z 0-9 . _ -')
    .option('--url <url>', 'where messages are POSTed (http or https)')
    .option('--secret-file <path>', 'a file holding the Standard Webhooks secret (whsec_…); default: a new one')
    .option('--timeout <duration>', 'longest wait for an answer, e.g. 10s (100ms to 10m)', '10s')
    .option('--concurrency <n>', 'messages sent to it at once (1 to 64)', intArg(1, 64), 4)
    .addHelpText('after', AFTER_ADD)
    .action((name: string, o: { url?: string; secretFile?: string; timeout?: string; concurrency?: number }) =>
      run(runSinksAdd(config(), name, o, io)),
    );
  cmd
    .command('list')
    .description('list the sinks: name, URL, timeout, concurrency, pending and dead messages, enabled or why disabled; never a secret')
    .option('--json', 'JSON output')
    .action((o: { json?: boolean }) => run(runSinksList(config(), o, io)));
  cmd
    .command('show')
    .description('one sink as JSON; with --secret, its signing secret alone')
    .argument('<name>', 'the sink')
    .option('--secret', 'print its signing secret')
    .option('--json', 'JSON output, the secret included with --secret')
    .action((name: string, o: { secret?: boolean; json?: boolean }) => run(runSinksShow(config(), name, o, io)));
  cmd
    .command('remove')
    .description('remove a sink and its messages; refused while some are pending, unless --force')
    .argument('<name>', 'the sink')
    .option('--force', 'remove it even with messages pending: they are dropped, never sent')
    .action((name: string, o: { force?: boolean }) => run(runSinksRemove(config(), name, o, io)));
  cmd
    .command('enable')
    .description('enable a sink again (a receiver answering 410 Gone disables it)')
    .argument('<name>', 'the sink')
    .action((name: string) => run(runSinksEnable(config(), name, io)));
}
