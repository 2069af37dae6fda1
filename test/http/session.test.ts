/**
 * The session cookie (B4 of src/http/auth.ts) on a real port with real `fetch`: `POST /v1/session`
 * trades a valid bearer token for `corral_session` (its attributes exactly), `DELETE` clears it;
 * the cookie authorizes GET routes (scopes still apply), never a write; the header wins over it;
 * a revoked token's cookie is refused at once and its open stream ends; nothing of a token is
 * logged.
 */
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SESSION_MAX_AGE_S } from '../../src/http/auth.ts';
import { generateToken, revokeToken } from '../../src/ops/api-tokens.ts';
import { jobsOf } from '../client/helpers.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { waitFor } from '../helpers/wait.ts';
import { answer, failure, json, startApi, type Api } from './helpers.ts';
import { SseReader } from './sse.ts';
import { Capture } from '../helpers/capture.ts';

const KEEPALIVE_MS = 200;
const tdb = useTestDatabase();
let api: Api;
const logs = new Capture();
let rw: string;
let readOnly: string;
let sendOnly: string;

beforeAll(async () => {
  api = await startApi(tdb.url, { keepAliveMs: KEEPALIVE_MS, logger: pino({ level: 'debug' }, logs) });
  [rw, readOnly, sendOnly] = await Promise.all([
    api.token('rw', ['read', 'send']),
    api.token('reader', ['read']),
    api.token('sender', ['send']),
  ]);
});

afterAll(async () => {
  await api?.stop();
});

const cookie = (token: string) => ({ cookie: `theme=dark; corral_session=${token}; other=1` });
const login = (token: string | null, headers: Record<string, string> = {}) => api.call('/v1/session', { method: 'POST', headers, token });

describe('POST /v1/session and DELETE /v1/session', () => {
  it('a valid token of any scope gets the cookie: HttpOnly, SameSite=Strict, Path=/v1, Max-Age 8 h, no body', async () => {
    expect(SESSION_MAX_AGE_S).toBe(8 * 3600);
    for (const token of [rw, readOnly, sendOnly]) {
      const res = await login(token);
      expect(res.status).toBe(204);
      expect(res.headers.getSetCookie()).toEqual([`corral_session=${token}; HttpOnly; SameSite=Strict; Path=/v1; Max-Age=28800`]);
      expect(res.headers.get('cache-control')).toBe('no-store');
      expect(await res.text()).toBe('');
    }
  });

  it('over HTTPS (a proxy’s X-Forwarded-Proto) the cookie is Secure too', async () => {
    for (const proto of ['https', 'HTTPS', 'https, http']) {
      const res = await login(rw, { 'x-forwarded-proto': proto });
      expect(res.headers.getSetCookie(), proto).toEqual([
        `corral_session=${rw}; HttpOnly; SameSite=Strict; Path=/v1; Max-Age=28800; Secure`,
      ]);
    }
    expect((await login(rw, { 'x-forwarded-proto': 'http' })).headers.getSetCookie()[0]).not.toMatch(/Secure/);
  });

  it('needs the Authorization header: none, the cookie alone, a bad or a revoked token are 401 and set nothing', async () => {
    await api.token('gone-login', ['read']);
    const gone = await api.token('gone-login-2', ['read']);
    await revokeToken(api.database.db, 'gone-login-2');
    const cases: [string, Promise<Response>, RegExp][] = [
      [
        'nothing',
        login(null),
        /^an API token is needed: Authorization: Bearer <token> \(corral tokens create\); a session cookie is taken by GET routes only$/,
      ],
      ['the cookie alone', login(null, cookie(rw)), /^an API token is needed/],
      ['unknown', login(generateToken()), /^the token is not valid \(unknown, revoked or expired\)$/],
      ['revoked', login(gone), /^the token is not valid \(unknown, revoked or expired\)$/],
      ['malformed', login(null, { authorization: 'Basic eDp5' }), /must be "Bearer <token>"/],
    ];
    for (const [what, res, message] of cases) {
      const r = await res;
      expect(await answer(r), what).toEqual({ status: 401, body: failure('unauthorized', message) });
      expect(r.headers.getSetCookie(), what).toEqual([]);
    }
  });

  it('DELETE clears the cookie, with no token needed (a revoked one may still be in the browser); GET is 405', async () => {
    for (const init of [{ token: null }, { token: rw }, { token: null, headers: cookie(generateToken()) }]) {
      const res = await api.call('/v1/session', { method: 'DELETE', ...init });
      expect(res.status).toBe(204);
      expect(res.headers.getSetCookie()).toEqual(['corral_session=; HttpOnly; SameSite=Strict; Path=/v1; Max-Age=0']);
    }
    const https = await api.call('/v1/session', { method: 'DELETE', token: null, headers: { 'x-forwarded-proto': 'https' } });
    expect(https.headers.getSetCookie()).toEqual(['corral_session=; HttpOnly; SameSite=Strict; Path=/v1; Max-Age=0; Secure']);
    const get = await api.call('/v1/session', { token: rw });
    expect(await answer(get)).toEqual({
      status: 405,
      body: failure('method_not_allowed', 'GET is not allowed here: POST /v1/session and DELETE /v1/session are'),
    });
    expect(get.headers.get('allow')).toBe('POST, DELETE');
  });
});

