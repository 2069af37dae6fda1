/**
 * The outbox through kill -9 of real daemon processes (`corral daemon`, `corral worker`, real
 * PostgreSQL and ZeroMQ), with a real HTTP receiver in this process that de-duplicates by
 * `webhook-id`. What must arrive is derived from the events sent (one message per event, its id
 * derived from the event), not read back from the outbox, so a message never written is missed.
 *  - killed between commit and send (the sink disabled while the turns commit): after a restart
 *    every committed message arrives, none missing, none unexpected, each sent once;
 *  - killed at random moments of a steady stream, each time with a request open: all arrive;
 *  - killed while the receiver holds a request open: the same message (same webhook-id) is sent
 *    again by the new daemon only once its claim lapsed (sink timeout + 5 s), the actor's next
 *    message after it, another actor's meanwhile;
 *  - two daemons on one database: no webhook-id ever has two requests open at once, every message
 *    is sent exactly once, per actor in commit order, and both daemons delivered.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { openDatabase, type Database } from '../../src/db/client.ts';
import { setSinkDisabled } from '../../src/db/outbox/sinks.ts';
import { addSink, enableSink } from '../../src/outbox/sinks.ts';
import { webhookIdOf } from '../../src/effects/deliver.ts';
import { useTestDatabases } from '../helpers/db.ts';
import { fastRecoveryEnv, freePort, killAll, spawnCorral, type Proc, exitOf } from '../helpers/processes.ts';
import { sleep, waitFor } from '../helpers/wait.ts';
import { WebhookReceiver, type ReceivedWebhook } from '../helpers/webhook-receiver.ts';

const AGENT = 'ob';

/** One event sent: its actor's session and the webhook-id its message must carry. */
interface Sent {
  session: string;
  eventId: string;
  webhookId: string;
}

