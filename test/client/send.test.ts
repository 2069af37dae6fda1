/**
 * The client's `send` and `sendMany`: inside the caller's transaction (node-postgres, Drizzle of
 * another schema, an `executeSql` adapter), idempotency keys, order, and the checks.
 */
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
// An application's own Drizzle: its ES-module build, a copy apart from the one corral loads
// (src/db/orm.ts), with a schema corral knows nothing of.
// eslint-disable-next-line @typescript-eslint/no-restricted-imports
import { sql } from 'drizzle-orm';
// eslint-disable-next-line @typescript-eslint/no-restricted-imports
import { drizzle } from 'drizzle-orm/node-postgres';
// eslint-disable-next-line @typescript-eslint/no-restricted-imports
import { pgTable, text } from 'drizzle-orm/pg-core';
import { startClientSetup, jobsOf, replies, type ClientSetup } from './helpers.ts';
import { waitFor } from '../helpers/wait.ts';
import { errorCodeOf } from '../helpers/capture.ts';

let s: ClientSetup;

beforeAll(async () => {
  s = await startClientSetup({ maxEventBytes: 4096 });
});

afterAll(async () => {
  await s?.stop();
});

const code = errorCodeOf;

describe('send inside the caller’s transaction', () => {
  it('a node-postgres transaction rolled back enqueues nothing; committed, waitForTurn returns the reply', async () => {
    const c = s.pg;
    await c.query('begin');
    const rolled = await s.corral.send('app/pg-tx', { text: 'never' }, { db: c });
    expect((await jobsOf(c, 'app/pg-tx')).map((j) => j.id)).toEqual([rolled.eventId]); // visible inside it
    await c.query('rollback');
    expect(await jobsOf(c, 'app/pg-tx')).toEqual([]);

    await c.query('begin');
    const sent = await s.corral.send({ agentUid: 'app', sessionId: 'pg-tx' }, { text: 'hello' }, { db: c });
    // another connection sees nothing before the commit
    const other = new pg.Client({ connectionString: s.t.db.url });
    await other.connect();
    try {
      expect(await jobsOf(other, 'app/pg-tx')).toEqual([]);
      await c.query('commit');
      expect((await jobsOf(other, 'app/pg-tx')).map((j) => j.id)).toEqual([sent.eventId]);
    } finally {
      await other.end();
    }
    const turn = await s.corral.waitForTurn(sent.eventId, { timeoutMs: 20_000 });
    expect(turn.eventId).toBe(sent.eventId);
    expect(turn.actor).toEqual({ agentUid: 'app', sessionId: 'pg-tx' });
    expect(turn.messages.map((m) => [m.role, m.content])).toEqual([
      ['user', { text: 'hello' }],
      ['assistant', { text: 'echo: hello' }],
    ]);
    expect(sent.duplicate).toBe(false);
  });

  it('a pooled client (PoolClient) and a Drizzle transaction of another schema commit and roll back with the caller', async () => {
    const pool = new pg.Pool({ connectionString: s.t.db.url, max: 2 });
    try {
      await pool.query('create table if not exists public.app_orders (id text primary key)');
      const orders = pgTable('app_orders', { id: text('id').primaryKey() });
      const app = drizzle(pool, { schema: { orders } });
      await expect(
        app.transaction(async (tx) => {
          await tx.insert(orders).values({ id: 'o-1' });
          await s.corral.send('app/drizzle', { text: 'o-1' }, { db: tx });
          throw new Error('the order failed');
        }),
      ).rejects.toThrow('the order failed');
      expect(await jobsOf(s.pg, 'app/drizzle')).toEqual([]);
      const sent = await app.transaction(async (tx) => {
        await tx.insert(orders).values({ id: 'o-2' });
        return s.corral.send('app/drizzle', { text: 'o-2' }, { db: tx });
      });
      expect((await pool.query('select id from public.app_orders')).rows).toEqual([{ id: 'o-2' }]);
      expect((await s.corral.waitForTurn(sent.eventId)).messages[1]!.content).toEqual({ text: 'echo: o-2' });
      // a Drizzle of another driver is reached through its `execute` alone (corral's sql in the app's Drizzle)
      await expect(
        app.transaction(async (tx) => {
          await s.corral.send('app/drizzle-execute', { text: 'x' }, { db: { execute: (q: never) => tx.execute(q) } });
          expect(await jobsOf(s.pg, 'app/drizzle-execute')).toEqual([]); // not committed yet
          throw new Error('roll back');
        }),
      ).rejects.toThrow('roll back');
      const viaExecute = await app.transaction((tx) =>
        s.corral.send('app/drizzle-execute', { text: 'y' }, { db: { execute: (q: never) => tx.execute(q) } }),
      );
      expect((await jobsOf(s.pg, 'app/drizzle-execute')).map((j) => j.id)).toEqual([viaExecute.eventId]);

      const client = await pool.connect();
      try {
        await client.query('begin');
        await s.corral.send('app/pool-client', { text: 'x' }, { db: client });
        await client.query('rollback');
      } finally {
        client.release();
      }
      expect(await jobsOf(s.pg, 'app/pool-client')).toEqual([]);
      // a Drizzle statement of the app's own reads what it wrote (its sql is not corral's)
      expect((await app.execute(sql`select count(*)::int as n from public.app_orders`)).rows).toEqual([{ n: 1 }]);
    } finally {
      await pool.end();
    }
  });

  it('an { executeSql } adapter runs the enqueue in its transaction', async () => {
    const c = s.pg;
    const calls: string[] = [];
    const adapter = {
      executeSql: async (textSql: string, values?: unknown[]) => {
        calls.push(textSql);
        return c.query(textSql, values);
      },
    };
    await c.query('begin');
    const sent = await s.corral.send('app/adapter', { text: 'via adapter' }, { db: adapter });
    await c.query('commit');
    expect(calls).toHaveLength(1);
    expect(calls[0]).toContain('corral.send_events');
    const turn = await s.corral.waitForTurn(sent.eventId);
    expect(turn.messages[1]!.content).toEqual({ text: 'echo: via adapter' });
    await expect(code(s.corral.send('app/adapter', 1, { db: {} as never }))).resolves.toBe('invalid_argument');
  });
});