describe('the cookie on the routes', () => {
  it('authorizes the GET routes: the transcript, an event, the stream', async () => {
    expect(await answer(await api.call('/v1/actors/web/c1/transcript', { token: null, headers: cookie(readOnly) }))).toEqual({
      status: 200,
      body: { actor: 'web/c1', turns: [] },
    });
    // authorized, so the route itself answers: there is no such event
    const event = await api.call('/v1/events/0190f7e2-0000-7000-8000-000000000000', { token: null, headers: cookie(rw) });
    expect(await answer(event)).toEqual({ status: 404, body: failure('not_found', /^no event/) });
    const stream = await api.call('/v1/actors/web/c1/stream', { token: null, headers: cookie(rw) });
    expect(stream.status).toBe(200);
    expect(stream.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
    await new SseReader(stream).cancel();
    await waitFor(() => api.server.streams === 0, { what: 'the stream released' });
  });

  it('never authorizes a write: a POST of an event with the cookie alone is 401 and enqueues nothing', async () => {
    // what a page on another site could make a browser send: a form's POST, and a script's
    const form = await api.call('/v1/actors/web/csrf/events', {
      method: 'POST',
      headers: { ...cookie(rw), 'content-type': 'text/plain' },
      body: '{"text": "forged"}',
      token: null,
    });
    const script = await api.call('/v1/actors/web/csrf/events', { ...json({ text: 'forged' }, cookie(rw)), token: null });
    for (const r of [form, script]) {
      expect(await answer(r)).toEqual({ status: 401, body: failure('unauthorized', /^an API token is needed/) });
      expect(r.headers.get('www-authenticate')).toBe('Bearer realm="corral"');
    }
    expect(await jobsOf(tdb.client, 'web/csrf')).toEqual([]);
    // the same request with the header is taken: the 401 was the cookie's
    expect((await api.call('/v1/actors/web/csrf/events', { ...json({ text: 'real' }), token: rw })).status).toBe(202);
    expect(await jobsOf(tdb.client, 'web/csrf')).toHaveLength(1);
  });

  it('keeps the scopes: a send-only token’s cookie cannot read', async () => {
    expect(await answer(await api.call('/v1/actors/web/c1/transcript', { token: null, headers: cookie(sendOnly) }))).toEqual({
      status: 403,
      body: failure('forbidden', 'the token sender has no scope read (its scopes: send)'),
    });
  });

  it('the Authorization header wins: a bad header is not rescued by a good cookie, a good header needs no cookie', async () => {
    const bad = await api.call('/v1/actors/web/c1/transcript', { token: generateToken(), headers: cookie(rw) });
    expect(await answer(bad)).toEqual({ status: 401, body: failure('unauthorized', /^the token is not valid/) });
    const malformed = await api.call('/v1/actors/web/c1/transcript', {
      token: null,
      headers: { ...cookie(rw), authorization: 'Basic eDp5' },
    });
    expect(malformed.status).toBe(401);
    expect((await api.call('/v1/actors/web/c1/transcript', { token: readOnly, headers: cookie(generateToken()) })).status).toBe(200);
    // the header's token is the one whose scopes count, not the cookie's
    const sendWithReaderHeader = await api.call('/v1/actors/web/c1/events', { ...json({ text: 'x' }, cookie(rw)), token: readOnly });
    expect(sendWithReaderHeader.status).toBe(403);
  });

  it('no cookie, an empty or unknown one, or only other cookies: 401', async () => {
    const cases: [Record<string, string>, RegExp, string][] = [
      [
        {},
        /^an API token is needed: Authorization: Bearer <token> \(corral tokens create\), or the session cookie of POST \/v1\/session$/,
        'Bearer realm="corral"',
      ],
      [{ cookie: 'theme=dark; corral_sessionx=1' }, /^an API token is needed/, 'Bearer realm="corral"'],
      [{ cookie: 'corral_session=' }, /^the token is not valid/, 'Bearer realm="corral", error="invalid_token"'],
      [cookie(generateToken()), /^the token is not valid/, 'Bearer realm="corral", error="invalid_token"'],
      [cookie('hunter2'), /^the token is not valid/, 'Bearer realm="corral", error="invalid_token"'],
    ];
    for (const [headers, message, challenge] of cases) {
      for (const path of ['/v1/actors/web/c1/transcript', '/v1/actors/web/c1/stream']) {
        const res = await api.call(path, { token: null, headers });
        expect(await answer(res), `${JSON.stringify(headers)} ${path}`).toEqual({ status: 401, body: failure('unauthorized', message) });
        expect(res.headers.get('www-authenticate')).toBe(challenge);
      }
    }
  });

  it('a revoked token’s cookie is refused at once, and the stream it opened ends', async () => {
    const token = await api.token('revoked-later', ['read']);
    const session = (await login(token)).headers.getSetCookie()[0]!.split(';')[0]!;
    const headers = { cookie: session };
    expect((await api.call('/v1/actors/web/rev/transcript', { token: null, headers })).status).toBe(200);
    const stream = await api.call('/v1/actors/web/rev/stream', { token: null, headers });
    expect(stream.status).toBe(200);
    const sse = new SseReader(stream);
    await waitFor(() => api.server.streams === 1, { what: 'the stream open' });

    await revokeToken(api.database.db, 'revoked-later');
    expect(await answer(await api.call('/v1/actors/web/rev/transcript', { token: null, headers }))).toEqual({
      status: 401,
      body: failure('unauthorized', 'the token is not valid (unknown, revoked or expired)'),
    });
    expect((await api.call('/v1/actors/web/rev/stream', { token: null, headers })).status).toBe(401);
    // B4 and S4: checked again every keep-alive interval, so it ends within one
    while ((await sse.next(KEEPALIVE_MS * 20)) !== undefined);
    expect(sse.ended).toBe(true);
    await waitFor(() => api.server.streams === 0, { what: 'the stream of the revoked token ended' });
  });

  it('logs name tokens, never their text, nor a Cookie or Authorization header', async () => {
    await login(rw);
    await api.call('/v1/actors/web/c1/transcript', { token: null, headers: cookie(rw) });
    await api.call('/v1/actors/web/c1/transcript', { token: null, headers: cookie(generateToken()) });
    await waitFor(() => logs.text.includes('session cookie set'), { what: 'the debug lines written' });
    for (const secret of [rw, readOnly, sendOnly, rw.slice(4), 'corral_session']) expect(logs.text).not.toContain(secret);
    expect(logs.text).toContain('"token":"rw"');
  });
});
