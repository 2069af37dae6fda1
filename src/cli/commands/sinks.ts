/**
 * `corral sinks add | list | show | remove | enable | rotate-secret`: the webhook sinks the outbox
 * delivers to (src/outbox/sinks.ts). `add` and `rotate-secret` print the sink's (new) signing
 * secret once on standard output (the receiver checks signatures with it); `show --secret` prints
 * it again, with the previous one while a rotation's overlap lasts.
 *
 * Exit codes: 0 done, 1 error (a name taken), 2 bad arguments (a URL pointing inside without
 * --allow-private among them), 3 nothing matched (an unknown name). The database and the
 * operations load only when a command runs.
 */
import { readFile } from 'node:fs/promises';
import type { Command } from 'commander';
import type { Config } from '../../config.ts';
import { CorralError } from '../../base/errors.ts';
import { intArg } from '../args.ts';
import { withDatabase, type ConfigFn, type Io, type RunFn } from './table-commands.ts';

const AFTER_ADD = `
Each message is POSTed to the URL as application/json with the Standard Webhooks headers:
webhook-id (<agent_uid>/<session_id>/<key>, or <agent_uid>/<session_id>/<event_id>.<index>
without a key: the same on every retry, the receiver's idempotency key), webhook-timestamp and
webhook-signature ("v1," + base64 HMAC-SHA256 of "<id>.<timestamp>.<body>", keyed by the
secret's decoded bytes), and corral-actor (<agent_uid>/<session_id>) and corral-key (the key,
when the message has one). See docs/operations.md, "Webhook sinks".

The secret (whsec_ + base64) is printed on standard output, alone; without --secret-file one is
made (32 random bytes).

--agents limits which agents' turns may deliver to the sink (agent_uids, or prefixes ending in
*, as for corral keys add-worker): a result of another agent's turn delivering to it is refused
deliver_forbidden and nothing of it commits. Default: every agent.

A URL whose host is, or resolves to, a loopback, private (10/8, 172.16/12, 192.168/16, CGNAT
100.64/10), link-local (169.254/16, fe80::/10, the cloud metadata addresses), unique-local
(fc00::/7), unspecified, multicast or broadcast address, in any spelling (0x7f000001, 127.1,
[::ffff:127.0.0.1], localhost …), is refused, and so is a connection to such an address when
the name resolves to one later; --allow-private lets the sink point inside (a receiver on this
host or network).

Examples:
  corral sinks add slack-bridge --url https://bridge.example.com/corral
  corral sinks add crm --url https://crm.example.com/hooks --secret-file crm.secret --timeout 5s --concurrency 8
  corral sinks add tenant-a-crm --url https://crm.tenant-a.example/in --agents tenant-a
  corral sinks add local --url http://127.0.0.1:8080/hooks --allow-private`;

const AFTER_ROTATE = `
Prints the new secret (whsec_ + base64) on standard output, alone; without --secret-file one is
made. During the overlap every request to the sink is signed with both secrets
(webhook-signature holds "v1,<new> v1,<old>", new first), so the receiver may switch to the new
secret at any moment of it; after the overlap, with the new one only. Pending messages are kept:
their next attempts are signed so. Rotating again during an overlap ends the older secret at
once (two signatures at most). --overlap 0 stops the old secret at once.

Examples:
  corral sinks rotate-secret crm                       # 24 h of overlap
  corral sinks rotate-secret crm --overlap 1h --secret-file crm-new.secret
  corral sinks show crm --secret                       # both secrets while both sign`;

export async function runSinksAdd(
  config: Config,
  name: string,
  flags: { url?: string; secretFile?: string; timeout?: string; concurrency?: number; agents?: string[]; allowPrivate?: boolean },
  io: Io,
): Promise<number> {
  if (!flags.url) throw new CorralError('invalid_argument', 'corral sinks add needs --url');
  const secret = flags.secretFile === undefined ? undefined : await readSecretFile(flags.secretFile);
  const ops = await import('../../outbox/sinks.ts');
  const made = await withDatabase(config, (db) =>
    ops.addSink(db, {
      name,
      url: flags.url!,
      secret,
      timeout: flags.timeout,
      concurrency: flags.concurrency,
      agents: flags.agents,
      allowPrivate: flags.allowPrivate === true,
    }),
  );
  io.out.write(`${made.secret}\n`);
  io.err.write(
    `sink ${made.name} added: ${made.url} (timeout ${made.timeoutMs} ms, ${made.concurrency} at once, agents ${agentsText(made.agents)}` +
      `${made.allowPrivate ? ', private addresses allowed' : ''})\n`,
  );
  return 0;
}

const agentsText = (agents: readonly string[] | null) => (agents === null ? 'all' : agents.join(','));

