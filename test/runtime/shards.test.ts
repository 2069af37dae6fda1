/**
 * A daemon serving a deployment of several shards (src/daemon/shard-node.ts,
 * src/runtime/shard-router.ts, src/runtime/shard-relay.ts): 4 shards as schemas on one PostgreSQL,
 * one broker and one worker for all of them; every turn is committed in its actor's shard; an
 * emit chain hops between shards through the outboxes of emits, each event once, in order.
 */
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { actorKey, type ActorKey } from '../../src/base/actor-key.ts';
import { shardOf } from '../../src/base/shard-map.ts';
import { loadConfig } from '../../src/config.ts';
import { migrateShards } from '../../src/ops/shards.ts';
import { rewritingClient, shardSqlRewrite } from '../../src/db/shards/shard-sql.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { RawPeer } from '../helpers/raw-peer.ts';
import { answerEveryTurn, type Answering } from '../helpers/answering-peer.ts';
import { sendEvent } from '../helpers/send.ts';

const SHARDS = 4;

const schemaOf = (shard: number) => (shard === 0 ? 'corral' : `corral_s${shard}`);

/** Keys of `agent`, `perShard` on each shard. */
function keysByShard(agent: string, perShard: number): ActorKey[][] {
  const out: ActorKey[][] = Array.from({ length: SHARDS }, () => []);
  for (let i = 0; out.some((l) => l.length < perShard); i++) {
    const key = actorKey(agent, `s-${i}`);
    const list = out[shardOf(key, SHARDS)]!;
    if (list.length < perShard) list.push(key);
  }
  return out;
}

async function waitFor<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 60_000): Promise<T> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe('a daemon serving 4 shards on one PostgreSQL', { timeout: 180_000 }, () => {
  const db = useTestDatabase();
  let t: TestDaemon<typeof db>;
  let c: pg.Client;
  let w: RawPeer;
  let worker: Answering;

  beforeAll(async () => {
    await migrateShards(db.url, SHARDS, loadConfig({}, {}));
    t = await startTestDaemon({ drainMs: 0 }, { db });
    c = new pg.Client({ connectionString: db.url });
    await c.connect();
    w = new RawPeer(t.daemon.broker.endpoint, 'shards-w1');
    await w.register(16);
    worker = answerEveryTurn(w, (m) => {
      const data = (m.event as { data?: { chain?: string; n?: number; keys?: string[]; last?: number } }).data;
      if (!data?.chain || data.n === undefined || !data.keys || data.last === undefined || data.n >= data.last) return undefined;
      const next = data.keys[(data.n + 1) % data.keys.length]!;
      return [{ actor: next, data: { ...data, n: data.n + 1 } }];
    });
  });

  afterAll(async () => {
    await worker?.stop();
    await w?.close();
    await c?.end();
    await t?.stop();
  });

  const onShard = (shard: number) => rewritingClient(c, shardSqlRewrite(shard, 'pgboss'));

  async function committedOn(shard: number, agent: string): Promise<{ session: string; data: unknown }[]> {
    const r = await c.query<{ session_id: string; input: unknown }>(
      `select cv.session_id, t.input
         from ${schemaOf(shard)}.turns t join ${schemaOf(shard)}.conversations cv on cv.id = t.conversation_id
        where cv.agent_uid = $1 and t.status = 'succeeded' order by t.finished_at, t.event_id`,
      [agent],
    );
    return r.rows.map((row) => ({ session: row.session_id, data: row.input }));
  }

  it('runs each shard’s actors in their own shard, with one broker and one worker', async () => {
    const keys = keysByShard('plain', 3);
    for (const [shard, list] of keys.entries()) for (const key of list) await sendEvent(onShard(shard), key, { hello: shard });
    for (const [shard, list] of keys.entries()) {
      const rows = await waitFor(`shard ${shard}'s turns`, async () => {
        const r = await committedOn(shard, 'plain');
        return r.length === list.length ? r : undefined;
      });
      expect(rows.map((r) => r.session).sort()).toEqual(list.map((k) => k.sessionId).sort());
      expect(rows.every((r) => (r.data as { hello: number }).hello === shard)).toBe(true);
    }
    // the workers' rows and the daemon's are the catalog's (shard 0)
    const workers = await c.query(`select worker_id from corral.workers where worker_id = 'shards-w1'`);
    expect(workers.rows).toHaveLength(1);
  });

  it('an emit chain of 200 events across the 4 shards: each event once, in order per actor', async () => {
    const ring = keysByShard('chain', 2);
    // consecutive links on different shards: 0,1,2,3,0,1,2,3
    const keys = [0, 1].flatMap((i) => ring.map((l) => l[i]!)).map((k) => `${k.agentUid}/${k.sessionId}`);
    const last = 199;
    const first = actorKey('chain', keys[0]!.split('/')[1]!);
    await sendEvent(onShard(shardOf(first, SHARDS)), first, { chain: 'c1', n: 0, keys, last });
    const all = await waitFor('the chain’s last event', async () => {
      const rows = [];
      for (const s of [0, 1, 2, 3]) rows.push(...(await committedOn(s, 'chain')));
      return rows.length >= last + 1 && rows.some((r) => (r.data as { n: number }).n === last) ? rows : undefined;
    });
    const ns = all.map((r) => (r.data as { n: number }).n).sort((a, b) => a - b);
    expect(ns).toEqual(Array.from({ length: last + 1 }, (_, i) => i));
    // each link's events committed in the chain's order, on the link's shard
    for (const [i, key] of keys.entries()) {
      const shard = shardOf(actorKey('chain', key.split('/')[1]!), SHARDS);
      const mine = (await committedOn(shard, 'chain')).filter((r) => `chain/${r.session}` === key).map((r) => (r.data as { n: number }).n);
      expect(mine).toEqual(ns.filter((n) => n % keys.length === i));
    }
    // the outboxes are empty, the inboxes hold what crossed
    for (const s of [0, 1, 2, 3]) {
      expect((await c.query(`select count(*)::int as n from ${schemaOf(s)}.shard_emits`)).rows[0].n).toBe(0);
    }
    let crossed = 0;
    for (const s of [0, 1, 2, 3])
      crossed += (await c.query(`select count(*)::int as n from ${schemaOf(s)}.shard_inbox`)).rows[0].n as number;
    expect(crossed).toBe(last);
  });

  it('a second delivery of cross-shard emits enqueues nothing (the inbox)', async () => {
    const { acceptShardEmits } = await import('../../src/db/shards/shard-emits.ts');
    const target = keysByShard('inbox', 1)[2]![0]!;
    const shardClient = new pg.Client({ connectionString: db.url });
    await shardClient.connect();
    try {
      const on = rewritingClient(shardClient, shardSqlRewrite(2, 'pgboss'));
      const row = {
        targetShard: 2,
        eventId: '01890000-0000-7000-8000-000000000001',
        agentUid: target.agentUid,
        sessionId: target.sessionId,
        data: { agentUid: target.agentUid, sessionId: target.sessionId, payload: { once: true }, enqueuedAt: new Date().toISOString() },
      };
      expect(await acceptShardEmits(on, t.daemon.queues.events, 1, [row])).toBe(1);
      expect(await acceptShardEmits(on, t.daemon.queues.events, 1, [row])).toBe(0);
      const jobs = await c.query(`select count(*)::int as n from pgboss_s2.job where id = $1`, [row.eventId]);
      expect(jobs.rows[0].n).toBe(1);
      await waitFor('the inbox event’s turn', async () => ((await committedOn(2, 'inbox')).length === 1 ? true : undefined));
    } finally {
      await shardClient.end();
    }
  });
});
