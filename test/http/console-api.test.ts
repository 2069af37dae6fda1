/**
 * The operator console's HTTP surface on a real server and database (no browser): who may use
 * it (admin tokens only, by bearer header or by the session a sign-in opens), CSRF on every
 * write, hostile input (oversized, malformed, markup in transcripts and payloads), keyset pages
 * of actors with their filters, and the log line of every action, with the token's name.
 */
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { loadConfig } from '../../src/config.ts';
import { createToken, revokeToken } from '../../src/ops/api-tokens.ts';
import { createSignInCode } from '../../src/ops/console-sessions.ts';
import { setBlockedBy } from '../../src/db/turns/actors.ts';
import { listPolicies } from '../../src/ops/input-policies.ts';
import { createBoss } from '../../src/queue/boss.ts';
import { queuesOf } from '../../src/queue/names.ts';
import { Capture } from '../helpers/capture.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { answer, failure, startApi, type Api } from './helpers.ts';

const tdb = useTestDatabase();
const logs = new Capture();
let api: Api;
let config: ReturnType<typeof loadConfig>;
let admin: string;
let reader: string;

beforeAll(async () => {
  config = loadConfig({ databaseUrl: tdb.url, logLevel: 'silent' }, {});
  api = await startApi(tdb.url, { logger: pino({ level: 'info' }, logs), console: { databaseUrl: tdb.url, config } });
  admin = (await createToken(api.database.db, 'ops', ['admin'])).token;
  reader = (await createToken(api.database.db, 'reader', ['read', 'send'])).token;
});

afterAll(async () => {
  await api?.stop();
  if (process.env.SHOW_LOGS) console.log(logs.text);
});

const jsonAccept = { accept: 'application/json' };
const form = (fields: Record<string, string | string[]>, headers: Record<string, string> = {}): RequestInit => {
  const body = new URLSearchParams();
  for (const [k, v] of Object.entries(fields)) for (const one of Array.isArray(v) ? v : [v]) body.append(k, one);
  return {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers },
    body: body.toString(),
    redirect: 'manual',
  };
};

/** Signs in with a one-time code; returns the session's Cookie header and a page's CSRF token. */
async function signIn(tokenName = 'ops'): Promise<{ cookie: string; csrf: string }> {
  const { code } = await createSignInCode(api.database.db, tokenName);
  const res = await api.call('/console/sign-in', { ...form({ code }), token: null });
  expect(res.status).toBe(303);
  const set = res.headers.getSetCookie()[0]!;
  expect(set).toMatch(/^corral_console=[A-Za-z0-9_-]{43}; HttpOnly; SameSite=Strict; Path=\/console; Max-Age=\d+$/);
  const cookie = set.split(';')[0]!;
  const page = await (await api.call('/console/actors', { token: null, headers: { cookie } })).text();
  const csrf = /name="_csrf" value="([^"]+)"/.exec(page)?.[1];
  expect(csrf).toMatch(/^[A-Za-z0-9_-]{43}$/);
  return { cookie, csrf: csrf! };
}

