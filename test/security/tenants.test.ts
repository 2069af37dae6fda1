/**
 * Two tenants on one corral, on a real daemon process (its HTTP API, its example worker), real
 * HTTP and real PostgreSQL: every credential reaches its own actors only, and the allowed paths
 * still work (docs/http.md, "Tenants" in docs/operations.md).
 *  - a token for `tenant-a/*` sends to, reads and streams tenant-a's actors, and gets 404 for
 *    tenant-b's (events, transcript, stream, an event's state by its actor), with tenant-b's data
 *    nowhere in the answers;
 *  - a `Last-Event-ID` of tenant-b's stream on tenant-a's is 400;
 *  - a short-lived token stops working after its ttl, and its open stream ends then;
 *  - a revoked token's stream ends within 15 s;
 *  - idempotency keys are per token: the same key from two tokens makes two events;
 *  - per-token stream limits, stream opens per second, the connection cap and failed
 *    authentications per address are answered 429 with Retry-After;
 *  - a producer role (`corral_producer`) sends through `corral.send_event` and can touch no table;
 *  - the outbox (a daemon of its own, a raw worker, a real receiver): a sink limited to tenant-a
 *    refuses tenant-b's turn (`deliver_forbidden`, nothing written or sent); the same key from two
 *    agents is two deliveries, each with its actor in its webhook-id and signed headers; a URL
 *    pointing inside is refused in every spelling when added and at every connect; a rotated
 *    secret signs beside the new one during its overlap only.
 */
import { connect as connectTcp, type Socket } from 'node:net';
import type { LookupAddress } from 'node:dns';
import { actorKey } from '../../src/base/actor-key.ts';
import { sql } from '../../src/db/orm.ts';
import { blockedAddressReason, guardedLookup, type Resolver } from '../../src/outbox/address-guard.ts';
import { verifyWebhook } from '../../src/outbox/signature.ts';
import { addSink, rotateSecret } from '../../src/outbox/sinks.ts';
import { corral as corralCli } from '../cli/helpers.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { RawPeer, type Msg } from '../helpers/raw-peer.ts';
import { sendEvent } from '../helpers/send.ts';
import { WebhookReceiver, type ReceivedWebhook } from '../helpers/webhook-receiver.ts';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connect, type Corral } from '../../src/client/index.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { fastRecoveryEnv, freePort, killAll, spawnCorral, stopGracefully, type Proc } from '../helpers/processes.ts';
import { sleep, waitFor } from '../helpers/wait.ts';
import { SseReader } from '../http/sse.ts';

const tdb = useTestDatabase();
let daemon: Proc;
let corral: Corral;
let base: string;
const sockets: Socket[] = [];
const readers: SseReader[] = [];

const MAX_CONNECTIONS = 24;

beforeAll(async () => {
  const httpPort = await freePort();
  daemon = spawnCorral(
    ['daemon', '--workers', '1', '--http-port', String(httpPort)],
    {
      ...fastRecoveryEnv(tdb.url, `tcp://127.0.0.1:${await freePort()}`),
      CORRAL_HTTP_MAX_STREAMS_PER_TOKEN: '2',
      CORRAL_HTTP_STREAM_OPENS_PER_S: '2',
      CORRAL_HTTP_MAX_CONNECTIONS: String(MAX_CONNECTIONS),
      CORRAL_HTTP_AUTH_FAILURES_PER_MIN: '6',
    },
    'daemon',
  );
  await waitFor(() => daemon.log().includes('"worker ready"'), { timeoutMs: 60_000, what: () => `the daemon:\n${daemon.log()}` });
  base = `http://127.0.0.1:${httpPort}`;
  corral = await connect({ databaseUrl: tdb.url, env: {} });
  // tenant-b's private conversation, which no tenant-a credential may see
  const secret = await corral.send('tenant-b/private', { text: 'the secret of tenant b' });
  await corral.waitForTurn(secret.eventId, { timeoutMs: 30_000 });
}, 120_000);

afterAll(async () => {
  for (const r of readers) await r.cancel();
  for (const s of sockets) s.destroy();
  await corral?.close();
  await stopGracefully(daemon);
  killAll();
});

const call = (path: string, token: string | undefined, init: RequestInit = {}) =>
  fetch(`${base}${path}`, { ...init, headers: { ...(token ? { authorization: `Bearer ${token}` } : {}), ...init.headers } });
