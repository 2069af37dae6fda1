/**
 * Context in turn_start and the worker RPC, on real PostgreSQL and a real ROUTER/DEALER pair:
 * a turn sees the conversation it continues; `history.read` pages back through it; a request
 * whose turn_ref does not name a live turn of the worker reads nothing.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from '../../src/db/orm.ts';
import pg from 'pg';
import { actorKey } from '../../src/base/actor-key.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { RawPeer, type Msg } from '../helpers/raw-peer.ts';
import { sendEvent } from '../helpers/send.ts';

type Ref = Record<string, unknown> & { event_id: string; delivery_id: string; revision: number; session_id: string };
type Ctx = {
  conversation_id: string;
  messages: { seq: number; role: string; content: unknown }[];
  first_seq?: number;
  has_more: boolean;
  current_seq: number;
};

describe('turn context and worker RPC', () => {
  let t: TestDaemon;
  let w: RawPeer;
  let other: RawPeer;
  const db = () => t.daemon.database.db;
  let rpcSeq = 0;

  beforeAll(async () => {
    t = await startTestDaemon({ contextMessages: 50, contextBytes: 64 * 1024, rpcConcurrency: 2, rpcTimeoutMs: 500, drainMs: 0 });
    w = new RawPeer(t.daemon.broker.endpoint, 'ctx-1');
    await w.register(4);
    other = new RawPeer(t.daemon.broker.endpoint, 'ctx-2');
    await other.send({ type: 'worker_ready', worker_id: 'ctx-2', capacity: 1 });
    await other.next('worker_welcome');
  });

  afterAll(async () => {
    await w.close();
    await other.close();
    await t.stop();
  });

  async function start(session: string, data: unknown): Promise<Msg> {
    const { eventId } = await sendEvent(db(), actorKey('ctx', session), data);
    const s = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === eventId);
    await w.send({ type: 'turn_accepted', turn_ref: s.turn_ref });
    return s;
  }

  async function commit(s: Msg, messages: unknown[]): Promise<void> {
    await w.send({ type: 'turn_result', turn_ref: s.turn_ref, messages });
    await w.next('turn_committed', (m) => (m.turn_ref as Ref).delivery_id === (s.turn_ref as Ref).delivery_id);
  }

  async function rpc(from: RawPeer, ref: unknown, method: string, params?: unknown): Promise<Msg> {
    const id = `r${++rpcSeq}`;
    await from.send({ type: 'rpc_request', id, method, ...(params === undefined ? {} : { params }), turn_ref: ref });
    return from.next('rpc_response', (m) => m.id === id);
  }

  it("a second turn's turn_start carries the first turn's messages, its own user message marked by current_seq", async () => {
    const first = await start('two', { text: 'one' });
    const c1 = first.context as Ctx;
    expect(c1).toMatchObject({ messages: [], has_more: false, current_seq: 1 });
    expect(c1.first_seq).toBeUndefined();
    await commit(first, [{ role: 'assistant', content: { text: 'echo: one' } }]);
    const second = await start('two', { text: 'two' });
    const c2 = second.context as Ctx;
    expect(c2.conversation_id).toBe(c1.conversation_id);
    expect(c2.messages).toEqual([
      { seq: 1, role: 'user', content: { text: 'one' } },
      { seq: 2, role: 'assistant', content: { text: 'echo: one' } },
    ]);
    expect(c2).toMatchObject({ first_seq: 1, has_more: false, current_seq: 3 });
    await commit(second, [{ role: 'assistant', content: 'ok' }]);
    // the event's own message is written as current_seq on commit
    const rows = await db().execute<{ seq: number; role: string; content: unknown }>(sql`
      select m.seq, m.role, m.content from corral.messages m join corral.conversations c on c.id = m.conversation_id
       where c.agent_uid = 'ctx' and c.session_id = 'two' and m.seq = 3`);
    expect(rows.rows[0]).toEqual({ seq: 3, role: 'user', content: { text: 'two' } });
  });

  it('bounds the context by message count and by bytes, and says older messages exist', async () => {
    const s = await start('bounded', { n: 0 });
    const big = 'x'.repeat(20_000);
    await commit(
      s,
      Array.from({ length: 99 }, (_, i) => ({ role: 'assistant', content: i >= 95 ? { big } : { i } })),
    );
    const next = await start('bounded', { n: 1 });
    const c = next.context as Ctx;
    // 100 messages exist; 50 at most, and 64 KiB of content: the three 20 kB ones and a few small
    expect(c.messages.length).toBeLessThan(50);
    expect(c.messages.at(-1)!.seq).toBe(100);
    expect(c.first_seq).toBe(c.messages[0]!.seq);
    expect(c.has_more).toBe(true);
    expect(c.current_seq).toBe(101);
    const bytes = c.messages.reduce((n, m) => n + JSON.stringify(m.content).length, 0);
    expect(bytes).toBeLessThanOrEqual(64 * 1024);
    await commit(next, []);
  });

  it('history.read pages backwards through 1,000 messages', async () => {
    const s = await start('thousand', { n: 0 });
    await commit(
      s,
      Array.from({ length: 999 }, (_, i) => ({ role: i % 2 ? 'tool' : 'assistant', content: { i } })),
    );
    const live = await start('thousand', { n: 1 });
    expect((live.context as Ctx).messages).toHaveLength(50);
    const seen: number[] = [];
    let before: number | undefined;
    let pages = 0;
    for (;;) {
      const r = await rpc(w, live.turn_ref, 'history.read', { limit: 100, ...(before ? { before_seq: before } : {}) });
      expect(r.error).toBeUndefined();
      const page = r.result as { messages: { seq: number }[]; has_more: boolean; total: number };
      expect(page.total).toBe(1000);
      pages++;
      seen.unshift(...page.messages.map((m) => m.seq));
      if (!page.has_more) break;
      before = page.messages[0]!.seq;
    }
    expect(pages).toBe(10);
    expect(seen).toEqual(Array.from({ length: 1000 }, (_, i) => i + 1));
    const status = await rpc(w, live.turn_ref, 'actor.status');
    expect(status.result).toMatchObject({
      actor: 'ctx/thousand',
      messages: 1000,
      activation: { status: 'active', current_event_id: (live.turn_ref as Ref).event_id },
    });
    await commit(live, []);
  });

  it('reads nothing for a turn_ref that is not a live turn of the worker', async () => {
    const s = await start('fenced', { n: 0 });
    await commit(s, [{ role: 'assistant', content: 'secret' }]);
    // settled turn
    expect((await rpc(w, s.turn_ref, 'history.read')).error).toMatchObject({ code: 'not_live' });
    const live = await start('fenced', { n: 1 });
    // another worker holding no turn of this actor
    expect((await rpc(other, live.turn_ref, 'history.read')).error).toMatchObject({ code: 'not_live' });
    expect((await rpc(other, live.turn_ref, 'actor.status')).error).toMatchObject({ code: 'not_live' });
    // a made-up delivery
    expect(
      (await rpc(w, { ...(live.turn_ref as Ref), delivery_id: '00000000-0000-4000-8000-000000000000' }, 'history.read')).error,
    ).toMatchObject({ code: 'not_live' });
    // stale revision after a steer
    await t.daemon.steer(actorKey('ctx', 'fenced'), { more: true });
    const steer = await w.next('turn_steer');
    expect((await rpc(w, live.turn_ref, 'history.read')).error).toMatchObject({ code: 'not_live' });
    expect((await rpc(w, steer.turn_ref, 'history.read')).result).toMatchObject({ total: 2 });
    // the event's job is no longer active in the delivery's attempt (as checkFence asks of a reply)
    const eventId = (steer.turn_ref as Ref).event_id as string;
    await db().execute(sql`update pgboss.job set retry_count = retry_count + 1 where id = ${eventId}::uuid`);
    expect((await rpc(w, steer.turn_ref, 'history.read')).error).toMatchObject({ code: 'not_live' });
    expect((await rpc(w, steer.turn_ref, 'actor.status')).error).toMatchObject({ code: 'not_live' });
    await db().execute(sql`update pgboss.job set retry_count = retry_count - 1 where id = ${eventId}::uuid`);
    expect((await rpc(w, steer.turn_ref, 'actor.status')).result).toMatchObject({ actor: 'ctx/fenced' });
    // lease expired
    await db().execute(
      sql`update corral.activations set lease_expires_at = now() - interval '1 second' where activation_uid = ${(live.turn_ref as Ref).activation_uid as string}`,
    );
    expect((await rpc(w, steer.turn_ref, 'history.read')).error).toMatchObject({ code: 'not_live' });
    expect((await rpc(w, steer.turn_ref, 'no.such')).error).toMatchObject({ code: 'unknown_method' });
  });

  it('bounds requests per worker (busy) and answers a slow one with timeout', async () => {
    const live = await start('limits', { n: 0 });
    expect((await rpc(w, live.turn_ref, 'history.read', { limit: 0 })).error).toMatchObject({ code: 'invalid_params' });
    // hold the messages table so reads wait
    const blocker = new pg.Client({ connectionString: t.db.url });
    await blocker.connect();
    await blocker.query('begin');
    await blocker.query('lock table corral.messages in access exclusive mode');
    try {
      const ids = Array.from({ length: 5 }, () => `b${++rpcSeq}`);
      for (const id of ids) await w.send({ type: 'rpc_request', id, method: 'history.read', turn_ref: live.turn_ref });
      const answers = await Promise.all(ids.map((id) => w.next('rpc_response', (m) => m.id === id)));
      const codes = answers.map((a) => (a.error as { code: string }).code).sort();
      expect(codes).toEqual(['busy', 'busy', 'busy', 'timeout', 'timeout']);
    } finally {
      await blocker.query('rollback');
      await blocker.end();
    }
    await commit(live, []);
  });
});

describe('contexts kept between turns (src/runtime/context-cache.ts)', () => {
  let t: TestDaemon;
  let w: RawPeer;
  const db = () => t.daemon.database.db;
  const limits = { maxMessages: 4, maxBytes: 60 };

  beforeAll(async () => {
    t = await startTestDaemon({ contextMessages: limits.maxMessages, contextBytes: limits.maxBytes, drainMs: 0 });
    w = new RawPeer(t.daemon.broker.endpoint, 'kept-1');
    await w.register(2);
  });

  afterAll(async () => {
    await w.close();
    await t.stop();
  });

  async function start(session: string, data: unknown): Promise<Msg> {
    const { eventId } = await sendEvent(db(), actorKey('kept', session), data);
    return w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === eventId);
  }

  async function commit(s: Msg, messages: unknown[]): Promise<void> {
    await w.send({ type: 'turn_result', turn_ref: s.turn_ref, messages });
    await w.next('turn_committed', (m) => (m.turn_ref as Ref).delivery_id === (s.turn_ref as Ref).delivery_id);
  }

  /** The context as the database holds it now, picked here by the rule of docs/protocol.md §5.3. */
  async function contextInDatabase(session: string): Promise<Ctx> {
    const conv = await db().execute<{ id: string; next_seq: number }>(
      sql`select id, next_seq from corral.conversations where agent_uid = 'kept' and session_id = ${session}`,
    );
    const { id, next_seq } = conv.rows[0]!;
    const rows = await db().execute<{ seq: number; role: string; text: string }>(
      sql`select seq, role, content::text as text from corral.messages where conversation_id = ${id} order by seq desc limit ${limits.maxMessages}`,
    );
    const picked: Ctx['messages'] = [];
    let bytes = 0;
    for (const r of rows.rows) {
      bytes += Buffer.byteLength(r.text);
      if (bytes > limits.maxBytes) break;
      picked.unshift({ seq: r.seq, role: r.role, content: JSON.parse(r.text) });
    }
    const first = picked[0]?.seq;
    return {
      conversation_id: id,
      messages: picked,
      ...(first === undefined ? {} : { first_seq: first }),
      has_more: (first ?? next_seq) > 1,
      current_seq: next_seq,
    };
  }

  it('sends the context the database would read, without reading it again', async () => {
    // contents PostgreSQL prints otherwise than JSON.stringify (key order, spaces), non-ASCII,
    // and messages over the byte budget on their own
    const replies: unknown[][] = [
      [{ role: 'assistant', content: { zeta: 1, a: [1, { y: null, b: true }] } }],
      [{ role: 'tool', content: '日本語のテキスト' }],
      [],
      [{ role: 'assistant', content: 'x'.repeat(70) }],
      [
        { role: 'assistant', content: 1.25 },
        { role: 'tool', content: { é: 'ü' } },
      ],
      [{ role: 'assistant', content: 'y'.repeat(40) }],
      [{ role: 'assistant', content: [] }],
    ];
    const before = t.daemon.runtime.contexts.stats;
    for (const [i, messages] of replies.entries()) {
      const s = await start('exact', { turn: i, text: `ünïcode ${i}` });
      expect(s.context).toEqual(await contextInDatabase('exact'));
      await commit(s, messages);
    }
    const after = t.daemon.runtime.contexts.stats;
    // the first turn read its (empty) conversation; every later one came from the cache
    expect(after.misses - before.misses).toBe(1);
    expect(after.hits - before.hits).toBe(replies.length - 1);
  });

  it('reads the context again when the conversation moved on elsewhere (another daemon committed)', async () => {
    const first = await start('moved', { n: 1 });
    await commit(first, [{ role: 'assistant', content: 'here' }]);
    // what another daemon's commit writes: a turn, its messages, the conversation's next_seq
    await db().execute(sql`
      with c as (
        update corral.conversations set next_seq = next_seq + 2
         where agent_uid = 'kept' and session_id = 'moved' returning id, next_seq - 2 as first
      ), tu as (
        insert into corral.turns (id, conversation_id, event_id, delivery_id, status, activation_uid, actor_epoch, revision, attempt)
        select gen_random_uuid(), c.id, gen_random_uuid(), gen_random_uuid(), 'succeeded', gen_random_uuid(), 99, 0, 1 from c
        returning id, conversation_id
      )
      insert into corral.messages (conversation_id, turn_id, seq, role, content)
      select tu.conversation_id, tu.id, c.first + x.o, x.role, x.content
        from tu, c, (values (0, 'user', '"elsewhere"'::jsonb), (1, 'assistant', '{"by": "another daemon"}'::jsonb)) as x(o, role, content)`);
    const before = t.daemon.runtime.contexts.stats;
    const next = await start('moved', { n: 2 });
    const c = next.context as Ctx;
    expect(c).toEqual(await contextInDatabase('moved'));
    expect(c.messages.map((m) => m.content)).toEqual([{ n: 1 }, 'here', 'elsewhere', { by: 'another daemon' }]);
    expect(t.daemon.runtime.contexts.stats.misses - before.misses).toBe(1);
    await commit(next, []);
    // and the cache follows from there
    const third = await start('moved', { n: 3 });
    expect(third.context).toEqual(await contextInDatabase('moved'));
    expect(t.daemon.runtime.contexts.stats.hits - before.hits).toBe(1);
  });
});

