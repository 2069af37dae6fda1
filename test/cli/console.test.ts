/**
 * `corral console` as a subprocess: the one-time sign-in link alone on standard output, for an
 * admin token only; the link's code signs in once (the console's own sign-in, on a real server).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config.ts';
import { createToken } from '../../src/ops/api-tokens.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { startApi, type Api } from '../http/helpers.ts';
import { CORRAL, corral, run } from './helpers.ts';

const tdb = useTestDatabase();
let api: Api;

beforeAll(async () => {
  api = await startApi(tdb.url, { console: { databaseUrl: tdb.url, config: loadConfig({ databaseUrl: tdb.url }, {}) } });
  await createToken(api.database.db, 'ops', ['admin']);
  await createToken(api.database.db, 'reader', ['read']);
});

afterAll(async () => {
  await api?.stop();
});

describe('corral console', { timeout: 120_000 }, () => {
  it('prints a link that signs in once; refuses a token without admin, an unknown one, and no URL to print', async () => {
    const port = String(new URL(api.server.url).port);
    const made = await corral(['console', '--token', 'ops'], tdb.url, { CORRAL_HTTP_PORT: port });
    expect(made.code, made.stderr).toBe(0);
    expect(made.stdout).toMatch(new RegExp(`^http://127\\.0\\.0\\.1:${port}/console/sign-in#code=[A-Za-z0-9_-]{43}\\n$`));
    expect(made.stderr).toMatch(/^a sign-in link for token ops: it works once, until \d{4}-/);
    const code = made.stdout.trim().split('#code=')[1]!;
    const signIn = () =>
      fetch(`${api.server.url}/console/sign-in`, {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded', accept: 'application/json' },
        body: new URLSearchParams({ code }).toString(),
        redirect: 'manual',
      });
    expect((await signIn()).status).toBe(303);
    expect((await signIn()).status).toBe(401);

    const behind = await corral(['console', '--token', 'ops', '--url', 'https://corral.example.com/ops/'], tdb.url);
    expect(behind.code, behind.stderr).toBe(0);
    expect(behind.stdout).toMatch(/^https:\/\/corral\.example\.com\/ops\/console\/sign-in#code=/);

    const [reader, unknown, noPort, noToken, badUrl] = await Promise.all([
      corral(['console', '--token', 'reader'], tdb.url, { CORRAL_HTTP_PORT: port }),
      corral(['console', '--token', 'nobody'], tdb.url, { CORRAL_HTTP_PORT: port }),
      corral(['console', '--token', 'ops'], tdb.url),
      corral(['console'], tdb.url, { CORRAL_HTTP_PORT: port }),
      corral(['console', '--token', 'ops', '--url', 'javascript:alert(1)'], tdb.url),
    ]);
    for (const r of [reader, unknown]) {
      expect(r.code).toBe(3);
      expect(r.stdout).toBe('');
    }
    expect(reader.stderr).toMatch(/no token reader with the admin scope that authorizes now/);
    expect(noPort.code).toBe(2);
    expect(noPort.stderr).toMatch(/the HTTP API has no port/);
    expect(noToken.code).toBe(2);
    expect(noToken.stderr).toMatch(/--token NAME is needed/);
    expect(badUrl.code).toBe(2);

    const help = await run([CORRAL, 'console', '--help']);
    expect(help.code).toBe(0);
    expect(help.stdout).toContain('--token <name>');
    expect(help.stdout).toContain('corral console --token ops');
  });
});