const post = (actor: string, token: string, data: unknown, headers: Record<string, string> = {}) =>
  call(`/v1/actors/${actor}/events`, token, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(data),
  });
const json = async (res: Response) => ({ status: res.status, body: (await res.json()) as Record<string, unknown> });
const codeOf = (b: Record<string, unknown>) => (b.error as { code?: string } | undefined)?.code;
async function stream(actor: string, token: string, headers: Record<string, string> = {}): Promise<{ res: Response; sse: SseReader }> {
  const res = await call(`/v1/actors/${actor}/stream`, token, { headers });
  const sse = new SseReader(res);
  readers.push(sse);
  return { res, sse };
}
/** The first delivery id of `actor`'s turns (what its stream's ids begin with). */
async function deliveryOf(actor: string): Promise<string> {
  const [agent, session] = actor.split('/');
  const { rows } = await tdb.client.query<{ d: string }>(
    `select t.delivery_id as d from corral.turns t join corral.conversations c on c.id = t.conversation_id
      where c.agent_uid = $1 and c.session_id = $2 order by t.started_at limit 1`,
    [agent, session],
  );
  return rows[0]!.d;
}

describe('a token scoped to tenant-a/*', () => {
  let a: string;
  beforeAll(async () => {
    a = (await corral.tokens.create({ name: 'tenant-a-app', scopes: ['read', 'send'], actors: ['tenant-a/*'] })).token;
  });

  it('sends to, reads and streams tenant-a’s actors', async () => {
    const sent = await json(await post('tenant-a/s1', a, { text: 'hello from a' }));
    expect(sent.status).toBe(202);
    const eventId = String(sent.body.event_id);
    await corral.waitForTurn(eventId, { timeoutMs: 30_000 });
    const transcript = await json(await call('/v1/actors/tenant-a/s1/transcript', a));
    expect(transcript.status).toBe(200);
    expect(JSON.stringify(transcript.body)).toContain('echo: hello from a');
    expect((await json(await call(`/v1/events/${eventId}`, a))).body).toMatchObject({ event_id: eventId, state: 'committed' });
    const { res } = await stream('tenant-a/s1', a);
    expect(res.status).toBe(200);
  });

  it('gets 404 for tenant-b’s actors on every route, and none of their data', async () => {
    const answers = [
      await json(await call('/v1/actors/tenant-b/private/transcript', a)),
      await json(await post('tenant-b/private', a, { text: 'intrusion' })),
      await json(await call('/v1/actors/tenant-b/private/stream', a)),
      await json(await call('/v1/actors/tenant-b/nobody/transcript', a)),
    ];
    for (const r of answers) {
      expect(r.status).toBe(404);
      expect(codeOf(r.body)).toBe('not_found');
      expect(JSON.stringify(r.body)).not.toContain('secret');
    }
    const { rows } = await tdb.client.query<{ id: string }>(
      `select t.event_id as id from corral.turns t join corral.conversations c on c.id = t.conversation_id where c.agent_uid = 'tenant-b'`,
    );
    const event = await json(await call(`/v1/events/${rows[0]!.id}`, a));
    expect([event.status, codeOf(event.body)]).toEqual([404, 'not_found']);
    expect(JSON.stringify(event.body)).not.toContain('secret');
    // the send was refused before anything was written
    const jobs = await tdb.client.query(
      `select 1 from pgboss.job where singleton_key = 'tenant-b/private' and data->'payload'->>'text' = 'intrusion'`,
    );
    expect(jobs.rowCount).toBe(0);
  });

  it('refuses a Last-Event-ID of tenant-b’s stream on tenant-a’s with 400, showing nothing of it', async () => {
    const other = await deliveryOf('tenant-b/private');
    const r = await json(await call('/v1/actors/tenant-a/s1/stream', a, { headers: { 'last-event-id': `${other}:r` } }));
    expect([r.status, codeOf(r.body)]).toEqual([400, 'invalid_argument']);
    expect(JSON.stringify(r.body)).not.toContain('secret');
    // its own id resumes as before
    const own = await deliveryOf('tenant-a/s1');
    const { res } = await stream('tenant-a/s1', a, { 'last-event-id': `${own}:s` });
    expect(res.status).toBe(200);
  });
});

