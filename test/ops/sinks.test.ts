/**
 * Webhook sinks and their signatures: `corral sinks add | list | show | remove | enable` as the
 * command functions on a real database (what stdout holds, what is stored, what is refused), and
 * the Standard Webhooks signature checked against the specification's own example.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { runSinksAdd, runSinksEnable, runSinksList, runSinksRemove, runSinksShow } from '../../src/cli/commands/sinks.ts';
import { loadConfig, type Config } from '../../src/config.ts';
import { setSinkDisabled } from '../../src/db/outbox/sinks.ts';
import { CorralError } from '../../src/base/errors.ts';
import { generateSecret, secretKey, signWebhook, verifyWebhook } from '../../src/outbox/signature.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { captureIo, errorCodeOf } from '../helpers/capture.ts';

const io = captureIo;

const tdb = useTestDatabase();
let config: Config;

beforeAll(() => {
  config = loadConfig({ databaseUrl: tdb.url, logLevel: 'silent' }, {});
});

const codeOf = errorCodeOf;

describe('Standard Webhooks signatures', () => {
  // the example of the specification (standardwebhooks.com, "Verifying webhooks")
  const secret = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
  const id = 'msg_p5jXN8AQM9LWM0D4loKWxJek';
  const body = '{"test": 2432232314}';

  it('signs id.timestamp.body with the decoded key, as the specification does', () => {
    expect(signWebhook(secret, id, 1614265330, body)).toBe('v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=');
  });

  it('verifies a match among several signatures, and refuses a changed body, a stale or malformed timestamp', () => {
    const signature = `v1,bm90IGl0 ${signWebhook(secret, id, 1614265330, body)}`;
    const headers = { id, timestamp: '1614265330', signature };
    expect(verifyWebhook(secret, headers, body, { nowS: 1614265330 + 10 })).toEqual({ ok: true });
    expect(verifyWebhook(secret, headers, `${body} `, { nowS: 1614265330 })).toEqual({ ok: false, reason: 'no_match' });
    expect(verifyWebhook(secret, { ...headers, id: 'msg_other' }, body, { nowS: 1614265330 })).toEqual({ ok: false, reason: 'no_match' });
    expect(verifyWebhook(secret, headers, body, { nowS: 1614265330 + 301 })).toEqual({ ok: false, reason: 'stale' });
    expect(verifyWebhook(secret, { ...headers, timestamp: '16e8' }, body)).toEqual({ ok: false, reason: 'bad_timestamp' });
    expect(verifyWebhook(generateSecret(), headers, body, { nowS: 1614265330 })).toEqual({ ok: false, reason: 'no_match' });
  });

  it('makes secrets of 32 random bytes and refuses what is not one', () => {
    const s = generateSecret();
    expect(s).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/);
    expect(secretKey(s)).toHaveLength(32);
    expect(generateSecret()).not.toBe(s);
    for (const bad of ['', 'whsec_', 'MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', 'whsec_c2hvcnQ=', 'whsec_not base64!']) {
      expect(() => secretKey(bad), bad).toThrow(CorralError);
    }
  });
});

describe('corral sinks (command functions)', () => {
  it('add prints the secret alone on stdout; list and show never show it; show --secret does', async () => {
    const added = io();
    expect(await runSinksAdd(config, 'crm', { url: 'https://crm.example.com/hooks', timeout: '5s', concurrency: 8 }, added)).toBe(0);
    const secret = added.out.text.trim();
    expect(added.out.text).toBe(`${secret}\n`);
    expect(secretKey(secret)).toHaveLength(32);
    const stored = await tdb.client.query(`select url, secret, timeout_ms, concurrency, disabled_at from corral.sinks where name = 'crm'`);
    expect(stored.rows[0]).toEqual({ url: 'https://crm.example.com/hooks', secret, timeout_ms: 5000, concurrency: 8, disabled_at: null });

    const listed = io();
    await runSinksList(config, { json: true }, listed);
    expect(listed.out.text).not.toContain(secret);
    expect(JSON.parse(listed.out.text).sinks).toMatchObject([{ name: 'crm', url: 'https://crm.example.com/hooks', timeoutMs: 5000 }]);
    const table = io();
    await runSinksList(config, {}, table);
    expect(table.out.text).toMatch(/crm\s+https:\/\/crm\.example\.com\/hooks\s+5000 ms\s+8\s+0\s+0\s+enabled/);

    const shown = io();
    await runSinksShow(config, 'crm', {}, shown);
    expect(shown.out.text).not.toContain(secret);
    const withSecret = io();
    await runSinksShow(config, 'crm', { secret: true }, withSecret);
    expect(withSecret.out.text).toBe(`${secret}\n`);
  });

  it('takes a secret from a file; refuses a taken name, a bad URL, a URL with credentials, a bad secret, timeout or concurrency', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'corral-sinks-'));
    const file = join(dir, 'secret');
    writeFileSync(file, 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n');
    const out = io();
    await runSinksAdd(config, 'bridge', { url: 'http://127.0.0.1:9/in', secretFile: file, allowPrivate: true }, out);
    expect(out.out.text).toBe('whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n');
    expect(await codeOf(runSinksAdd(config, 'bridge', { url: 'http://127.0.0.1:9/in', allowPrivate: true }, io()))).toBe('already_exists');
    // without --allow-private a URL inside is refused before the name is looked at
    expect(await codeOf(runSinksAdd(config, 'inside', { url: 'http://127.0.0.1:9/in' }, io()))).toBe('invalid_argument');
    expect(await codeOf(runSinksAdd(config, 'x', { url: 'ftp://a/b' }, io()))).toBe('invalid_argument');
    expect(await codeOf(runSinksAdd(config, 'x', { url: 'not a url' }, io()))).toBe('invalid_argument');
    expect(await codeOf(runSinksAdd(config, 'x', { url: 'https://user:pw@a.example/b' }, io()))).toBe('invalid_argument');
    expect(await codeOf(runSinksAdd(config, 'x', {}, io()))).toBe('invalid_argument');
    expect(await codeOf(runSinksAdd(config, 'bad name', { url: 'https://a.example/' }, io()))).toBe('invalid_argument');
    writeFileSync(file, 'not a secret');
    expect(await codeOf(runSinksAdd(config, 'x', { url: 'https://a.example/', secretFile: file }, io()))).toBe('invalid_argument');
    expect(await codeOf(runSinksAdd(config, 'x', { url: 'https://a.example/', secretFile: join(dir, 'missing') }, io()))).toBe(
      'invalid_argument',
    );
    expect(await codeOf(runSinksAdd(config, 'x', { url: 'https://a.example/', timeout: '20m' }, io()))).toBe('invalid_argument');
    expect(await codeOf(runSinksAdd(config, 'x', { url: 'https://a.example/', concurrency: 0 }, io()))).toBe('invalid_argument');
    expect((await tdb.client.query(`select 1 from corral.sinks where name = 'x'`)).rowCount).toBe(0);
  });

  it('enable clears a disabled sink; remove deletes it; an unknown name is not_found', async () => {
    await runSinksAdd(config, 'gone', { url: 'https://gone.example/' }, io());
    await setSinkDisabled(tdb.database.db, 'gone', 'HTTP 410 Gone');
    const table = io();
    await runSinksList(config, {}, table);
    expect(table.out.text).toMatch(/gone\s+.*disabled: HTTP 410 Gone/);
    await runSinksEnable(config, 'gone', io());
    expect((await tdb.client.query(`select disabled_at, disabled_reason from corral.sinks where name = 'gone'`)).rows[0]).toEqual({
      disabled_at: null,
      disabled_reason: null,
    });
    await runSinksRemove(config, 'gone', {}, io());
    expect((await tdb.client.query(`select 1 from corral.sinks where name = 'gone'`)).rowCount).toBe(0);
    for (const p of [
      () => runSinksRemove(config, 'gone', {}, io()),
      () => runSinksEnable(config, 'gone', io()),
      () => runSinksShow(config, 'gone', {}, io()),
    ]) {
      expect(await codeOf(p())).toBe('not_found');
    }
  });
});