describe('the outbox through kill -9 of the daemon', () => {
  // registered before the afterEach below: a test's database is dropped once its processes are gone
  const databases = useTestDatabases();
  let client: pg.Client | undefined;
  let orm: Database | undefined;
  let rx: WebhookReceiver | undefined;
  const procs: Proc[] = [];
  const homes: string[] = [];

  afterEach(async () => {
    await client?.end();
    await orm?.close();
    killAll();
    await Promise.all(procs.map((p) => p.exited));
    procs.length = 0;
    await rx?.stop();
    for (const h of homes) rmSync(h, { recursive: true, force: true });
    homes.length = 0;
    client = orm = rx = undefined;
  });

  /** A database, a receiver, and how to start daemons and workers on them. */
  async function rig(extraEnv: Record<string, string> = {}) {
    const db = await databases.fresh();
    rx = new WebhookReceiver();
    await rx.start();
    client = new pg.Client({ connectionString: db.url });
    await client.connect();
    orm = openDatabase(db.url, { max: 2 });
    const c = client;
    const url = db.url;
    const node = async (name: string) => {
      const endpoint = `tcp://127.0.0.1:${await freePort()}`;
      const home = mkdtempSync(join(tmpdir(), `corral-obx-${name}-`));
      homes.push(home);
      const env = { ...fastRecoveryEnv(url, endpoint), CORRAL_HOME: home, CORRAL_LOG_LEVEL: 'info', ...extraEnv };
      const start = (args: string[], label: string, more: Record<string, string> = {}) => {
        const p = spawnCorral(args, { ...env, ...more }, label);
        procs.push(p);
        return p;
      };
      return {
        daemon: (label: string, more: Record<string, string> = {}) => start(['daemon'], label, more),
        worker: (id: string) => start(['worker', '--id', id, '--endpoint', endpoint, '--capacity', '8', '--insecure'], id),
      };
    };
    /** Sends one event per item (in order) straight into the database: no daemon needed. */
    const send = async (items: { session: string; data: Record<string, unknown> }[]): Promise<Sent[]> => {
      const res = await c.query<{ event_id: string }>(`select event_id from corral.send_events($1::jsonb) order by ord`, [
        JSON.stringify(items.map((i) => ({ agent_uid: AGENT, session_id: i.session, data: i.data }))),
      ]);
      return res.rows.map((r, i) => ({
        session: items[i]!.session,
        eventId: r.event_id,
        webhookId: webhookIdOf({ agentUid: AGENT, sessionId: items[i]!.session }, r.event_id, 0),
      }));
    };
    const readyWorkers = async () =>
      (await c.query<{ n: number }>(`select count(*)::int as n from corral.workers where status = 'ready'`)).rows[0]!.n;
    /** The id the daemon of `proc` claims under, once it is up. */
    const daemonId = (proc: Proc) =>
      waitFor(
        async () =>
          (await c.query<{ id: string }>(`select daemon_id as id from corral.daemons where pid = $1`, [proc.child.pid])).rows[0]?.id,
        { timeoutMs: 30_000, what: `the daemon up (log: ${proc.logPath})` },
      );
    return { c, db: orm.db, rx, node, send, readyWorkers, daemonId };
  }

  /** Waits until every message of `sent` arrived at `path` (first receipts, de-duplicated by webhook-id). */
  async function allArrive(r: WebhookReceiver, path: string, sent: readonly Sent[], timeoutMs: number, logs: () => string) {
    const missing = () => {
      const got = new Set(r.unique(path).map((m) => m.id));
      return sent.filter((s) => !got.has(s.webhookId));
    };
    await waitFor(() => missing().length === 0, { timeoutMs, intervalMs: 50 }).catch((e: unknown) => {
      throw new Error(`${missing().length} of ${sent.length} messages missing (logs: ${logs()}): ${String(e)}`);
    });
  }

  /** None missing, none unexpected, each body its own event's, every row delivered; the rows as read. */
  async function expectExactlyTheSent(c: pg.Client, r: WebhookReceiver, sink: string, secret: string, sent: readonly Sent[]) {
    const got = r.unique(`/${sink}`);
    const want = new Set(sent.map((s) => s.webhookId));
    expect(new Set(sent.map((s) => s.eventId)).size, 'one message per event').toBe(sent.length);
    expect(
      sent.filter((s) => !got.some((m) => m.id === s.webhookId)).map((s) => s.webhookId),
      'missing',
    ).toEqual([]);
    expect(
      got.filter((m) => !want.has(m.id)).map((m) => m.id),
      'unexpected',
    ).toEqual([]);
    const byId = new Map(sent.map((s) => [s.webhookId, s]));
    for (const m of got) {
      const body = JSON.parse(m.body) as { actor: string; event_id: string };
      expect(body).toMatchObject({ actor: `${AGENT}/${byId.get(m.id)!.session}`, event_id: byId.get(m.id)!.eventId });
    }
    expect(r.allSigned(secret, `/${sink}`)).toBe(true);
    // a message arrives before its answer is recorded: wait for the last answers
    const unsettled = `select count(*)::int as n from corral.outbox where sink = $1 and state = 'pending'`;
    await waitFor(async () => (await c.query<{ n: number }>(unsettled, [sink])).rows[0]!.n === 0, {
      timeoutMs: 20_000,
      what: 'every answer recorded',
    }).catch(() => undefined);
    const rows = await c.query<{ webhook_id: string; state: string; attempts: number }>(
      `select webhook_id, state, attempts from corral.outbox where sink = $1 order by id`,
      [sink],
    );
    expect(rows.rows.map((row) => row.webhook_id).sort()).toEqual([...want].sort());
    expect(rows.rows.filter((row) => row.state !== 'delivered')).toEqual([]);
    // the fence: each event committed once, so it wrote its message once
    const turns = await c.query<{ once: number }>(
      `select count(*)::int as once from (select event_id from corral.turns where event_id = any($1::uuid[])
        group by event_id having count(*) filter (where status = 'succeeded') = 1) x`,
      [sent.map((s) => s.eventId)],
    );
    expect(turns.rows[0]!.once).toBe(sent.length);
    return rows.rows;
  }

  /**
   * Per actor, the first receipts come in the order its events were sent (its commit order), and
   * one request is open at a time: each arrives only once the one before it was answered (or its
   * connection closed).
   */
  function expectActorOrder(r: WebhookReceiver, path: string, sent: readonly Sent[]) {
    const want = new Map<string, string[]>();
    for (const s of sent) want.set(s.session, [...(want.get(s.session) ?? []), s.webhookId]);
    const session = new Map(sent.map((s) => [s.webhookId, s.session]));
    const got = new Map<string, string[]>();
    for (const m of r.unique(path)) {
      const s = session.get(m.id);
      if (s !== undefined) got.set(s, [...(got.get(s) ?? []), m.id]);
    }
    expect(Object.fromEntries(got)).toEqual(Object.fromEntries(want));
    const last = new Map<string, ReceivedWebhook>();
    const overlaps: string[] = [];
    for (const m of r.received.filter((x) => x.path === path)) {
      const s = session.get(m.id);
      if (s === undefined) continue;
      const prev = last.get(s);
      if (prev && (prev.doneAt === undefined || m.at < prev.doneAt)) overlaps.push(`${s}: ${m.id} while ${prev.id} was open`);
      last.set(s, m);
    }
    expect(overlaps, 'two requests of one actor open at once').toEqual([]);
  }

  it('killed between commit and send: after a restart every committed message arrives, once', { timeout: 60_000 }, async () => {
    const { c, db: orm, rx, node, send, readyWorkers } = await rig();
    const sink = await addSink(orm, { name: 'later', url: rx.url('/later'), timeout: '5s', allowPrivate: true });
    rx.respond = () => ({ status: 200, delayMs: 20 });
    // the turns commit while the sink is disabled: their messages are written, and nobody sends them
    await setSinkDisabled(orm, 'later', 'held back by the test');
    const n = await node('a');
    let daemon = n.daemon('daemon');
    const worker = n.worker('obx-w1');
    await waitFor(async () => (await readyWorkers()) === 1, { timeoutMs: 30_000, what: `the worker up (log: ${worker.logPath})` });
    const sent = await send(
      Array.from({ length: 24 }, (_, i) => ({ session: `s${i % 6}`, data: { text: `m${i}`, deliver: { sink: 'later' } } })),
    );
    const pending = `select count(*)::int as n from corral.outbox where sink = 'later' and state = 'pending' and attempts = 0`;
    await waitFor(async () => (await c.query<{ n: number }>(pending)).rows[0]!.n === sent.length, {
      timeoutMs: 30_000,
      what: `24 messages committed (log: ${daemon.logPath})`,
    });
    expect(rx.received).toEqual([]);

    daemon.child.kill('SIGKILL');
    await exitOf(daemon);
    await enableSink(orm, 'later');
    daemon = n.daemon('daemon2');
    await allArrive(rx, '/later', sent, 30_000, () => daemon.logPath);
    const rows = await expectExactlyTheSent(c, rx, 'later', sink.secret, sent);
    // nothing failed after the restart: each was sent once
    expect(rows.map((r) => r.attempts)).toEqual(sent.map(() => 1));
    expect(rx.received).toHaveLength(sent.length);
    expectActorOrder(rx, '/later', sent);
    expect(rx.overlapping).toEqual([]);
  });

  it('killed at random moments of a steady stream, each time with a request open: all arrive', { timeout: 150_000 }, async () => {
    // an event a killed daemon had fetched but not begun comes back when its job's heartbeat lapses
    // (10 s, then pg-boss's next supervise pass) and its retry is due; the actor's later events wait
    // behind it: on a loaded machine that took up to 50 s, so the last wait allows 80 s
    const { c, db: orm, rx, node, send } = await rig({ CORRAL_JOB_HEARTBEAT_S: '10' });
    const sink = await addSink(orm, { name: 'stream', url: rx.url('/stream'), timeout: '1s', concurrency: 4, allowPrivate: true });
    rx.respond = () => ({ status: 200, delayMs: 30 + Math.floor(Math.random() * 120) });
    const n = await node('a');
    let daemon = n.daemon('daemon');
    n.worker('obx-w1');
    const sent: Sent[] = [];
    let producing = true;
    const producer = (async () => {
      for (let i = 0; producing; i += 2) {
        const item = (k: number) => ({ session: `s${k % 8}`, data: { text: `m${k}`, deliver: { sink: 'stream' } } });
        sent.push(...(await send([item(i), item(i + 1)])));
        await sleep(120);
      }
    })();
    const kills: { claimed: number; pending: number }[] = [];
    for (let k = 0; k < 3; k++) {
      const before = rx.received.length;
      await waitFor(() => rx.received.length >= before + 3, {
        timeoutMs: 40_000,
        what: `daemon ${k + 1} sending (log: ${daemon.logPath})`,
      });
      await sleep(100 + Math.floor(Math.random() * 900));
      await waitFor(() => rx.open > 0, { timeoutMs: 10_000, intervalMs: 5, what: 'a request open' });
      daemon.child.kill('SIGKILL');
      await exitOf(daemon);
      const left = await c.query<{ claimed: number; pending: number }>(
        `select count(*) filter (where claimed_until > now())::int as claimed, count(*)::int as pending
           from corral.outbox where state = 'pending'`,
      );
      kills.push(left.rows[0]!);
      daemon = n.daemon(`daemon${k + 2}`);
    }
    const more = rx.received.length;
    await waitFor(() => rx.received.length >= more + 3, { timeoutMs: 40_000, what: `the last daemon sending (log: ${daemon.logPath})` });
    producing = false;
    await producer;
    await allArrive(rx, '/stream', sent, 80_000, () => daemon.logPath);
    await expectExactlyTheSent(c, rx, 'stream', sink.secret, sent);
    expectActorOrder(rx, '/stream', sent);
    // every kill left a claim held by the dead daemon: the test killed mid-send, each time
    expect(kills.every((k) => k.claimed > 0)).toBe(true);
    expect(rx.overlapping).toEqual([]);
    expect(sent.length).toBeGreaterThan(30);
  });

  it('killed while a request is held open: sent again once its claim lapses, same webhook-id', { timeout: 60_000 }, async () => {
    const { c, db: orm, rx, node, send, daemonId } = await rig();
    const sink = await addSink(orm, { name: 'held', url: rx.url('/held'), timeout: '3s', allowPrivate: true });
    // a1 and a2 commit first (the sink disabled meanwhile), so a2 waits behind a1 in the outbox
    await setSinkDisabled(orm, 'held', 'held back by the test');
    const n = await node('a');
    let daemon = n.daemon('daemon');
    n.worker('obx-w1');
    const firstId = await daemonId(daemon);
    const [a1, a2] = await send([
      { session: 'a', data: { text: 'a1', deliver: { sink: 'held' } } },
      { session: 'a', data: { text: 'a2', deliver: { sink: 'held' } } },
    ]);
    const pending = `select count(*)::int as n from corral.outbox where sink = 'held' and state = 'pending'`;
    await waitFor(async () => (await c.query<{ n: number }>(pending)).rows[0]!.n === 2, {
      timeoutMs: 30_000,
      what: `a1 and a2 committed (log: ${daemon.logPath})`,
    });
    // the first request is held open, and the daemon sending it dies right then
    let held: ReceivedWebhook | undefined;
    rx.respond = (r) => {
      if (held !== undefined) return { status: 200 };
      held = r;
      daemon.child.kill('SIGKILL');
      return 'hang';
    };
    await enableSink(orm, 'held');
    await c.query(`select pg_notify('corral_outbox', '')`);
    await waitFor(() => held, { timeoutMs: 30_000, what: `the first request (log: ${daemon.logPath})` });
    await exitOf(daemon);
    expect(held!.id).toBe(a1!.webhookId);
    const claim = await c.query<{ state: string; attempts: number; claimed_by: string; until_ms: number; held: boolean }>(
      `select state, attempts, claimed_by, extract(epoch from claimed_until)::float8 * 1000 as until_ms,
              claimed_until > now() as held from corral.outbox where webhook_id = $1`,
      [a1!.webhookId],
    );
    // the dead daemon's claim stands: sink timeout + 5 s from the claim
    expect(claim.rows[0]).toMatchObject({ state: 'pending', attempts: 1, claimed_by: firstId, held: true });
    const untilMs = claim.rows[0]!.until_ms;
    expect(untilMs - held!.at).toBeGreaterThan(6_000);

    daemon = n.daemon('daemon2');
    await daemonId(daemon);
    // another actor's message goes out meanwhile: the claim holds only its own actor's queue
    const [b1] = await send([{ session: 'b', data: { text: 'b1', deliver: { sink: 'held' } } }]);
    const all = [a1!, a2!, b1!];
    await allArrive(rx, '/held', all, 40_000, () => daemon.logPath);
    const a1s = rx.received.filter((r) => r.id === a1!.webhookId);
    expect(a1s).toHaveLength(2);
    expect(a1s[1]!.body).toBe(a1s[0]!.body);
    // not before the claim lapsed (one clock: this host's)
    expect(a1s[1]!.at).toBeGreaterThanOrEqual(untilMs - 50);
    const firstOf = (id: string) => rx.received.find((r) => r.id === id)!.at;
    expect(firstOf(b1!.webhookId)).toBeLessThan(a1s[1]!.at);
    expect(firstOf(a2!.webhookId)).toBeGreaterThan(a1s[1]!.at);
    const rows = await expectExactlyTheSent(c, rx, 'held', sink.secret, all);
    expect(rows.find((r) => r.webhook_id === a1!.webhookId)!.attempts).toBe(2);
    expect(rx.overlapping).toEqual([]);
  });

  it('two daemons on one database: no message sent by both at once, each sent once, per actor in order', { timeout: 90_000 }, async () => {
    const { c, db: orm, rx, node, send, readyWorkers } = await rig();
    const sink = await addSink(orm, { name: 'pair', url: rx.url('/pair'), timeout: '5s', concurrency: 4, allowPrivate: true });
    rx.respond = () => ({ status: 200, delayMs: 5 + Math.floor(Math.random() * 30) });
    const metrics: number[] = [];
    const daemons: Proc[] = [];
    for (const name of ['a', 'b']) {
      const n = await node(name);
      const port = await freePort();
      metrics.push(port);
      daemons.push(n.daemon(`daemon-${name}`, { CORRAL_METRICS_PORT: String(port) }));
      n.worker(`obx-${name}`);
    }
    await waitFor(async () => (await readyWorkers()) === 2, {
      timeoutMs: 30_000,
      what: `2 workers up (logs: ${daemons.map((d) => d.logPath).join(', ')})`,
    });
    const ACTORS = 20;
    const sent: Sent[] = [];
    for (let k = 0; k < 10; k++) {
      sent.push(
        ...(await send(
          Array.from({ length: ACTORS }, (_, i) => ({ session: `s${i}`, data: { text: `m${k}`, deliver: { sink: 'pair' } } })),
        )),
      );
      await sleep(100);
    }
    await allArrive(rx, '/pair', sent, 60_000, () => daemons.map((d) => d.logPath).join(', '));
    expect(rx.overlapping).toEqual([]);
    const rows = await expectExactlyTheSent(c, rx, 'pair', sink.secret, sent);
    expect(rows).toHaveLength(200);
    // no claim lapsed and no answer failed: one request per message, from one daemon
    expect(rx.received).toHaveLength(200);
    expect(rows.filter((r) => r.attempts !== 1)).toEqual([]);
    expectActorOrder(rx, '/pair', sent);
    // both daemons sent: each says how many its sink received
    const delivered = await Promise.all(
      metrics.map(async (port) => {
        const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
        return Number(/^corral_outbox_delivered_total\{sink="pair"\} (\d+)/m.exec(text)?.[1] ?? 0);
      }),
    );
    expect(delivered[0]! + delivered[1]!).toBe(200);
    expect(Math.min(...delivered)).toBeGreaterThan(0);
  });
});