describe('the console: who may use it', () => {
  it('without credentials: a browser is sent to the sign-in page, an API caller gets 401', async () => {
    const page = await api.call('/console/actors', { token: null, redirect: 'manual' });
    expect(page.status).toBe(303);
    expect(page.headers.get('location')).toBe('/console/sign-in');
    expect(await answer(await api.call('/console/actors', { token: null, headers: jsonAccept }))).toEqual({
      status: 401,
      body: failure('unauthorized', /^sign in first/),
    });
    // the sign-in page and the assets need none, and carry the strict policy
    const signInPage = await api.call('/console/sign-in', { token: null });
    expect(signInPage.status).toBe(200);
    expect(signInPage.headers.get('content-security-policy')).toBe(
      "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    );
    expect((await api.call('/console/assets/console.js', { token: null })).headers.get('content-type')).toBe(
      'text/javascript; charset=utf-8',
    );
  });

  it('a token without the admin scope can neither look nor act, by header or by signing in', async () => {
    for (const path of [
      '/console',
      '/console/actors',
      '/console/dead-letters',
      '/console/outbox',
      '/console/workers',
      '/console/actors/a/b',
    ]) {
      expect(await answer(await api.call(path, { token: reader, headers: jsonAccept })), path).toEqual({
        status: 403,
        body: failure('forbidden', 'the token reader has no scope admin (its scopes: read, send)'),
      });
    }
    const send = await api.call('/console/actors/a/b/send', { ...form({ event: '{}' }), token: reader });
    expect(send.status).toBe(403);
    const signInWithReader = await api.call('/console/sign-in', { ...form({ token: reader }, jsonAccept), token: null });
    expect(await answer(signInWithReader)).toEqual({ status: 403, body: failure('forbidden', /has no scope admin/) });
    expect(signInWithReader.headers.getSetCookie()).toEqual([]);
    await expect(createSignInCode(api.database.db, 'reader')).rejects.toThrow(/no token reader with the admin scope/);
  });

  it('an unknown, malformed or revoked token is 401; a sign-in code works once', async () => {
    expect((await api.call('/console/actors', { token: `crl_${'x'.repeat(43)}`, headers: jsonAccept })).status).toBe(401);
    expect((await api.call('/console/actors', { token: null, headers: { ...jsonAccept, authorization: 'Basic eDp5' } })).status).toBe(401);
    expect((await api.call('/console/actors', { token: null, headers: { ...jsonAccept, cookie: 'corral_console=forged' } })).status).toBe(
      401,
    );
    const { code } = await createSignInCode(api.database.db, 'ops');
    expect((await api.call('/console/sign-in', { ...form({ code }), token: null })).status).toBe(303);
    const again = await api.call('/console/sign-in', { ...form({ code }, jsonAccept), token: null });
    expect(await answer(again)).toEqual({ status: 401, body: failure('unauthorized', /sign-in link is not valid/) });

    const temp = await createToken(api.database.db, 'ops-temp', ['admin']);
    const res = await api.call('/console/sign-in', { ...form({ token: temp.token }), token: null });
    const cookie = res.headers.getSetCookie()[0]!.split(';')[0]!;
    expect((await api.call('/console/actors', { token: null, headers: { cookie, ...jsonAccept } })).status).toBe(200);
    await revokeToken(api.database.db, 'ops-temp');
    // C3: the session ends with its token, at once
    expect((await api.call('/console/actors', { token: null, headers: { cookie, ...jsonAccept } })).status).toBe(401);
    expect((await api.call('/console/actors', { token: temp.token, headers: jsonAccept })).status).toBe(401);
  });

  it('CSRF: a cookie write without the token, with a forged one, or from another origin is refused and does nothing', async () => {
    const { cookie, csrf } = await signIn();
    const path = '/console/actors/csrf/s1/send';
    const cases: [Record<string, string>, Record<string, string>][] = [
      [{ event: '{"n":1}' }, {}],
      [{ event: '{"n":1}', _csrf: 'A'.repeat(43) }, {}],
      [{ event: '{"n":1}', _csrf: csrf.slice(1) }, {}],
      [{ event: '{"n":1}', _csrf: csrf }, { origin: 'http://evil.example' }],
      [{ event: '{"n":1}', _csrf: csrf }, { 'sec-fetch-site': 'cross-site' }],
    ];
    for (const [fields, extra] of cases) {
      const res = await api.call(path, { ...form(fields, { cookie, ...jsonAccept, ...extra }), token: null });
      expect(res.status, JSON.stringify([fields, extra])).toBe(403);
    }
    expect((await api.corral.actor(actorKey('csrf', 's1'))).pendingEvents).toEqual([]);
    // behind a proxy that rewrites Host, the browser's host is the forwarded one
    const proxied = await api.call(path, {
      ...form(
        { event: '{"n":0}', _csrf: csrf },
        { cookie, origin: 'https://corral.example.com', 'x-forwarded-host': 'corral.example.com' },
      ),
      token: null,
    });
    expect(proxied.status).toBe(303);
    expect((await api.corral.actor(actorKey('csrf', 's1'))).pendingEvents).toHaveLength(1);
    // the page's own token, from its own origin: done, and logged with the token's name
    const ok = await api.call(path, { ...form({ event: '{"n":1}', _csrf: csrf }, { cookie, origin: api.server.url }), token: null });
    expect(ok.status).toBe(303);
    expect((await api.corral.actor(actorKey('csrf', 's1'))).pendingEvents).toHaveLength(2);
    expect(ok.headers.get('location')).toMatch(
      /^\/console\/actors\/csrf\/s1\?notice=Sent%20event%20[0-9a-f-]{36}\.&sig=[A-Za-z0-9_-]{43}$/,
    );
    expect(logs.text).toMatch(/"token":"ops","action":"actor\.send","actor":"csrf\/s1"/);
    for (const secret of [csrf, cookie.split('=')[1]!, admin]) expect(logs.text).not.toContain(secret);
  });
});

describe('the console: hostile input', () => {
  it('markup in payloads and transcripts is shown as text', async () => {
    const evil = '<script>alert(1)</script><img src=x onerror=alert(2)>"\'&';
    await api.corral.send(actorKey('xss', 's1'), { text: evil });
    const page = await (await api.call('/console/actors/xss/s1', { token: admin })).text();
    expect(page).not.toContain('<script>alert');
    expect(page).not.toContain('<img src=x');
    expect(page).toContain('&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;');
    // and in a refused filter echoed back on the error page
    const { cookie } = await signIn();
    const echoed = await api.call(`/console/actors?agent=${encodeURIComponent('"><script>')}`, { token: null, headers: { cookie } });
    expect(echoed.status).toBe(400);
    expect(echoed.headers.get('content-type')).toBe('text/html; charset=utf-8');
    const text = await echoed.text();
    expect(text).not.toContain('<script>');
    expect(text).toContain('&quot;\\&quot;&gt;&lt;script&gt;');
  });

  it('malformed and oversized bodies, bad parameters: 4xx, nothing done', async () => {
    const cases: [string, RequestInit, number][] = [
      ['/console/actors/m/s1/send', form({ event: '{not json' }), 400],
      ['/console/actors/m/s1/send', form({}), 400],
      ['/console/actors/m/s1/send', form({ event: ['{}', '{}'] }), 400],
      ['/console/actors/m/s1/send', form({ event: 'x'.repeat(3 * 1024 * 1024) }), 413],
      ['/console/actors/m/s1/policy', form({ policy: 'nonsense' }), 400],
      ['/console/actors/bad%20agent/s1/send', form({ event: '{}' }), 400],
      ['/console/dead-letters/act', form({ action: 'replay', ids: 'not-a-uuid' }), 400],
      ['/console/dead-letters/batch', form({ action: 'replay', expected: '0' }), 400],
      ['/console/outbox/act', form({ action: 'explode', ids: '1' }), 400],
      ['/console/workers/..%2F..%2Fetc/revoke', form({}), 400],
      // a field named __proto__ is only a field: no prototype is set, and the form is still refused
      ['/console/actors/m/s1/send', form({ ['__proto__']: ['{}', '{}'], constructor: 'x' }), 400],
    ];
    for (const [path, init, status] of cases) {
      const res = await api.call(path, { ...init, token: admin, headers: { ...(init.headers as Record<string, string>), ...jsonAccept } });
      expect(res.status, path).toBe(status);
    }
    for (const path of [
      '/console/actors?limit=100000',
      '/console/actors?state=zombie',
      '/console/actors?after=nokey',
      '/console/dead-letters?after=1',
    ]) {
      expect((await api.call(path, { token: admin, headers: jsonAccept })).status, path).toBe(400);
    }
    expect((await api.corral.actor(actorKey('m', 's1'))).pendingEvents).toEqual([]);
  });
});

describe('the console: the list of actors', () => {
  it('keyset pages in key order, filters by agent prefix, session prefix and state', async () => {
    // an actor's row is made when its first turn begins (no worker runs here): made as that does
    for (const s of ['a1', 'a2', 'a3', 'b1']) {
      await setBlockedBy(api.database.db, actorKey('pager-x', s), null);
      await api.corral.send(actorKey('pager-x', s), { n: s });
    }
    await setBlockedBy(api.database.db, actorKey('pager-y', 'a1'), '0196a8f0-5b7e-7c1a-9d2e-3f4a5b6c7d8e');
    const page = async (q: string) =>
      (await (await api.call(`/console/actors${q}`, { token: admin, headers: jsonAccept })).json()) as {
        actors: { agentUid: string; sessionId: string; state: string; queued: number }[];
        next: string | null;
      };
    const first = await page('?agent=pager-&limit=2');
    expect(first.actors.map((a) => `${a.agentUid}/${a.sessionId}`)).toEqual(['pager-x/a1', 'pager-x/a2']);
    expect(first.actors[0]).toMatchObject({ state: 'idle', queued: 1 });
    const second = await page(first.next!.replace('/console/actors', ''));
    expect(second.actors.map((a) => `${a.agentUid}/${a.sessionId}`)).toEqual(['pager-x/a3', 'pager-x/b1']);
    const third = await page(second.next!.replace('/console/actors', ''));
    expect(third.actors.map((a) => `${a.agentUid}/${a.sessionId}`)).toEqual(['pager-y/a1']);
    expect(third.next).toBeNull();
    expect((await page('?agent=pager-x&session=a')).actors.map((a) => a.sessionId)).toEqual(['a1', 'a2', 'a3']);
    expect((await page('?agent=pager-&state=running')).actors).toEqual([]);
    expect((await page('?agent=pager-&state=idle')).actors).toHaveLength(4);
    expect((await page('?agent=pager-&state=blocked')).actors).toMatchObject([{ agentUid: 'pager-y', sessionId: 'a1', state: 'blocked' }]);
    expect((await page('?agent=pager-x&session=b')).actors.map((a) => a.sessionId)).toEqual(['b1']);
    expect((await page('?agent=pager')).actors).toHaveLength(5);
    expect((await page('?agent=pager-z')).actors).toEqual([]);
    expect((await page('?agent=pager-&state=dead_lettered')).actors).toEqual([]);
  });
});

describe('the console: the overview', () => {
  it('the last hour, a row a minute, and the queue depth sampled since the server started', async () => {
    const res = await api.call('/console', { token: admin, headers: jsonAccept });
    const body = (await res.json()) as { minutes: { at: string; turns: number }[]; queueHistory: { at: string; depth: number }[] };
    expect(res.status).toBe(200);
    expect(body.minutes.length).toBeGreaterThanOrEqual(60);
    expect(body.minutes.length).toBeLessThanOrEqual(61);
    expect(body.queueHistory.length).toBeGreaterThanOrEqual(1);
    expect(body.queueHistory[0]).toEqual({ at: expect.any(String), depth: expect.any(Number) });
  });
});

describe('the console: actions', () => {
  const bearer = (body: unknown): RequestInit => ({
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json' },
    body: JSON.stringify(body),
  });

  it('sets and clears an input policy, for the actor or its agent, through the operations of corral policy', async () => {
    const set = await api.call('/console/actors/pol/s1/policy', { ...bearer({ policy: 'coalesce', debounce: '300ms' }), token: admin });
    expect(await answer(set)).toMatchObject({ status: 200, body: { target: 'pol/s1', policy: 'coalesce', options: { debounceMs: 300 } } });
    const agent = await api.call('/console/actors/pol/s1/policy', { ...bearer({ policy: 'reject', scope: 'agent' }), token: admin });
    expect(await answer(agent)).toMatchObject({ status: 200, body: { target: 'pol', policy: 'reject' } });
    expect((await listPolicies(api.database.db)).policies.map((p) => `${p.target}=${p.policy}`)).toEqual(['pol=reject', 'pol/s1=coalesce']);
    const bad = await api.call('/console/actors/pol/s1/policy', { ...bearer({ policy: 'reject', debounce: '300ms' }), token: admin });
    expect(await answer(bad)).toEqual({ status: 400, body: failure('invalid_argument', /takes no options/) });
    expect((await answer(await api.call('/console/actors/pol/s1/policy/clear', { ...bearer({}), token: admin }))).status).toBe(200);
    expect(await answer(await api.call('/console/actors/pol/s1/policy/clear', { ...bearer({}), token: admin }))).toEqual({
      status: 404,
      body: failure('nothing_matched', /has no input policy of its own/),
    });
    expect(logs.text).toMatch(/"token":"ops","action":"policy\.set","target":"pol\/s1","policy":"coalesce"/);
  });

  it('steering or cancelling an actor with no turn in flight is 404, and changes nothing', async () => {
    for (const [path, body] of [
      ['/console/actors/quiet/s1/steer', { input: '{"text":"faster"}' }],
      ['/console/actors/quiet/s1/cancel', { reason: 'stop' }],
    ] as const) {
      expect(await answer(await api.call(path, { ...bearer(body), token: admin }))).toEqual({
        status: 404,
        body: failure('not_found', 'quiet/s1 has no turn in flight'),
      });
    }
  });

  it('a batch of dead letters acts only on the count confirmed', async () => {
    const q = queuesOf(config);
    const boss = createBoss(tdb.url, config, { max: 1 });
    await boss.start();
    try {
      for (const s of ['d1', 'd2']) {
        const data = { agentUid: 'batch', sessionId: s, payload: { n: s }, enqueuedAt: new Date().toISOString() };
        await boss.insert(q.deadLetter, [{ data, singletonKey: `batch/${s}` }]);
      }
    } finally {
      await boss.stop({ graceful: false, close: true });
    }
    const list = async () =>
      ((await (await api.call('/console/dead-letters?actor=', { token: admin, headers: jsonAccept })).json()) as { matching: number })
        .matching;
    expect(await list()).toBe(2);
    const stale = await api.call('/console/dead-letters/batch', { ...bearer({ action: 'discard', expected: 3 }), token: admin });
    expect(await answer(stale)).toEqual({
      status: 400,
      body: failure(
        'invalid_argument',
        'the filter matches 2 dead letters now, not the 3 confirmed: look at the list again and confirm anew',
      ),
    });
    expect(await list()).toBe(2);
    const done = await api.call('/console/dead-letters/batch', { ...bearer({ action: 'discard', expected: 2 }), token: admin });
    expect(await answer(done)).toMatchObject({ status: 200, body: { results: [{ status: 'discarded' }, { status: 'discarded' }] } });
    expect(await list()).toBe(0);
    expect(logs.text).toMatch(/"token":"ops","action":"dead_letters\.discard_batch"/);
  });

  it('the outbox: unknown messages are reported, an unknown sink is 404', async () => {
    const r = await api.call('/console/outbox/act', { ...bearer({ action: 'replay', ids: ['424242'] }), token: admin });
    expect(await answer(r)).toMatchObject({ status: 200, body: { done: [], notFound: [424242] } });
    for (const action of ['enable', 'disable']) {
      expect((await api.call(`/console/sinks/nope/${action}`, { ...bearer({}), token: admin })).status).toBe(404);
    }
  });

  it('a notice shows only when this session’s own action left it; signing out ends the session', async () => {
    const { cookie, csrf } = await signIn();
    const forged = await (
      await api.call('/console/actors?notice=Session%20expired%3A%20sign%20in%20at%20evil.example&sig=x', {
        token: null,
        headers: { cookie },
      })
    ).text();
    expect(forged).not.toContain('evil.example');
    const acted = await api.call('/console/actors/notes/s1/send', { ...form({ event: '{}', _csrf: csrf }, { cookie }), token: null });
    const back = await api.call(acted.headers.get('location')!, { token: null, headers: { cookie } });
    expect(await back.text()).toMatch(/<div class="notice" id="notice">Sent event [0-9a-f-]{36}\.<\/div>/);
    // another session's signature is not this one's
    const other = await signIn();
    expect(await (await api.call(acted.headers.get('location')!, { token: null, headers: { cookie: other.cookie } })).text()).not.toContain(
      'Sent event',
    );

    const out = await api.call('/console/sign-out', { ...form({ _csrf: csrf }, { cookie }), token: null });
    expect(out.status).toBe(303);
    expect(out.headers.getSetCookie()[0]).toMatch(/^corral_console=; HttpOnly; SameSite=Strict; Path=\/console; Max-Age=0$/);
    expect((await api.call('/console/actors', { token: null, headers: { cookie, ...jsonAccept } })).status).toBe(401);
  });
});
