/**
 * API tokens: `corral tokens create | list | revoke` in-process (the command functions, their
 * output checked against the table) and as the real CLI for what only a process shows (what
 * stdout holds, exit codes, `--help`), and the verifier: hash lookups, revocation, `last_used_at`
 * written at most once a minute.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { runTokensCreate, runTokensList, runTokensRevoke } from '../../src/cli/commands/tokens.ts';
import { loadConfig, type Config } from '../../src/config.ts';
import { listApiTokens } from '../../src/db/operations/api-tokens.ts';
import { createToken, hashToken, parseScopes, revokeToken, TOKEN_TEXT, tokenVerifier } from '../../src/ops/api-tokens.ts';
import { CORRAL, corral, run } from '../cli/helpers.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { captureIo, errorCodeOf } from '../helpers/capture.ts';

const io = captureIo;

const tdb = useTestDatabase();
let config: Config;

beforeAll(() => {
  config = loadConfig({ databaseUrl: tdb.url, logLevel: 'silent' }, {});
});

const codeOf = errorCodeOf;

describe('corral tokens (command functions)', () => {
  it('create prints the token alone on stdout, stores only its hash; list shows no secret; revoke marks it', async () => {
    const made = io();
    expect(await runTokensCreate(config, 'web-app', { scope: ['send', 'read', 'send'] }, made)).toBe(0);
    const token = made.out.text.trimEnd();
    expect(made.out.text).toBe(`${token}\n`);
    expect(token).toMatch(TOKEN_TEXT);
    expect(token).toHaveLength(4 + 43);
    expect(made.err.text).toBe('token web-app created (scopes: read, send; actors: every actor); it is shown only now\n');

    const stored = await tdb.client.query<{ token_sha256: string; scopes: string[] }>(
      'select token_sha256, scopes from corral.api_tokens where name = $1',
      ['web-app'],
    );
    expect(stored.rows).toEqual([{ token_sha256: hashToken(token), scopes: ['read', 'send'] }]);
    const whole = JSON.stringify((await tdb.client.query('select * from corral.api_tokens')).rows);
    expect(whole).not.toContain(token);
    expect(whole).not.toContain(token.slice(4));

    const second = io();
    await runTokensCreate(config, 'dash.board_1', { scope: ['read'] }, second);
    expect(second.out.text.trimEnd()).not.toBe(token);

    const listed = io();
    expect(await runTokensList(config, { json: true }, listed)).toBe(0);
    const tokens = (JSON.parse(listed.out.text) as { tokens: Record<string, unknown>[] }).tokens;
    expect(tokens.map((t) => [t.name, t.scopes, t.lastUsedAt, t.revokedAt])).toEqual([
      ['dash.board_1', ['read'], null, null],
      ['web-app', ['read', 'send'], null, null],
    ]);
    expect(Object.keys(tokens[0]!).sort()).toEqual(['actors', 'createdAt', 'expiresAt', 'lastUsedAt', 'name', 'revokedAt', 'scopes']);
    expect(listed.out.text).not.toContain(token);
    expect(listed.out.text).not.toContain(hashToken(token));

    const revoked = io();
    expect(await runTokensRevoke(config, 'web-app', revoked)).toBe(0);
    expect(revoked.out.text).toBe('token web-app revoked: it authorizes nothing any more\n');
    const again = io();
    expect(await runTokensRevoke(config, 'web-app', again)).toBe(0);
    expect(again.out.text).toMatch(/^token web-app was revoked already, at \d{4}-\d\d-\d\dT/);

    const table = io();
    await runTokensList(config, {}, table);
    const lines = table.out.text.trimEnd().split('\n');
    expect(lines[0]).toMatch(/^NAME\s+SCOPES\s+ACTORS\s+CREATED\s+EXPIRES\s+LAST USED\s+REVOKED$/);
    expect(lines[1]).toMatch(/^dash\.board_1\s+read\s+every actor\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ\s+never\s+-\s+-$/);
    expect(lines[2]).toMatch(/^web-app\s+read,send\s+every actor\s+\S+ \S+\s+never\s+-\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ$/);
    expect(table.out.text).not.toContain(token);
  });

  it('refuses a taken name (a revoked one too), an unknown name to revoke, bad names and scopes', async () => {
    await createToken(tdb.database.db, 'taken', ['read']);
    const taken = io();
    await expect(runTokensCreate(config, 'taken', { scope: ['send'] }, taken)).rejects.toThrow(/a token named taken exists already/);
    expect(taken.out.text).toBe('');
    await revokeToken(tdb.database.db, 'taken');
    expect(await codeOf(createToken(tdb.database.db, 'taken', ['read']))).toBe('already_exists');
    expect(await codeOf(runTokensRevoke(config, 'never-made', io()))).toBe('not_found');
    expect(await codeOf(runTokensCreate(config, 'bad name', { scope: ['read'] }, io()))).toBe('invalid_argument');
    expect(await codeOf(runTokensCreate(config, 'x'.repeat(65), { scope: ['read'] }, io()))).toBe('invalid_argument');
    expect(await codeOf(runTokensCreate(config, 'no-scope', {}, io()))).toBe('invalid_argument');
    expect(await codeOf(runTokensCreate(config, 'root', { scope: ['root'] }, io()))).toBe('invalid_argument');
    expect(() => parseScopes([])).toThrow(/at least one scope/);
    expect(() => parseScopes(['read', 'write'])).toThrow(/unknown scope "write"/);
    expect((await listApiTokens(tdb.database.db)).map((t) => t.name)).not.toContain('no-scope');
  });
});

describe('the token verifier', () => {
  it('finds a token by its hash, refuses other text, and a revoked token at once', async () => {
    const { token } = await createToken(tdb.database.db, 'verify-me', ['read', 'send']);
    let touchFailures = 0;
    const verifier = tokenVerifier(tdb.database.db, { onTouchError: () => touchFailures++ });
    expect(await verifier.verify(token)).toMatchObject({ name: 'verify-me', scopes: ['read', 'send'] });
    expect(await verifier.verify(`${token.slice(0, -1)}${token.endsWith('A') ? 'B' : 'A'}`)).toBeUndefined();
    expect(await verifier.verify(token.slice(4))).toBeUndefined();
    expect(await verifier.verify(`${token} `)).toBeUndefined();
    expect(await verifier.verify('')).toBeUndefined();
    await revokeToken(tdb.database.db, 'verify-me');
    expect(await verifier.verify(token)).toBeUndefined();
    expect(touchFailures).toBe(0);
  });

  it('records a use at most once a minute, however many requests', async () => {
    const { token } = await createToken(tdb.database.db, 'busy', ['read']);
    let now = Date.now();
    const verifier = tokenVerifier(tdb.database.db, { nowMs: () => now });
    const lastUsed = async () =>
      (await tdb.client.query<{ last_used_at: Date | null }>("select last_used_at from corral.api_tokens where name = 'busy'")).rows[0]!
        .last_used_at;
    expect(await lastUsed()).toBeNull();

    await Promise.all(Array.from({ length: 20 }, () => verifier.verify(token)));
    await expect.poll(lastUsed).not.toBeNull();
    const first = (await lastUsed())!;
    // the background write is the only one: later uses within the minute write nothing
    for (let i = 0; i < 10; i++) await verifier.verify(token);
    await new Promise((r) => setTimeout(r, 200));
    expect((await lastUsed())!.getTime()).toBe(first.getTime());

    // a minute on (by the verifier's clock), one more write; the database's own condition still
    // refuses it while its clock says the last one is recent: nothing is written
    now += 61_000;
    await verifier.verify(token);
    await new Promise((r) => setTimeout(r, 200));
    expect((await lastUsed())!.getTime()).toBe(first.getTime());
    // once the stored time is old enough, the write goes through
    await tdb.client.query("update corral.api_tokens set last_used_at = now() - interval '2 minutes' where name = 'busy'");
    now += 61_000;
    await verifier.verify(token);
    await expect.poll(async () => (await lastUsed())!.getTime()).toBeGreaterThan(first.getTime());
  });
});

describe('corral tokens (the CLI)', { timeout: 120_000 }, () => {
  it('prints only the token on stdout; a taken name, an unknown name and bad arguments exit non-zero with a clear message', async () => {
    const created = await corral(['tokens', 'create', 'cli-made', '--scope', 'read', '--scope', 'send'], tdb.url);
    expect(created.code, created.stderr).toBe(0);
    expect(created.stdout).toMatch(/^crl_[A-Za-z0-9_-]{43}\n$/);
    expect(created.stderr).toContain('token cli-made created (scopes: read, send; actors: every actor)');

    const [taken, unknown, noScope, list] = await Promise.all([
      corral(['tokens', 'create', 'cli-made', '--scope', 'read'], tdb.url),
      corral(['tokens', 'revoke', 'nobody'], tdb.url),
      corral(['tokens', 'create', 'other'], tdb.url),
      corral(['tokens', 'list', '--json'], tdb.url),
    ]);
    expect(taken.code).toBe(1);
    expect(taken.stdout).toBe('');
    expect(taken.stderr).toMatch(/^corral: a token named cli-made exists already/);
    expect(unknown.code).toBe(3);
    expect(unknown.stderr).toBe('corral: no token named nobody (corral tokens list shows them)\n');
    expect(noScope.code).toBe(2);
    expect(noScope.stderr).toMatch(/a token needs at least one scope/);
    expect(list.code, list.stderr).toBe(0);
    expect(list.stdout).not.toContain(created.stdout.trim());

    const help = await run([CORRAL, 'tokens', 'create', '--help']);
    expect(help.code).toBe(0);
    expect(help.stdout).toContain('--scope <scope>');
    expect(help.stdout).toContain('corral tokens create web-app --scope send --scope read');
  });
});