describe('idempotency keys', () => {
  it('twice (before the turn committed, and after) enqueues one event and returns its id; other data is idempotency_conflict', async () => {
    const first = await s.corral.send('app/idem', { text: 'once' }, { idempotencyKey: 'order-17' });
    const again = await s.corral.send('app/idem', { text: 'once' }, { idempotencyKey: 'order-17' });
    expect(again).toEqual({ eventId: first.eventId, duplicate: true });
    expect(first.duplicate).toBe(false);
    await s.corral.waitForTurn(first.eventId);
    // after the commit: still the same event, nothing enqueued
    const after = await s.corral.send('app/idem', { text: 'once' }, { idempotencyKey: 'order-17' });
    expect(after.eventId).toBe(first.eventId);
    expect((await jobsOf(s.pg, 'app/idem')).map((j) => j.id)).toEqual([first.eventId]);
    expect(await replies(s.corral, 'app/idem')).toEqual(['echo: once']);
    // the same data written differently is the same data (jsonb's text)
    expect((await s.corral.send('app/idem', JSON.parse('{ "text" : "once" }'), { idempotencyKey: 'order-17' })).eventId).toBe(
      first.eventId,
    );

    const conflict = s.corral.send('app/idem', { text: 'twice' }, { idempotencyKey: 'order-17' });
    await expect(code(conflict)).resolves.toBe('idempotency_conflict');
    // keys are per actor: another actor's order-17 is its own
    const elsewhere = await s.corral.send('app/idem-2', { text: 'twice' }, { idempotencyKey: 'order-17' });
    expect(elsewhere.eventId).not.toBe(first.eventId);
    expect(elsewhere.duplicate).toBe(false);
  });

  it('a key sent in a transaction that rolled back is free again; a batch with a key twice enqueues one', async () => {
    await s.pg.query('begin');
    const rolled = await s.corral.send('app/idem-tx', { n: 1 }, { idempotencyKey: 'k', db: s.pg });
    await s.pg.query('rollback');
    const sent = await s.corral.send('app/idem-tx', { n: 2 }, { idempotencyKey: 'k' });
    expect(sent.eventId).not.toBe(rolled.eventId);
    expect(sent.duplicate).toBe(false);

    const batch = await s.corral.sendMany([
      { actor: 'app/idem-batch', data: { n: 1 }, idempotencyKey: 'b' },
      { actor: 'app/idem-batch', data: { n: 1 }, idempotencyKey: 'b' },
      { actor: 'app/idem-batch', data: { n: 2 } },
    ]);
    expect(batch[1]).toEqual({ eventId: batch[0]!.eventId, duplicate: true });
    expect((await jobsOf(s.pg, 'app/idem-batch')).map((j) => j.id)).toEqual([batch[0]!.eventId, batch[2]!.eventId]);
  });

  it('concurrent sends of one key enqueue one event', async () => {
    const others = await Promise.all([s.connect(), s.connect(), s.connect()]);
    const results = await Promise.all(others.map((c) => c.send('app/idem-race', { text: 'race' }, { idempotencyKey: 'same' })));
    expect(new Set(results.map((r) => r.eventId)).size).toBe(1);
    expect(results.filter((r) => !r.duplicate)).toHaveLength(1);
    expect(await jobsOf(s.pg, 'app/idem-race')).toHaveLength(1);
  });

  it('refuses keys that are empty, too long or not text', async () => {
    await expect(code(s.corral.send('app/k', 1, { idempotencyKey: '' }))).resolves.toBe('invalid_argument');
    await expect(code(s.corral.send('app/k', 1, { idempotencyKey: 'x'.repeat(201) }))).resolves.toBe('invalid_argument');
    await expect(code(s.corral.send('app/k', 1, { idempotencyKey: 7 as never }))).resolves.toBe('invalid_argument');
    await expect(code(s.corral.send('app/k', 1, { idempotencyKey: 'a\u0000b' }))).resolves.toBe('invalid_argument');
    expect((await s.corral.send('app/k', 1, { idempotencyKey: '🙂'.repeat(200) })).duplicate).toBe(false);
  });
});