describe('idempotency keys belong to their caller', () => {
  it('the same key from two tokens makes two events; from one token, one', async () => {
    const one = (await corral.tokens.create({ name: 'idem-1', scopes: ['send'], actors: ['tenant-a/*'] })).token;
    const two = (await corral.tokens.create({ name: 'idem-2', scopes: ['send'], actors: ['tenant-a/*'] })).token;
    const key = { 'idempotency-key': 'order-7' };
    const first = await json(await post('tenant-a/idem', one, { text: 'x' }, key));
    const again = await json(await post('tenant-a/idem', one, { text: 'x' }, key));
    const other = await json(await post('tenant-a/idem', two, { text: 'x' }, key));
    expect(again.body).toEqual({ ...first.body, duplicate: true });
    expect(other.body.duplicate).toBe(false);
    expect(other.body.event_id).not.toBe(first.body.event_id);
    // the other token's different data is no conflict (nothing of the first token's is confirmed)
    const probe = await json(await post('tenant-a/idem', two, { text: 'a guess' }, { 'idempotency-key': 'order-8' }));
    expect(probe.status).toBe(202);
  });
});

describe('tokens that end', () => {
  it('a short-lived token works until its ttl, then is refused 401, and its open stream ends then', async () => {
    const made = await corral.tokens.create({ scopes: ['read'], actors: ['tenant-a/s1'], ttl: 2_000 });
    expect(made.name).toMatch(/^tok_/);
    expect(made.expiresAt).not.toBeNull();
    const { res, sse } = await stream('tenant-a/s1', made.token);
    expect(res.status).toBe(200);
    const startedAt = Date.now();
    // the stream ends by itself once the token expired
    while ((await sse.next(10_000)) !== undefined) {
      // keepalives only
    }
    expect(Date.now() - startedAt).toBeLessThan(6_000);
    expect((await call('/v1/actors/tenant-a/s1/transcript', made.token)).status).toBe(401);
  });

  it('a revoked token’s open stream ends within 15 s', async () => {
    const made = await corral.tokens.create({ name: 'to-revoke', scopes: ['read'], actors: ['tenant-a/*'] });
    const { res, sse } = await stream('tenant-a/s1', made.token);
    expect(res.status).toBe(200);
    const revokedAt = Date.now();
    await corral.tokens.revoke('to-revoke');
    while ((await sse.next(20_000)) !== undefined) {
      // keepalives only
    }
    expect(Date.now() - revokedAt).toBeLessThan(16_000);
  }, 30_000);
});

