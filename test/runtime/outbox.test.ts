/**
 * The outbox: what a turn_result delivers is written with its commit and POSTed to the sink by the
 * daemon's delivery loop, signed, once per webhook-id; retried on 503 with the same id, dead on
 * 410 (the sink disabled), never sent for a result that failed the fence; a hanging receiver holds
 * only its own sink. A real daemon, real ZeroMQ, a real HTTP receiver in this process.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { sql } from '../../src/db/orm.ts';
import { addSink, enableSink } from '../../src/outbox/sinks.ts';
import { webhookIdOf } from '../../src/effects/deliver.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { RawPeer, type Msg } from '../helpers/raw-peer.ts';
import { sleep, waitFor } from '../helpers/wait.ts';
import { WebhookReceiver } from '../helpers/webhook-receiver.ts';
import { corral } from '../cli/helpers.ts';
import { createMetrics, databaseSource } from '../../src/observability/metrics.ts';
import { sendEvent } from '../helpers/send.ts';

type Ref = Record<string, unknown> & { event_id: string; delivery_id: string; session_id: string; activation_uid: string };

describe('outbox', () => {
  let t: TestDaemon;
  let w: RawPeer;
  const rx = new WebhookReceiver();
  const secrets: Record<string, string> = {};
  const db = () => t.daemon.database.db;

  beforeAll(async () => {
    await rx.start();
    t = await startTestDaemon({ drainMs: 0, retryDelaySeconds: 1, retryDelayMaxSeconds: 2, outboxRetryLimit: 3 });
    for (const name of ['main', 'gone', 'slow', 'fast', 'order']) {
      const s = await addSink(db(), { name, url: rx.url(`/${name}`), timeout: name === 'slow' ? '300ms' : '5s', allowPrivate: true });
      secrets[name] = s.secret;
    }
    w = new RawPeer(t.daemon.broker.endpoint, 'ob-1');
    await w.register(8);
  });

  afterAll(async () => {
    await w?.close();
    await t?.stop();
    await rx.stop();
  });

  async function start(session: string, data: unknown = { n: 1 }): Promise<Msg> {
    const { eventId } = await sendEvent(db(), actorKey('ob', session), data);
    const s = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === eventId);
    await w.send({ type: 'turn_accepted', turn_ref: s.turn_ref });
    return s;
  }

  const result = (s: Msg, deliver: unknown[], ref: unknown = s.turn_ref) => ({
    type: 'turn_result',
    turn_ref: ref,
    messages: [{ role: 'assistant', content: 'ok' }],
    deliver,
  });

  async function rowsOf(session: string) {
    const r = await db().execute<{
      webhook_id: string;
      state: string;
      attempts: number;
      last_status: number | null;
      last_error: string | null;
    }>(sql`select webhook_id, state, attempts, last_status, last_error from corral.outbox where session_id = ${session} order by id`);
    return r.rows;
  }

  const at = (path: string) => rx.received.filter((r) => r.path === path);

  it('an idle outbox sleeps: a claim pass now and then, not a loop', async () => {
    const before = t.daemon.outbox.passes;
    await sleep(1_500);
    expect(t.daemon.outbox.passes - before).toBeLessThan(5);
  });

  it('a result with two deliveries: both arrive, signed, in order, once', async () => {
    const s = await start('two');
    const deliver = [
      { sink: 'main', body: { n: 1, text: 'first' } },
      { sink: 'main', body: { n: 2, text: 'second' }, key: 'order-42' },
    ];
    await w.send(result(s, deliver));
    await w.send(result(s, deliver)); // a duplicate result writes nothing again
    await w.next('turn_committed');
    await w.next('turn_committed');
    await waitFor(() => (at('/main').length >= 2 ? true : undefined), { timeoutMs: 10_000 });
    await sleep(300);
    const got = at('/main');
    expect(got.map((r) => JSON.parse(r.body))).toEqual([
      { n: 1, text: 'first' },
      { n: 2, text: 'second' },
    ]);
    expect(got.map((r) => r.id)).toEqual([
      webhookIdOf({ agentUid: 'ob', sessionId: 'two' }, (s.turn_ref as Ref).event_id, 0),
      'ob/two/order-42',
    ]);
    expect(got.map((r) => [r.actor, r.key])).toEqual([
      ['ob/two', ''],
      ['ob/two', 'order-42'],
    ]);
    expect(rx.allSigned(secrets.main!, '/main')).toBe(true);
    expect(rx.allSigned(secrets.fast!, '/main')).toBe(false);
    expect((await rowsOf('two')).map((r) => [r.state, r.attempts, r.last_status])).toEqual([
      ['delivered', 1, 200],
      ['delivered', 1, 200],
    ]);
  });

  it('503 twice, then 200: delivered on the third attempt with the same webhook-id', async () => {
    rx.respond = (r, n) => (r.path === '/main' && n <= 2 ? { status: 503, headers: { 'retry-after': '1' } } : { status: 200 });
    const s = await start('retry');
    await w.send(result(s, [{ sink: 'main', body: { retry: true }, key: 'retry-1' }]));
    await w.next('turn_committed');
    await waitFor(async () => ((await rowsOf('retry'))[0]?.state === 'delivered' ? true : undefined), { timeoutMs: 20_000 });
    const got = rx.received.filter((r) => r.key === 'retry-1');
    expect(got).toHaveLength(3);
    expect(new Set(got.map((r) => r.body))).toEqual(new Set(['{"retry":true}']));
    // each attempt signs anew (its own timestamp) and every signature holds
    expect(rx.allSigned(secrets.main!, '/main')).toBe(true);
    expect(got[1]!.at - got[0]!.at).toBeGreaterThanOrEqual(900);
    expect((await rowsOf('retry'))[0]).toMatchObject({ state: 'delivered', attempts: 3, last_status: 200 });
    rx.respond = () => ({ status: 200 });
  });

  it('410: the message is dead-lettered and the sink disabled; the next waits until the sink is enabled', async () => {
    rx.respond = (r) => (r.path === '/gone' && r.key === 'gone-1' ? { status: 410 } : { status: 200 });
    const s1 = await start('gone');
    await w.send(result(s1, [{ sink: 'gone', body: 1, key: 'gone-1' }]));
    await w.next('turn_committed');
    await waitFor(async () => ((await rowsOf('gone'))[0]?.state === 'dead' ? true : undefined), { timeoutMs: 10_000 });
    expect((await rowsOf('gone'))[0]).toMatchObject({ state: 'dead', attempts: 1, last_status: 410 });
    const sink = await db().execute<{ disabled_at: Date | null }>(sql`select disabled_at from corral.sinks where name = 'gone'`);
    expect(sink.rows[0]!.disabled_at).not.toBeNull();
    const s2 = await start('gone', { n: 2 });
    await w.send(result(s2, [{ sink: 'gone', body: 2, key: 'gone-2' }]));
    await w.next('turn_committed');
    await sleep(1_000);
    expect(at('/gone').map((r) => r.key)).toEqual(['gone-1']);
    // operators see it: `corral status` and the scrape-time gauges
    const status = await corral(['status'], t.db.url);
    expect(status.stdout).toMatch(/^outbox: 1 pending \(oldest \S+\), 1 dead \(see `corral outbox list --state dead`\)$/m);
    const metrics = createMetrics({ defaultMetrics: false });
    metrics.setSource(databaseSource(db(), t.daemon.queues));
    const text = await metrics.registry.metrics();
    expect(text).toContain('corral_outbox_messages{state="pending"} 1');
    expect(text).toContain('corral_outbox_messages{state="dead"} 1');
    await enableSink(db(), 'gone');
    t.daemon.outbox.wake();
    await waitFor(() => (at('/gone').some((r) => r.key === 'gone-2') ? true : undefined), { timeoutMs: 10_000 });
    expect(at('/gone').map((r) => r.key)).toEqual(['gone-1', 'gone-2']);
    rx.respond = () => ({ status: 200 });
  });

  it('a result that fails the fence (stale epoch, cancelled turn) delivers nothing, ever', async () => {
    const s = await start('stale');
    const ref = s.turn_ref as Ref;
    await w.send(result(s, [{ sink: 'main', body: 'stale', key: 'stale-1' }], { ...ref, actor_epoch: (ref.actor_epoch as number) + 7 }));
    const rejected = await w.next('turn_rejected');
    expect(rejected.reason).not.toBe('deliver_limit');
    const c = await start('cancelled');
    await t.daemon.cancel(actorKey('ob', 'cancelled'));
    await w.send(result(c, [{ sink: 'main', body: 'cancelled', key: 'cancelled-1' }]));
    expect((await w.next('turn_rejected')).reason).toBeTruthy();
    await sleep(1_500);
    expect(rx.received.filter((r) => r.key === 'stale-1' || r.key === 'cancelled-1')).toEqual([]);
    expect(await rowsOf('stale')).toEqual([]);
    expect(await rowsOf('cancelled')).toEqual([]);
  });

  it('refuses a result whose deliver breaks the limits: an unknown sink, too many, a key twice, a bad key', async () => {
    const cases: [unknown[], RegExp][] = [
      [[{ sink: 'nope', body: 1 }], /nope: no such sink/],
      [Array.from({ length: 17 }, () => ({ sink: 'main', body: 1 })), /17 deliveries; at most 16/],
      [
        [
          { sink: 'main', body: 1, key: 'k' },
          { sink: 'main', body: 2, key: 'k' },
        ],
        /used twice/,
      ],
      [[{ sink: 'main', body: 1, key: 'has space' }], /deliver\[0\]: key/],
      [[{ sink: 'main', body: 'x'.repeat(300 * 1024) }], /bytes; at most/],
      // a body nested deeper than the wire allows: the frame is cut, the cut value refused
      [[{ sink: 'main', body: JSON.parse('['.repeat(150) + ']'.repeat(150)) as unknown }], /deliver\[0\]\.body/],
    ];
    for (const [i, [deliver, why]] of cases.entries()) {
      const s = await start(`limits-${i}`);
      await w.send(result(s, deliver));
      // the accept sent just before may be written after the refusal failed the attempt: it is then
      // refused too (`already_failed`), harmlessly, and that answer can come first
      const r = await w.next(
        'turn_rejected',
        (m) => (m.turn_ref as Ref).event_id === (s.turn_ref as Ref).event_id && m.reason !== 'already_failed',
      );
      expect(r.reason).toBe('deliver_limit');
      expect(String(r.detail)).toMatch(why);
      expect(await rowsOf(`limits-${i}`)).toEqual([]);
    }
  });

  it('a receiver that hangs is bounded by its timeout, and other sinks keep delivering', async () => {
    rx.respond = (r) => (r.path === '/slow' ? 'hang' : { status: 200 });
    const slow = await start('hang-slow');
    await w.send(result(slow, [{ sink: 'slow', body: 'slow', key: 'slow-1' }]));
    await w.next('turn_committed');
    await waitFor(() => (at('/slow').length >= 1 ? true : undefined), { timeoutMs: 10_000 });
    const sentAt = Date.now();
    for (let i = 0; i < 5; i++) {
      const s = await start(`hang-fast-${i}`);
      await w.send(result(s, [{ sink: 'fast', body: i, key: `fast-${i}` }]));
      await w.next('turn_committed');
    }
    await waitFor(() => (at('/fast').length >= 5 ? true : undefined), { timeoutMs: 10_000 });
    expect(Date.now() - sentAt).toBeLessThan(5_000);
    await waitFor(async () => (((await rowsOf('hang-slow'))[0]?.attempts ?? 0) >= 2 ? true : undefined), { timeoutMs: 10_000 });
    const row = (await rowsOf('hang-slow'))[0]!;
    expect(row.state).toBe('pending');
    expect(row.last_error).toBe('no answer within 300 ms');
    // a message waiting behind the one in flight does not make the loop spin
    const next = await start('hang-slow', { n: 2 });
    await w.send(result(next, [{ sink: 'slow', body: 'next', key: 'slow-2' }]));
    await w.next('turn_committed');
    const before = t.daemon.outbox.passes;
    await sleep(1_500);
    expect(t.daemon.outbox.passes - before).toBeLessThan(30);
    expect(at('/slow').some((r) => r.key === 'slow-2')).toBe(false);
    rx.respond = () => ({ status: 200 });
  });

  it('per actor and sink, a message waits for the one before it', async () => {
    rx.respond = (r, n) => (r.key === 'order-a' && n === 1 ? { status: 500 } : { status: 200 });
    const a = await start('order');
    await w.send(result(a, [{ sink: 'order', body: 'a', key: 'order-a' }]));
    await w.next('turn_committed');
    const b = await start('order', { n: 2 });
    await w.send(result(b, [{ sink: 'order', body: 'b', key: 'order-b' }]));
    await w.next('turn_committed');
    await waitFor(() => (at('/order').some((r) => r.key === 'order-b') ? true : undefined), { timeoutMs: 15_000 });
    expect(at('/order').map((r) => r.key)).toEqual(['order-a', 'order-a', 'order-b']);
    rx.respond = () => ({ status: 200 });
  });

  it('a key the sink already has from the same actor is the same message: not written or sent again', async () => {
    const s = await start('two', { n: 2 });
    await w.send(result(s, [{ sink: 'main', body: 'again', key: 'order-42' }]));
    await w.next('turn_committed');
    await sleep(800);
    expect(rx.received.filter((r) => r.id === 'ob/two/order-42')).toHaveLength(1);
    expect((await rowsOf('two')).map((r) => r.webhook_id)).toHaveLength(2);
  });
});
