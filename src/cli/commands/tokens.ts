/**
 * `corral tokens create | list | revoke`: the bearer tokens of the HTTP API
 * (src/ops/api-tokens.ts). `create` prints the token on standard output, alone, once: only its
 * hash is stored, so it cannot be shown again; everything else goes to standard error.
 *
 * Exit codes: 0 done, 1 error (a name taken), 2 bad arguments (name, scopes), 3 nothing matched
 * (`revoke` of an unknown name). Light on purpose: the database and the operations load only
 * when a command runs, so `--help` and argument errors answer at once.
 */
import type { Command } from 'commander';
import type { Config } from '../../config.ts';
import { withDatabase, type ConfigFn, type Io, type RunFn } from './table-commands.ts';

const AFTER_CREATE = `
Scopes:
  read   GET the transcript, an event's state, and the live stream of actors
  send   POST events to actors

The token is printed once, on standard output, and nothing else is: store it now (only its
SHA-256 is kept). Requests send it as "Authorization: Bearer <token>".

Examples:
  corral tokens create web-app --scope send --scope read
  corral tokens create dashboard --scope read > dashboard.token`;

const AFTER_REVOKE = `
A revoked token never authorizes again: requests with it are refused at once, and streams opened
with it end within about 15 seconds. Its name stays taken (corral tokens list shows it revoked).`;

/** Collects a repeated `--scope`. */
const collect = (value: string, previous: string[] = []): string[] => [...previous, value];

export async function runTokensCreate(config: Config, name: string, flags: { scope?: string[] }, io: Io): Promise<number> {
  const ops = await import('../../ops/api-tokens.ts');
  const tokenName = ops.parseTokenName(name);
  const scopes = ops.parseScopes(flags.scope ?? []);
  const made = await withDatabase(config, (db) => ops.createToken(db, tokenName, scopes));
  io.out.write(`${made.token}\n`);
  io.err.write(`token ${made.name} created (scopes: ${made.scopes.join(', ')}); it is shown only now\n`);
  return 0;
}

export async function runTokensList(config: Config, flags: { json?: boolean }, io: Io): Promise<number> {
  const ops = await import('../../ops/api-tokens.ts');
  const list = await withDatabase(config, (db) => ops.listTokens(db));
  if (flags.json) {
    io.out.write(`${JSON.stringify({ tokens: list }, null, 2)}\n`);
    return 0;
  }
  if (list.length === 0) {
    io.out.write('no API tokens: make one with corral tokens create NAME --scope read --scope send\n');
    return 0;
  }
  const { fmtTime, renderTable } = await import('./status.ts');
  const time = (iso: string | null) => fmtTime(iso === null ? null : new Date(iso));
  io.out.write(
    renderTable(
      ['NAME', 'SCOPES', 'CREATED', 'LAST USED', 'REVOKED'],
      list.map((t) => [t.name, t.scopes.join(','), time(t.createdAt), time(t.lastUsedAt), time(t.revokedAt)]),
      80,
    ),
  );
  return 0;
}

export async function runTokensRevoke(config: Config, name: string, io: Io): Promise<number> {
  const ops = await import('../../ops/api-tokens.ts');
  const tokenName = ops.parseTokenName(name);
  const r = await withDatabase(config, (db) => ops.revokeToken(db, tokenName));
  io.out.write(
    r.alreadyRevoked
      ? `token ${r.name} was revoked already, at ${r.revokedAt}\n`
      : `token ${r.name} revoked: it authorizes nothing any more\n`,
  );
  return 0;
}

/** Adds `tokens create|list|revoke` under `program` (inheriting its error handling). */
export function registerTokensCommands(program: Command, config: ConfigFn, run: RunFn, io: Io): void {
  const cmd = program.command('tokens').description('bearer tokens of the HTTP API (CORRAL_HTTP_PORT): create, list, revoke');

  cmd
    .command('create')
    .description('make an API token and print it (once, alone, on standard output)')
    .argument('<name>', 'a name for it, 1-64 characters of A-Z a-z 0-9 . _ - (never reused, even once revoked)')
    .option('--scope <scope>', 'what it may do: read or send; repeat for both (at least one)', collect)
    .addHelpText('after', AFTER_CREATE)
    .action((name: string, o: { scope?: string[] }) => run(runTokensCreate(config(), name, o, io)));

  cmd
    .command('list')
    .description('list the API tokens: name, scopes, when created, last used (to the minute) and revoked; never the tokens')
    .option('--json', 'JSON output')
    .action((o: { json?: boolean }) => run(runTokensList(config(), o, io)));

  cmd
    .command('revoke')
    .description('revoke an API token: it never authorizes again')
    .argument('<name>', 'the token')
    .addHelpText('after', AFTER_REVOKE)
    .action((name: string) => run(runTokensRevoke(config(), name, io)));
}