describe('limits answered 429 with Retry-After', () => {
  it('a token holds at most 2 streams (CORRAL_HTTP_MAX_STREAMS_PER_TOKEN); another token still gets one', async () => {
    const t = (await corral.tokens.create({ name: 'streamer', scopes: ['read'] })).token;
    const u = (await corral.tokens.create({ name: 'streamer-2', scopes: ['read'] })).token;
    expect((await stream('tenant-a/l1', t)).res.status).toBe(200);
    expect((await stream('tenant-a/l2', t)).res.status).toBe(200);
    const third = await call('/v1/actors/tenant-a/l3/stream', t);
    expect(third.status).toBe(429);
    expect(third.headers.get('retry-after')).toMatch(/^\d+$/);
    expect(codeOf((await third.json()) as Record<string, unknown>)).toBe('too_many_streams');
    expect((await stream('tenant-a/l3', u)).res.status).toBe(200);
  });

  it('a token opens at most a burst of 2 × CORRAL_HTTP_STREAM_OPENS_PER_S streams at once', async () => {
    const t = (await corral.tokens.create({ name: 'opener', scopes: ['read'] })).token;
    const codes: number[] = [];
    for (let i = 0; i < 6; i++) {
      const res = await call(`/v1/actors/tenant-a/o${i}/stream`, t);
      codes.push(res.status);
      if (res.status === 429) {
        expect(res.headers.get('retry-after')).toBe('1');
        expect(codeOf((await res.json()) as Record<string, unknown>)).toBe('rate_limited');
      } else await res.body?.cancel();
    }
    expect(codes.slice(0, 2)).toEqual([200, 200]);
    expect(codes).toContain(429);
  });

  it('past CORRAL_HTTP_MAX_CONNECTIONS a request is refused and its connection closed; below it, served again', async () => {
    const t = (await corral.tokens.create({ name: 'crowd', scopes: ['read'] })).token;
    const url = new URL(base);
    for (let i = 0; i < MAX_CONNECTIONS + 2; i++) {
      const s = connectTcp(Number(url.port), url.hostname);
      sockets.push(s);
      await new Promise((r) => s.once('connect', r));
    }
    // the client sees its connections open before the server has accepted them all: ask until it has
    let refused = await call('/v1/actors/tenant-a/s1/transcript', t);
    await waitFor(
      async () => {
        if (refused.status === 429) return true;
        await refused.body?.cancel();
        refused = await call('/v1/actors/tenant-a/s1/transcript', t);
        return refused.status === 429;
      },
      { timeoutMs: 10_000, what: `a request refused past ${MAX_CONNECTIONS} connections` },
    );
    expect(refused.status).toBe(429);
    expect(refused.headers.get('retry-after')).toBe('1');
    expect(codeOf((await refused.json()) as Record<string, unknown>)).toBe('rate_limited');
    for (const s of sockets.splice(0)) s.destroy();
    await waitFor(async () => (await call('/v1/actors/tenant-a/s1/transcript', t)).status === 200, {
      timeoutMs: 10_000,
      what: 'requests served again',
    });
  });

  // last: it blocks this address for a minute
  it('an address that failed to authenticate 6 times in a minute is refused 429 before its token is looked at', async () => {
    const good = (await corral.tokens.create({ name: 'bystander', scopes: ['read'] })).token;
    // earlier tests' refusals (an expired token) count too: at most 6 are answered 401 in the minute
    const refused: number[] = [];
    for (let i = 0; i < 8 && refused.at(-1) !== 429; i++) {
      refused.push((await call('/v1/actors/tenant-a/s1/transcript', `crl_${'x'.repeat(43)}`)).status);
    }
    expect(refused.at(-1)).toBe(429);
    expect(refused.slice(0, -1).every((s) => s === 401)).toBe(true);
    expect(refused.length - 1).toBeLessThanOrEqual(6);
    const blocked = await call('/v1/actors/tenant-a/s1/transcript', `crl_${'y'.repeat(43)}`);
    expect(blocked.status).toBe(429);
    expect(Number(blocked.headers.get('retry-after'))).toBeGreaterThan(0);
    expect(codeOf((await blocked.json()) as Record<string, unknown>)).toBe('rate_limited');
    // even a right token, from there, waits out the minute
    expect((await call('/v1/actors/tenant-a/s1/transcript', good)).status).toBe(429);
  });
});

describe('a producer role', () => {
  it('sends through corral.send_event with corral_producer alone, and can read or write no table', async () => {
    // roles are the whole server's: one of this file's own
    const role = `corral_app_${tdb.name}`;
    await tdb.client.query(`create role ${role} login password 'app-secret' in role corral_producer`);
    const url = new URL(tdb.url);
    url.username = role;
    url.password = 'app-secret';
    const app = new pg.Client({ connectionString: url.toString() });
    await app.connect();
    try {
      const { rows } = await app.query<{ id: string }>(
        `select corral.send_event('tenant-a', 'from-sql', '{"text":"via sql"}'::jsonb) as id`,
      );
      await corral.waitForTurn(rows[0]!.id, { timeoutMs: 30_000 });
      // its idempotency keys are its role's own
      const k1 = await app.query<{ id: string }>(`select corral.send_event('tenant-a', 'from-sql', '1'::jsonb, 'k') as id`);
      const k2 = await app.query<{ id: string }>(`select corral.send_event('tenant-a', 'from-sql', '1'::jsonb, 'k') as id`);
      expect(k2.rows[0]!.id).toBe(k1.rows[0]!.id);
      const refusals = [
        `insert into pgboss.job (name, data) values ('actor-events', '{}')`,
        `select * from corral.turns limit 1`,
        `select * from corral.api_tokens limit 1`,
        `select * from corral.send_events('[{"agent_uid":"tenant-a","session_id":"x","data":1,"idempotency_scope":"token:tenant-a-app"}]'::jsonb)`,
      ];
      for (const q of refusals) await expect(app.query(q), q).rejects.toThrow(/permission denied|idempotency scope/);
    } finally {
      await app.end();
      await tdb.client.query(`drop role ${role}`);
    }
  });
});

