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
  admin  the operator console (/console, corral console): every actor, and acting on them,
         on dead letters, the outbox and workers; give it to operators only

Actors (--actors, repeatable; default every actor): the actors the token may touch, each
<agent_uid>/<session_id> with either part exact or a prefix ending in * (tenant-a/*,
tenant-a/user-42, support-*/*). A request naming another actor is answered 404, as for one
that does not exist. Give a browser or a partner a token for their own actors only.

--ttl makes a token that expires (30m, 1h, 7d): requests with it are refused afterwards, and its
streams end then. Without it, a token lasts until revoked.

The token is printed once, on standard output, and nothing else is (or written to --out FILE,
made readable by its owner only, 0600): store it now (only its SHA-256 is kept). Requests send it
as "Authorization: Bearer <token>".

Examples:
  corral tokens create web-app --scope send --scope read
  corral tokens create tenant-a-reader --scope read --actors 'tenant-a/*' --out tenant-a.token
  corral tokens create chat-s42 --scope read --scope send --actors chat/s42 --ttl 1h`;

const AFTER_REVOKE = `
A revoked token never authorizes again: requests with it are refused at once, and streams opened
with it end within about 15 seconds. Its name stays taken (corral tokens list shows it revoked).`;

/** Collects a repeated `--scope`. */
const collect = (value: string, previous: string[] = []): string[] => [...previous, value];

export async function runTokensCreate(
  config: Config,
  name: string,
  flags: { scope?: string[]; actors?: string[]; ttl?: string; out?: string },
  io: Io,
): Promise<number> {
  const ops = await import('../../ops/api-tokens.ts');
  const { parseActorPatterns, describeActorScope } = await import('../../base/actor-scope.ts');
  const tokenName = ops.parseTokenName(name);
  const scopes = ops.parseScopes(flags.scope ?? []);
  const actors = flags.actors === undefined ? undefined : parseActorPatterns(flags.actors);
  const ttlMs = flags.ttl === undefined ? undefined : ops.parseTokenTtl(flags.ttl);
  // the file first: a path that cannot be written makes no token
  const out = flags.out === undefined ? undefined : await openTokenFile(flags.out);
  let made: Awaited<ReturnType<typeof ops.createToken>>;
  try {
    made = await withDatabase(config, (db) =>
      ops.createToken(db, tokenName, scopes, { ...(actors ? { actors } : {}), ...(ttlMs === undefined ? {} : { ttlMs }) }),
    );
  } catch (e) {
    await out?.discard();
    throw e;
  }
  if (out) await out.write(`${made.token}\n`);
  else io.out.write(`${made.token}\n`);
  const where = out ? `written to ${flags.out} (mode 0600)` : 'it is shown only now';
  const expires = made.expiresAt ? `, expires ${made.expiresAt}` : '';
  io.err.write(
    `token ${made.name} created (scopes: ${made.scopes.join(', ')}; actors: ${describeActorScope(made.actors ?? undefined)}${expires}); ${where}\n`,
  );
  return 0;
}

/** `--out FILE`: a new file, 0600 from its creation (never a moment readable by others); refused when it exists. */
async function openTokenFile(path: string): Promise<{ write(text: string): Promise<void>; discard(): Promise<void> }> {
  const { open, unlink } = await import('node:fs/promises');
  const { CorralError } = await import('../../base/errors.ts');
  let fh: Awaited<ReturnType<typeof open>>;
  try {
    fh = await open(path, 'wx', 0o600);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    const why = code === 'EEXIST' ? 'it exists (a token file is never overwritten)' : (e as Error).message;
    throw new CorralError('invalid_argument', `--out ${path}: cannot make the file: ${why}`);
  }
  return {
    async write(text) {
      try {
        await fh.writeFile(text);
      } finally {
        await fh.close();
      }
    },
    async discard() {
      await fh.close().catch(() => undefined);
      await unlink(path).catch(() => undefined);
    },
  };
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
      ['NAME', 'SCOPES', 'ACTORS', 'CREATED', 'EXPIRES', 'LAST USED', 'REVOKED'],
      list.map((t) => [
        t.name,
        t.scopes.join(','),
        t.actors ? t.actors.join(' ') : 'every actor',
        time(t.createdAt),
        t.expiresAt === null ? 'never' : time(t.expiresAt),
        time(t.lastUsedAt),
        time(t.revokedAt),
      ]),
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
    .option('--scope <scope>', 'what it may do: read, send or admin; repeat for several (at least one)', collect)
    .option(
      '--actors <pattern...>',
      'the actors it may touch: agent/session, either part exact or a prefix ending in * (default every actor)',
    )
    .option('--ttl <duration>', 'make it expire after this long (30m, 1h, 7d); default: until revoked')
    .option('--out <file>', 'write the token to this new file, mode 0600, instead of standard output')
    .addHelpText('after', AFTER_CREATE)
    .action((name: string, o: { scope?: string[]; actors?: string[]; ttl?: string; out?: string }) =>
      run(runTokensCreate(config(), name, o, io)),
    );

  cmd
    .command('list')
    .description(
      'list the API tokens: name, scopes, actors, when created, when it expires, last used (to the minute) and revoked; never the tokens',
    )
    .option('--json', 'JSON output')
    .action((o: { json?: boolean }) => run(runTokensList(config(), o, io)));

  cmd
    .command('revoke')
    .description('revoke an API token: it never authorizes again')
    .argument('<name>', 'the token')
    .addHelpText('after', AFTER_REVOKE)
    .action((name: string) => run(runTokensRevoke(config(), name, io)));
}