describe('sendMany and the checks', () => {
  it('sendMany enqueues a batch in one statement, each actor in array order', async () => {
    const events = Array.from({ length: 6 }, (_, i) => ({ actor: i % 2 ? 'app/many-b' : 'app/many-a', data: { text: `m${i}` } }));
    const sent = await s.corral.sendMany(events);
    expect(sent).toHaveLength(6);
    await Promise.all(sent.map((e) => s.corral.waitForTurn(e.eventId)));
    expect(await replies(s.corral, 'app/many-a')).toEqual(['echo: m0', 'echo: m2', 'echo: m4']);
    expect(await replies(s.corral, 'app/many-b')).toEqual(['echo: m1', 'echo: m3', 'echo: m5']);
    const ids = (await s.corral.transcript('app/many-a')).map((t) => t.eventId);
    expect(ids).toEqual([sent[0]!.eventId, sent[2]!.eventId, sent[4]!.eventId]);
    expect([...ids].sort()).toEqual(ids); // UUIDv7, increasing
    expect(await s.corral.sendMany([])).toEqual([]);
  });

  it('refuses what the CLI refuses, writing nothing', async () => {
    await expect(code(s.corral.send('no-slash', 1))).resolves.toBe('invalid_actor_key');
    await expect(code(s.corral.send({ agentUid: 'a b', sessionId: 's' }, 1))).resolves.toBe('invalid_actor_key');
    await expect(code(s.corral.send('app/check', undefined))).resolves.toBe('invalid_argument');
    await expect(code(s.corral.send('app/check', { big: 'x'.repeat(5000) }))).resolves.toBe('payload_too_large');
    const deep = JSON.parse('['.repeat(101) + ']'.repeat(101)) as unknown;
    await expect(code(s.corral.send('app/check', deep))).resolves.toBe('invalid_argument');
    await expect(
      code(
        s.corral.sendMany([
          { actor: 'app/check', data: 1 },
          { actor: 'bad', data: 2 },
        ]),
      ),
    ).resolves.toBe('invalid_actor_key');
    await expect(code(s.corral.sendMany(Array.from({ length: 1001 }, () => ({ actor: 'app/check', data: 1 }))))).resolves.toBe(
      'invalid_argument',
    );
    expect(await jobsOf(s.pg, 'app/check')).toEqual([]);
  });

  it('a closed client refuses every call', async () => {
    const c = await s.connect();
    await c.close();
    await c.close();
    await expect(code(c.send('app/closed', 1))).resolves.toBe('closed');
    await expect(code(c.transcript('app/closed'))).resolves.toBe('closed');
    await expect(code(c.waitForTurn('01234567-89ab-7def-8123-456789abcdef'))).resolves.toBe('closed');
    await expect(code(c.watchTurns('app/closed'))).resolves.toBe('closed');
  });

  it('reads an actor the way `corral actor` does', async () => {
    const sent = await s.corral.send('app/status', { text: 'st' });
    await s.corral.waitForTurn(sent.eventId);
    const st = await s.corral.actor('app/status');
    expect(st.actor).toBe('app/status');
    expect(st.known).toBe(true);
    expect(st.recentTurns.map((t) => t.eventId)).toEqual([sent.eventId]);
    expect(st.pendingEvents).toEqual([]);
    await waitFor(async () => (await s.corral.actor('app/status')).activation?.currentEventId === null, { what: 'the turn settled' });
  });
});
