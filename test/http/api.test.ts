/**
 * The HTTP API's routes on a real port, with real `fetch`, against a daemon and an example worker
 * on a test database: sending (idempotency keys, the input policy's refusal), the event's state
 * moving to committed, the transcript; and every refusal with its status and code: tokens (none,
 * malformed, unknown, revoked: no data in the body), scopes, parameters, bodies, methods, routes,
 * the database unreachable.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { httpErrorOf } from '../../src/http/errors.ts';
import { generateToken, revokeToken } from '../../src/ops/api-tokens.ts';
import { jobsOf, startClientSetup, type ClientSetup } from '../client/helpers.ts';
import { answer, failure, json, startApi, type Api } from './helpers.ts';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const MAX_EVENT_BYTES = 4096;

let s: ClientSetup;
let api: Api;
let rw: string;
let readOnly: string;
let sendOnly: string;
let revoked: string;

beforeAll(async () => {
  s = await startClientSetup({ maxEventBytes: MAX_EVENT_BYTES });
  api = await startApi(s.t.db.url, { corral: s.corral, config: { maxEventBytes: MAX_EVENT_BYTES } });
  [rw, readOnly, sendOnly, revoked] = await Promise.all([
    api.token('rw', ['read', 'send']),
    api.token('reader', ['read']),
    api.token('sender', ['send']),
    api.token('gone', ['read', 'send']),
  ]);
  await revokeToken(api.database.db, 'gone');
});

afterAll(async () => {
  await api?.stop();
  await s?.stop();
});

const send = (actor: string, body: unknown, headers: Record<string, string> = {}, token: string | null = rw) =>
  api.call(`/v1/actors/${actor}/events`, { ...json(body, headers), token });

describe('sending, reading, the event state', () => {
  it('POST events answers 202 with the event id; the event moves to committed; the transcript has its turn', async () => {
    const res = await send('web/s1', { text: 'hello' });
    expect(res.status).toBe(202);
    expect(res.headers.get('content-type')).toMatch(/^application\/json/);
    const sent = (await res.json()) as { event_id: string; duplicate: boolean };
    expect(sent).toEqual({ event_id: expect.stringMatching(UUID), duplicate: false });
    expect(res.headers.get('location')).toBe(`/v1/events/${sent.event_id}`);

    const state = async () =>
      (await (await api.call(`/v1/events/${sent.event_id}`, { token: readOnly })).json()) as Record<string, unknown>;
    const first = await state();
    expect(['pending', 'committed']).toContain(first.state);
    await expect.poll(async () => (await state()).state, { timeout: 20_000 }).toBe('committed');
    const committed = await state();
    expect(committed).toMatchObject({
      event_id: sent.event_id,
      state: 'committed',
      actor: 'web/s1',
      job_state: 'completed',
      turn: {
        turn_id: expect.stringMatching(UUID),
        actor_epoch: expect.any(Number),
        attempt: 1,
        worker_id: 'cw-0',
        output: null,
        emitted: [],
        messages: [
          { seq: 1, role: 'user', content: { text: 'hello' }, created_at: expect.any(String) },
          { seq: 2, role: 'assistant', content: { text: 'echo: hello' }, created_at: expect.any(String) },
        ],
      },
    });

    const transcript = await answer(await api.call('/v1/actors/web/s1/transcript', { token: readOnly }));
    expect(transcript.status).toBe(200);
    expect(transcript.body).toEqual({
      actor: 'web/s1',
      turns: [
        {
          turn_id: (committed.turn as { turn_id: string }).turn_id,
          event_id: sent.event_id,
          status: 'succeeded',
          actor_epoch: expect.any(Number),
          revision: expect.any(Number),
          started_at: expect.any(String),
          finished_at: expect.any(String),
          cancel_reason: null,
          messages: [
            { seq: 1, role: 'user', content: { text: 'hello' }, created_at: expect.any(String) },
            { seq: 2, role: 'assistant', content: { text: 'echo: hello' }, created_at: expect.any(String) },
          ],
          emitted: [],
        },
      ],
    });
    expect(await answer(await api.call('/v1/actors/web/nobody/transcript', { token: rw }))).toEqual({
      status: 200,
      body: { actor: 'web/nobody', turns: [] },
    });
    // the key parts' `:` and `@`, percent-encoded or not
    for (const path of ['/v1/actors/app%3Aone/user%40host/transcript', '/v1/actors/app:one/user@host/transcript']) {
      expect(await answer(await api.call(path, { token: rw }))).toEqual({ status: 200, body: { actor: 'app:one/user@host', turns: [] } });
    }
  });

  it('any JSON value is an event (null, a string, an array); the same Idempotency-Key gives the same event', async () => {
    for (const body of [null, 'just text', [1, 2, 3], 42]) {
      const r = await answer(await send('web/values', JSON.stringify(body)));
      expect(r.status, JSON.stringify(body)).toBe(202);
    }
    const a = await answer(await send('web/idem', { text: 'once' }, { 'idempotency-key': 'order-17' }));
    const b = await answer(await send('web/idem', { text: 'once' }, { 'idempotency-key': 'order-17' }));
    const other = await answer(await send('web/idem-2', { text: 'once' }, { 'idempotency-key': 'order-17' }));
    expect(a).toEqual({ status: 202, body: { event_id: expect.stringMatching(UUID), duplicate: false } });
    expect(b).toEqual({ status: 202, body: { event_id: (a.body as { event_id: string }).event_id, duplicate: true } });
    // keys are per actor
    expect((other.body as { event_id: string }).event_id).not.toBe((a.body as { event_id: string }).event_id);
    expect(await answer(await send('web/idem', { text: 'twice?' }, { 'idempotency-key': 'order-17' }))).toEqual({
      status: 409,
      body: failure('idempotency_conflict', /idempotency key "order-17" of web\/idem was used for event .* with other data/),
    });
    expect(await answer(await send('web/idem', {}, { 'idempotency-key': 'k'.repeat(201) }))).toEqual({
      status: 400,
      body: failure('invalid_argument', /^invalid header idempotency-key "k+…": expected 1-200 characters$/),
    });
  });

  it('a send the input policy `reject` refuses is 409 actor_busy, and enqueues nothing', async () => {
    await s.corral.setInputPolicy('strict', 'reject');
    const first = await answer(await send('strict/s', { delayMs: 3_000 }));
    expect(first.status).toBe(202);
    const refused = await answer(await send('strict/s', { text: 'too soon' }));
    expect(refused).toEqual({ status: 409, body: failure('actor_busy') });
    expect((await jobsOf(s.pg, 'strict/s')).map((j) => j.data.payload)).toEqual([{ delayMs: 3_000 }]);
  });

  it('GET events/{id}: 404 for an unknown id, 400 for one that is no UUID', async () => {
    const unknown = '0190f7e2-0000-7000-8000-000000000000';
    expect(await answer(await api.call(`/v1/events/${unknown}`, { token: readOnly }))).toEqual({
      status: 404,
      body: failure('not_found', `no event ${unknown}: never sent, or gone with the retention`),
    });
    expect(await answer(await api.call('/v1/events/not-a-uuid', { token: readOnly }))).toEqual({
      status: 400,
      body: failure('invalid_argument', 'invalid event id "not-a-uuid": expected a UUID (an event id, as a send returned it)'),
    });
  });
});

describe('authorization', () => {
  const routes: [string, RequestInit][] = [
    ['/v1/actors/web/s1/events', json({ text: 'x' })],
    ['/v1/actors/web/s1/transcript', {}],
    ['/v1/events/0190f7e2-0000-7000-8000-000000000000', {}],
    ['/v1/actors/web/s1/stream', {}],
  ];

  it('no token, a malformed header, an unknown or a revoked token: 401 with WWW-Authenticate, and nothing else', async () => {
    const cases: [string, Record<string, string>, RegExp][] = [
      ['no header', {}, /^an API token is needed/],
      ['basic', { authorization: 'Basic dXNlcjpwYXNz' }, /must be "Bearer <token>"/],
      ['empty bearer', { authorization: 'Bearer' }, /must be "Bearer <token>"/],
      ['two words', { authorization: `Bearer ${rw} extra` }, /must be "Bearer <token>"/],
      ['unknown', { authorization: `Bearer ${generateToken()}` }, /^the token is not valid \(unknown, revoked or expired\)$/],
      ['not a token', { authorization: 'Bearer hunter2' }, /^the token is not valid \(unknown, revoked or expired\)$/],
      ['revoked', { authorization: `Bearer ${revoked}` }, /^the token is not valid \(unknown, revoked or expired\)$/],
    ];
    for (const [path, init] of routes) {
      for (const [what, headers, message] of cases) {
        const res = await api.call(path, { ...init, headers: { ...(init.headers as Record<string, string>), ...headers }, token: null });
        const r = await answer(res);
        expect(r, `${what} ${path}`).toEqual({ status: 401, body: failure('unauthorized', message) });
        expect(res.headers.get('www-authenticate'), what).toMatch(
          what === 'no header' ? /^Bearer realm="corral"$/ : /^Bearer realm="corral", error="invalid_token"$/,
        );
      }
    }
  });

  it('a token without the route’s scope: 403 forbidden naming the scope', async () => {
    const res = await send('web/s1', { text: 'x' }, {}, readOnly);
    expect(await answer(res)).toEqual({ status: 403, body: failure('forbidden', 'the token reader has no scope send (its scopes: read)') });
    expect(res.headers.get('www-authenticate')).toBe('Bearer realm="corral", error="insufficient_scope", scope="send"');
    for (const [path, init] of routes.slice(1)) {
      expect(await answer(await api.call(path, { ...init, token: sendOnly })), path).toEqual({
        status: 403,
        body: failure('forbidden', 'the token sender has no scope read (its scopes: send)'),
      });
    }
  });

  it('authorization comes before the body and the parameters: a bad request without a token is 401', async () => {
    const big = 'x'.repeat(MAX_EVENT_BYTES * 4);
    for (const init of [
      { ...json(`"${big}"`), token: null },
      { method: 'POST', headers: { 'content-type': 'text/plain' }, body: 'hi', token: null },
      { ...json('{not json'), token: null },
    ]) {
      expect((await api.call('/v1/actors/web/s1/events', init)).status).toBe(401);
    }
    expect((await api.call('/v1/actors/bad!agent/s/transcript', { token: null })).status).toBe(401);
    expect((await api.call('/v1/events/nope', { token: null })).status).toBe(401);
  });

  it('a database that cannot be reached is 503 database_unavailable, with Retry-After and no detail', async () => {
    const { openDatabase } = await import('../../src/db/client.ts');
    const nowhere = openDatabase('postgres://nobody:secret@127.0.0.1:1/none', { max: 1 });
    const down = await startApi(s.t.db.url, { corral: s.corral, db: nowhere.db });
    try {
      const res = await down.call('/v1/actors/web/s1/transcript', { token: rw });
      expect(await answer(res)).toEqual({
        status: 503,
        body: { error: { code: 'database_unavailable', message: 'the database is unavailable: try again shortly' } },
      });
      expect(res.headers.get('retry-after')).toBe('2');
    } finally {
      await down.stop();
      await nowhere.close();
    }
  });
});

describe('requests the API cannot take', () => {
  it('400: a body that is not JSON, an empty body, a bad actor key part, an event nested too deep', async () => {
    expect(await answer(await send('web/s1', '{"text": '))).toEqual({
      status: 400,
      body: failure('invalid_json', /^the request body is not JSON: /),
    });
    expect(await answer(await send('web/s1', ''))).toEqual({ status: 400, body: failure('invalid_json', /the request body is empty/) });
    expect(await answer(await api.call('/v1/actors/bad!agent/s/transcript', { token: rw }))).toEqual({
      status: 400,
      body: failure(
        'invalid_actor_key',
        'invalid actor key part agent_uid "bad!agent": expected 1-128 characters of A-Z a-z 0-9 . _ : @ -',
      ),
    });
    expect(await answer(await api.call(`/v1/actors/a/${'s'.repeat(129)}/transcript`, { token: rw }))).toMatchObject({
      status: 400,
      body: failure('invalid_actor_key', /^invalid actor key part session_id "s+…"/),
    });
    expect(await answer(await send('web/s1', '['.repeat(200) + ']'.repeat(200)))).toEqual({
      status: 400,
      body: failure('invalid_argument', /nested deeper than 100/),
    });
  });

  it('413 for a body over CORRAL_MAX_EVENT_BYTES; 415 for a body that is not application/json', async () => {
    expect(await answer(await send('web/s1', `"${'x'.repeat(MAX_EVENT_BYTES)}"`))).toEqual({
      status: 413,
      body: failure('payload_too_large', `the request body is over ${MAX_EVENT_BYTES} bytes (CORRAL_MAX_EVENT_BYTES)`),
    });
    const plain = { method: 'POST', headers: { 'content-type': 'text/plain' }, body: '{"text":"hi"}', token: rw };
    expect(await answer(await api.call('/v1/actors/web/s1/events', plain))).toEqual({
      status: 415,
      body: failure('unsupported_media_type', 'the body must be JSON, sent with Content-Type: application/json'),
    });
    expect(await answer(await api.call('/v1/actors/web/s1/events', { method: 'POST', token: rw }))).toEqual({
      status: 415,
      body: failure('unsupported_media_type'),
    });
  });

  it('404 for an unknown route, 405 with Allow for a method a route does not take', async () => {
    for (const path of ['/', '/v1', '/v1/actors/web/s1', '/v1/nothing']) {
      expect(await answer(await api.call(path, { token: rw })), path).toEqual({
        status: 404,
        body: failure('not_found', `no route GET ${path} (docs/http.md lists them)`),
      });
    }
    const del = await api.call('/v1/events/0190f7e2-0000-7000-8000-000000000000', { method: 'DELETE', token: rw });
    expect(await answer(del)).toEqual({
      status: 405,
      body: failure('method_not_allowed', 'DELETE is not allowed here: GET /v1/events/:id is'),
    });
    expect(del.headers.get('allow')).toBe('GET');
    const get = await api.call('/v1/actors/web/s1/events', { token: rw });
    expect((await answer(get)).status).toBe(405);
    expect(get.headers.get('allow')).toBe('POST');
  });

  it('a server error says only that it is one: the cause stays in the log', () => {
    const e = httpErrorOf(new Error('connect to db-primary.internal as admin failed'));
    expect(e.status).toBe(500);
    expect(e.body).toEqual({ error: { code: 'internal', message: 'internal error' } });
    expect(JSON.stringify(e.body)).not.toContain('db-primary');
    expect(e.log?.cause).toBeInstanceOf(Error);
  });
});