type Ref = Record<string, unknown> & { event_id: string; agent_uid: string; session_id: string };

/** URLs that point inside, each spelled as a caller might to slip past a naive check. */
const INSIDE = [
  'http://169.254.169.254/latest/meta-data/',
  'http://127.0.0.1:5432/',
  'http://[::1]:9090/',
  'http://0x7f000001/',
  'http://2130706433/',
  'http://127.1/',
  'http://0177.0.0.1/',
  'http://[::ffff:127.0.0.1]/',
  'http://[::ffff:7f00:1]/',
  'http://[64:ff9b::a9fe:a9fe]/',
  'http://[fd00:ec2::254]/',
  'http://10.0.0.8/',
  'http://192.168.1.1/',
  'http://172.16.0.1/',
  'http://100.64.0.1/',
  'http://0.0.0.0:8080/',
  'http://localhost:8080/',
  'http://LOCALHOST./',
  'http://api.localhost/',
  'http://[fe80::1]/',
];

/** A resolver answering `addresses` for every name, as `dns.lookup` with `all: true` does. */
const answering =
  (...addresses: string[]): Resolver =>
  (_host, _opts, callback) =>
    callback(
      null,
      addresses.map((address): LookupAddress => ({ address, family: address.includes(':') ? 6 : 4 })),
    );

describe('outbox addresses (SSRF guard)', () => {
  it('judges every spelling of an inside address as the address it means', () => {
    for (const a of ['127.0.0.1', '::1', '169.254.169.254', '10.1.2.3', '::ffff:127.0.0.1', '64:ff9b::7f00:1', 'fc00::1', '224.0.0.1'])
      expect(blockedAddressReason(a), a).toBeTypeOf('string');
    for (const a of ['93.184.216.34', '2606:2800:220:1:248:1893:25c8:1946', '8.8.8.8']) expect(blockedAddressReason(a), a).toBeUndefined();
  });

  it('a connect resolves through the guard: only allowed addresses reach the socket, none left fails it', async () => {
    const lookup = (r: Resolver) =>
      new Promise<{ err: NodeJS.ErrnoException | null; addresses: unknown }>((done) =>
        guardedLookup(r)('sink.example', { all: true }, (err, addresses) => done({ err, addresses })),
      );
    const refused = await lookup(answering('127.0.0.1', '10.0.0.1'));
    expect(refused.err?.message).toMatch(/refused to connect: sink\.example resolves to 127\.0\.0\.1, loopback .*and 1 more refused/);
    const mixed = await lookup(answering('10.0.0.1', '93.184.216.34'));
    expect(mixed.err).toBeNull();
    expect(mixed.addresses).toEqual([{ address: '93.184.216.34', family: 4 }]);
  });
});