export async function runSinksRotateSecret(
  config: Config,
  name: string,
  flags: { overlap?: string; secretFile?: string },
  io: Io,
): Promise<number> {
  const secret = flags.secretFile === undefined ? undefined : await readSecretFile(flags.secretFile);
  const ops = await import('../../outbox/sinks.ts');
  const s = await withDatabase(config, (db) => ops.rotateSecret(db, name, { secret, overlap: flags.overlap }));
  io.out.write(`${s.secret}\n`);
  io.err.write(
    s.previousSecretUntil === null
      ? `sink ${s.name}: new secret; the old one no longer signs\n`
      : `sink ${s.name}: new secret; requests are signed with it and the old one until ${s.previousSecretUntil}, then with it alone\n`,
  );
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
      ['NAME', 'URL', 'TIMEOUT', 'AT ONCE', 'PENDING', 'DEAD', 'STATE', 'AGENTS', 'PRIVATE'],
      list.map((s) => [
        s.name,
        s.url,
        `${s.timeoutMs} ms`,
        String(s.concurrency),
        String(s.pending),
        String(s.dead),
        s.disabledAt ? `disabled: ${s.disabledReason ?? ''}` : 'enabled',
        agentsText(s.agents),
        s.allowPrivate ? 'allowed' : 'refused',
      ]),
      140,
    ),
  );
  return 0;
}

export async function runSinksShow(config: Config, name: string, flags: { secret?: boolean; json?: boolean }, io: Io): Promise<number> {
  const ops = await import('../../outbox/sinks.ts');
  const s = await withDatabase(config, (db) => ops.showSink(db, name, { secret: flags.secret ?? false }));
  if (flags.secret && !flags.json) {
    // the current secret first and alone on its line, as before rotations (scripts read line 1)
    io.out.write(`${s.secret}\n${s.previousSecret === undefined ? '' : `${s.previousSecret}\n`}`);
    if (s.previousSecret !== undefined)
      io.err.write(`the second line is the previous secret: it signs too (after the first) until ${s.previousSecretUntil}\n`);
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

/** Adds `sinks add|list|show|remove|enable|rotate-secret` under `program`. */
export function registerSinksCommands(program: Command, config: ConfigFn, run: RunFn, io: Io): void {
  const cmd = program.command('sinks').description('webhook sinks the outbox delivers to: add, list, show, remove, enable, rotate-secret');
  cmd
    .command('add')
    .description('add a sink and print its signing secret (once, alone, on standard output)')
    .argument('<name>', 'a name for it, 1-64 characters of A-Z a-z 0-9 . _ -')
    .option('--url <url>', 'where messages are POSTed (http or https; not inside this host or network unless --allow-private)')
    .option('--secret-file <path>', 'a file holding the Standard Webhooks secret (whsec_…); default: a new one')
    .option('--timeout <duration>', 'longest wait for an answer, e.g. 10s (100ms to 10m)', '10s')
    .option('--concurrency <n>', 'messages sent to it at once (1 to 64)', intArg(1, 64), 4)
    .option('--agents <pattern...>', 'the agents whose turns may deliver to it: agent_uids, or prefixes ending in * (default: every agent)')
    .option('--allow-private', 'let the URL point at a loopback, private or link-local address (refused by default)')
    .addHelpText('after', AFTER_ADD)
    .action(
      (
        name: string,
        o: { url?: string; secretFile?: string; timeout?: string; concurrency?: number; agents?: string[]; allowPrivate?: boolean },
      ) => run(runSinksAdd(config(), name, o, io)),
    );
  cmd
    .command('rotate-secret')
    .description(
      'give a sink a new signing secret and print it (once, alone, on standard output); the old one signs too during the overlap',
    )
    .argument('<name>', 'the sink')
    .option('--overlap <duration>', 'how long the old secret signs too, e.g. 24h, 30m, or 0 (0 to 30d)', '24h')
    .option('--secret-file <path>', 'a file holding the new secret (whsec_…); default: a new one')
    .addHelpText('after', AFTER_ROTATE)
    .action((name: string, o: { overlap?: string; secretFile?: string }) => run(runSinksRotateSecret(config(), name, o, io)));
  cmd
    .command('list')
    .description(
      'list the sinks: name, URL, timeout, concurrency, pending and dead messages, enabled or why disabled, agents, private addresses; never a secret',
    )
    .option('--json', 'JSON output')
    .action((o: { json?: boolean }) => run(runSinksList(config(), o, io)));
  cmd
    .command('show')
    .description(
      'one sink as JSON (agents, allowPrivate, previousSecretUntil during a rotation); with --secret, its signing secret alone, and the previous one on a second line while it still signs',
    )
    .argument('<name>', 'the sink')
    .option('--secret', 'print its signing secret')
    .option('--json', 'JSON output, the secrets included with --secret (secret, previousSecret)')
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