describe('contexts kept between turns, when the daemon idles', () => {
  it('are dropped with the idle heap trim, and read from the database again', async () => {
    const t = await startTestDaemon({ heapTrimIdleMs: 100, drainMs: 0 });
    const w = new RawPeer(t.daemon.broker.endpoint, 'idle-1');
    try {
      await w.register(1);
      const db = t.daemon.database.db;
      const run = async (n: number) => {
        const { eventId } = await sendEvent(db, actorKey('idle', 's'), { n });
        const s = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === eventId);
        await w.send({ type: 'turn_result', turn_ref: s.turn_ref, messages: [{ role: 'assistant', content: n }] });
        await w.next('turn_committed', (m) => (m.turn_ref as Ref).event_id === eventId);
        return s.context as Ctx;
      };
      await run(1);
      expect(t.daemon.runtime.contexts.stats.entries).toBe(1);
      const deadline = Date.now() + 10_000;
      while (t.daemon.runtime.contexts.stats.entries > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      expect(t.daemon.runtime.contexts.stats).toMatchObject({ entries: 0, bytes: 0 });
      const misses = t.daemon.runtime.contexts.stats.misses;
      const c = await run(2);
      expect(c.messages.map((m) => m.content)).toEqual([{ n: 1 }, 1]);
      expect(t.daemon.runtime.contexts.stats.misses).toBe(misses + 1);
    } finally {
      await w.close();
      await t.stop();
    }
  });
});