describe('outbox for many tenants', () => {
  let t: TestDaemon;
  let w: RawPeer;
  const rx = new WebhookReceiver();
  const secrets: Record<string, string> = {};
  const db = () => t.daemon.database.db;
  const at = (path: string) => rx.received.filter((r) => r.path === path);

  beforeAll(async () => {
    await rx.start();
    t = await startTestDaemon({ drainMs: 0, retryDelaySeconds: 1, retryDelayMaxSeconds: 2, outboxRetryLimit: 2 });
    secrets.a = (await addSink(db(), { name: 'a-only', url: rx.url('/a-only'), agents: ['tenant-a'], allowPrivate: true })).secret;
    secrets.shared = (await addSink(db(), { name: 'shared', url: rx.url('/shared'), allowPrivate: true })).secret;
    secrets.rot = (await addSink(db(), { name: 'rot', url: rx.url('/rot'), allowPrivate: true })).secret;
    w = new RawPeer(t.daemon.broker.endpoint, 'tenants-1');
    await w.register(8);
  });

  afterAll(async () => {
    await w?.close();
    await t?.stop();
    await rx.stop();
  });

  async function start(agent: string, session: string): Promise<Msg> {
    const { eventId } = await sendEvent(db(), actorKey(agent, session), { n: 1 });
    const s = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === eventId);
    await w.send({ type: 'turn_accepted', turn_ref: s.turn_ref });
    return s;
  }

  /** Runs one turn of `agent/session` delivering `deliver`; the daemon's answer to its result. */
  async function turn(agent: string, session: string, deliver: unknown[]): Promise<Msg> {
    const s = await start(agent, session);
    await w.send({ type: 'turn_result', turn_ref: s.turn_ref, messages: [{ role: 'assistant', content: 'ok' }], deliver });
    const ref = s.turn_ref as Ref;
    // not the answer to the accept: written lazily, it can come after a refusal failed the attempt (already_failed)
    return w.next(
      '',
      (m) =>
        (m.type === 'turn_committed' || (m.type === 'turn_rejected' && m.reason !== 'already_failed')) &&
        (m.turn_ref as Ref).event_id === ref.event_id,
    );
  }

  const rowsOf = async (agent: string) =>
    (
      await db().execute<{ webhook_id: string; sink: string; state: string; last_error: string | null }>(
        sql`select webhook_id, sink, state, last_error from corral.outbox where agent_uid = ${agent} order by id`,
      )
    ).rows;

  const verified = (r: ReceivedWebhook, secret: string) =>
    verifyWebhook(secret, { id: r.id, timestamp: r.timestamp, signature: r.signature }, r.body).ok;

  it("refuses tenant-b's turn delivering to tenant-a's sink: deliver_forbidden, nothing written or sent", async () => {
    const refused = await turn('tenant-b', 'x1', [{ sink: 'a-only', body: { refund: 9999 } }]);
    expect(refused.type).toBe('turn_rejected');
    expect(refused.reason).toBe('deliver_forbidden');
    expect(String(refused.detail)).toContain('a-only');
    // a forbidden entry among allowed ones: the whole result is refused
    const mixed = await turn('tenant-b', 'x2', [
      { sink: 'shared', body: 1 },
      { sink: 'a-only', body: 2 },
    ]);
    expect(mixed.reason).toBe('deliver_forbidden');
    const allowed = await turn('tenant-a', 'x1', [{ sink: 'a-only', body: { refund: 1 } }]);
    expect(allowed.type).toBe('turn_committed');
    await waitFor(() => at('/a-only').length >= 1, { timeoutMs: 10_000, what: "tenant-a's message arrived" });
    await sleep(300);
    expect(at('/a-only').map((r) => [r.actor, JSON.parse(r.body)])).toEqual([['tenant-a/x1', { refund: 1 }]]);
    expect(await rowsOf('tenant-b')).toEqual([]);
    expect(at('/shared')).toEqual([]);
  });

  it('the same key from two agents is two messages, each delivered, each with its actor in its id and headers', async () => {
    expect((await turn('tenant-a', 'k', [{ sink: 'shared', body: { from: 'a' }, key: 'refund-acct-7' }])).type).toBe('turn_committed');
    expect((await turn('tenant-c', 'k', [{ sink: 'shared', body: { from: 'c' }, key: 'refund-acct-7' }])).type).toBe('turn_committed');
    // the same actor reusing its key: the same message, not sent again
    expect((await turn('tenant-a', 'k', [{ sink: 'shared', body: { from: 'a again' }, key: 'refund-acct-7' }])).type).toBe(
      'turn_committed',
    );
    await waitFor(() => at('/shared').length >= 2, { timeoutMs: 10_000, what: 'both messages arrived' });
    await sleep(500);
    expect(at('/shared').map((r) => [r.id, r.actor, r.key, JSON.parse(r.body)])).toEqual([
      ['tenant-a/k/refund-acct-7', 'tenant-a/k', 'refund-acct-7', { from: 'a' }],
      ['tenant-c/k/refund-acct-7', 'tenant-c/k', 'refund-acct-7', { from: 'c' }],
    ]);
    expect(at('/shared').every((r) => verified(r, secrets.shared!))).toBe(true);
  });

  it('a rotated secret signs beside the new one during its overlap, new first; after a rotation without overlap, only the new one', async () => {
    const first = secrets.rot!;
    const second = await rotateSecret(db(), 'rot', { overlap: '1h' });
    expect(second.previousSecretUntil).not.toBeNull();
    expect((await turn('tenant-a', 'rot1', [{ sink: 'rot', body: 1 }])).type).toBe('turn_committed');
    await waitFor(() => at('/rot').length >= 1, { timeoutMs: 10_000, what: 'the first message arrived' });
    const during = at('/rot')[0]!;
    expect(during.signature.split(' ')).toHaveLength(2);
    expect([verified(during, second.secret), verified(during, first)]).toEqual([true, true]);
    expect(verifyWebhook(second.secret, { ...during, signature: during.signature.split(' ')[0]! }, during.body).ok).toBe(true);

    const third = await rotateSecret(db(), 'rot', { overlap: 0 });
    expect(third.previousSecretUntil).toBeNull();
    expect((await turn('tenant-a', 'rot2', [{ sink: 'rot', body: 2 }])).type).toBe('turn_committed');
    await waitFor(() => at('/rot').length >= 2, { timeoutMs: 10_000, what: 'the second message arrived' });
    const after = at('/rot')[1]!;
    expect(after.signature.split(' ')).toHaveLength(1);
    expect([verified(after, third.secret), verified(after, second.secret), verified(after, first)]).toEqual([true, false, false]);
    await expect(rotateSecret(db(), 'rot', { secret: third.secret })).rejects.toThrow(/current one/);
    await expect(rotateSecret(db(), 'nope')).rejects.toMatchObject({ code: 'not_found' });
    await expect(rotateSecret(db(), 'rot', { overlap: '31d' })).rejects.toMatchObject({ code: 'invalid_argument' });
  });

  it('refuses every inside URL when a sink is added, in every spelling, and stores none of them', async () => {
    for (const [i, url] of INSIDE.entries())
      await expect(addSink(db(), { name: `inside-${i}`, url }), url).rejects.toMatchObject({ code: 'invalid_argument' });
    // a name that resolves inside now is refused too
    await expect(addSink(db(), { name: 'rebound', url: 'https://hooks.example.com/' }, { resolve: answering('10.0.0.7') })).rejects.toThrow(
      /resolves to 10\.0\.0\.7/,
    );
    const stored = await db().execute<{ n: number }>(
      sql`select count(*)::int as n from corral.sinks where name like 'inside-%' or name = 'rebound'`,
    );
    expect(stored.rows[0]!.n).toBe(0);
    // the CLI says so and exits 2; with --allow-private it adds the sink
    const cli = await corralCli(['sinks', 'add', 'cli-inside', '--url', 'http://0x7f000001:8080/'], t.db.url);
    expect([cli.code, cli.stderr]).toEqual([2, expect.stringMatching(/127\.0\.0\.1|loopback/)]);
    expect(cli.stderr).toContain('--allow-private');
    const ok = await corralCli(['sinks', 'add', 'cli-local', '--url', 'http://127.0.0.1:9/', '--allow-private'], t.db.url);
    expect(ok.code, ok.stderr).toBe(0);
  });

  it('never connects to an inside address a stored URL came to name: checked again at every connect', async () => {
    // a sink added while its URL passed, whose URL then names the host itself (as a DNS answer that
    // changed would): both an address and a name that resolves to loopback
    for (const [name, host] of [
      ['moved-addr', '127.0.0.1'],
      ['moved-name', 'localhost'],
    ] as const) {
      await addSink(db(), { name, url: 'https://93.184.216.34/hook' });
      const port = new URL(rx.url('/')).port;
      await db().execute(sql`update corral.sinks set url = ${`http://${host}:${port}/${name}`} where name = ${name}`);
      expect((await turn('tenant-a', name, [{ sink: name, body: { secret: 'for inside' } }])).type).toBe('turn_committed');
    }
    await waitFor(
      async () =>
        (await rowsOf('tenant-a')).filter((r) => r.sink.startsWith('moved-') && r.last_error !== null).length === 2 ? true : undefined,
      { timeoutMs: 15_000, what: 'both attempts failed' },
    );
    const rows = (await rowsOf('tenant-a')).filter((r) => r.sink.startsWith('moved-'));
    expect(rows.map((r) => r.last_error)).toEqual([
      expect.stringMatching(/127\.0\.0\.1.*loopback/),
      expect.stringMatching(/refused to connect: localhost resolves to (127\.0\.0\.1|::1)/),
    ]);
    expect(at('/moved-addr')).toEqual([]);
    expect(at('/moved-name')).toEqual([]);
  });
});
