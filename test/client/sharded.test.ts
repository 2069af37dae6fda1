/**
 * The client of a deployment of 4 shards (src/client/sharded.ts) against a daemon serving them:
 * `connect()` finds the shards in the catalog; sends, waits, transcripts, live watches and steers
 * go to the actor's shard (K1); `sendMany` splits by shard and keeps the order of its results
 * (K2); an agent's input policy and a sink are written to every shard (K3); tokens are the
 * catalog's (K4); outbox reads are refused (K6).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { actorKey, type ActorKey } from '../../src/base/actor-key.ts';
import { shardOf } from '../../src/base/shard-map.ts';
import { loadConfig } from '../../src/config.ts';
import { connect } from '../../src/client/client.ts';
import type { Corral } from '../../src/client/api.ts';
import { ShardedCorral } from '../../src/client/sharded.ts';
import { migrateShards } from '../../src/ops/shards.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { RawPeer } from '../helpers/raw-peer.ts';
import { answerEveryTurn, type Answering } from '../helpers/answering-peer.ts';

const SHARDS = 4;
const schemaOf = (shard: number) => (shard === 0 ? 'corral' : `corral_s${shard}`);

/** One key of `agent` on each shard. */
function onePerShard(agent: string): ActorKey[] {
  const out: (ActorKey | undefined)[] = Array.from({ length: SHARDS }, () => undefined);
  for (let i = 0; out.some((k) => !k); i++) {
    const key = actorKey(agent, `s-${i}`);
    out[shardOf(key, SHARDS)] ??= key;
  }
  return out as ActorKey[];
}

const text = (k: ActorKey) => `${k.agentUid}/${k.sessionId}`;

describe('the client of a deployment of 4 shards', { timeout: 120_000 }, () => {
  const db = useTestDatabase();
  let t: TestDaemon<typeof db>;
  let w: RawPeer;
  let worker: Answering;
  let corral: Corral;

  beforeAll(async () => {
    await migrateShards(db.url, SHARDS, loadConfig({}, {}));
    t = await startTestDaemon({ drainMs: 0 }, { db });
    w = new RawPeer(t.daemon.broker.endpoint, 'sharded-client-w1');
    await w.register(8);
    worker = answerEveryTurn(w);
    corral = await connect({ databaseUrl: db.url, env: {} });
  });

  afterAll(async () => {
    await corral?.close();
    await worker?.stop();
    await w?.close();
    await t?.stop();
  });

  it('connects as a client of every shard', () => {
    expect(corral).toBeInstanceOf(ShardedCorral);
    expect(corral.databaseUrl).toBe(db.url);
  });

  it('sends to each actor’s shard, waits for its turn there and reads its transcript', async () => {
    for (const key of onePerShard('route')) {
      const sent = await corral.send(text(key), { hello: text(key) });
      const turn = await corral.waitForTurn(sent.eventId, { timeoutMs: 30_000 });
      expect(turn.eventId).toBe(sent.eventId);
      const shard = shardOf(key, SHARDS);
      const job = await db.client.query(`select 1 from ${shard === 0 ? 'pgboss' : `pgboss_s${shard}`}.job where id = $1`, [sent.eventId]);
      expect(job.rowCount, `event on shard ${shard}`).toBe(1);
      const transcript = await corral.transcript(text(key));
      expect(transcript).toHaveLength(1);
      expect((await corral.actor(text(key))).actor).toBe(text(key));
    }
  });

  it('sendMany splits by shard and answers in the events’ order; idempotency keys hold per shard', async () => {
    const keys = onePerShard('many');
    const events = [...keys, ...keys].map((k, i) => ({ actor: text(k), data: { i }, idempotencyKey: `k-${i}` }));
    const sent = await corral.sendMany(events);
    expect(sent).toHaveLength(8);
    expect(sent.every((s) => !s.duplicate)).toBe(true);
    for (const [i, s] of sent.entries()) {
      const shard = shardOf(keys[i % 4]!, SHARDS);
      const r = await db.client.query(`select data from ${shard === 0 ? 'pgboss' : `pgboss_s${shard}`}.job where id = $1`, [s.eventId]);
      expect(r.rows[0]?.data.payload, `event ${i}`).toEqual({ i });
    }
    const again = await corral.sendMany(events);
    expect(again.map((s) => [s.eventId, s.duplicate])).toEqual(sent.map((s) => [s.eventId, true]));
    for (const s of sent) await corral.waitForTurn(s.eventId, { timeoutMs: 30_000 });
  });

  it('a wait for an event no shard has is not_found', async () => {
    await expect(corral.waitForTurn('01890000-0000-7000-8000-0000000000ff', { timeoutMs: 5_000 })).rejects.toMatchObject({
      code: 'not_found',
    });
  });

  it('watches a live actor on another shard than the catalog', { timeout: 30_000 }, async () => {
    const key = onePerShard('live')[3]!;
    const watch = await corral.watchTurns(text(key));
    try {
      const sent = await corral.send(text(key), { watch: true });
      const seen: string[] = [];
      for await (const e of watch) {
        seen.push(e.kind);
        if (e.kind === 'committed' && e.eventId === sent.eventId) break;
      }
      expect(seen).toContain('committed');
    } finally {
      await watch.close();
    }
  });

  it('writes an agent’s input policy and a sink to every shard, one actor’s policy to its own', async () => {
    await corral.setInputPolicy('policy-agent', 'reject');
    for (let s = 0; s < SHARDS; s++) {
      const r = await db.client.query(`select policy from ${schemaOf(s)}.input_policies where agent_uid = 'policy-agent'`);
      expect(
        r.rows.map((x) => x.policy),
        `shard ${s}`,
      ).toEqual(['reject']);
    }
    const one = onePerShard('policy-one')[2]!;
    await corral.setInputPolicy(text(one), 'coalesce');
    const where = [];
    for (let s = 0; s < SHARDS; s++) {
      const r = await db.client.query(`select 1 from ${schemaOf(s)}.input_policies where agent_uid = 'policy-one'`);
      if (r.rowCount) where.push(s);
    }
    expect(where).toEqual([2]);
    expect(await corral.clearInputPolicy('policy-agent')).toBe('reject');
    for (let s = 0; s < SHARDS; s++) {
      const r = await db.client.query(`select 1 from ${schemaOf(s)}.input_policies where agent_uid = 'policy-agent'`);
      expect(r.rowCount, `shard ${s}`).toBe(0);
    }

    const sink = await corral.sinks.add({ name: 'everywhere', url: 'https://hooks.example.com/in' });
    for (let s = 0; s < SHARDS; s++) {
      const r = await db.client.query(`select url from ${schemaOf(s)}.sinks where name = 'everywhere'`);
      expect(r.rows, `shard ${s}`).toEqual([{ url: 'https://hooks.example.com/in' }]);
    }
    expect(sink.secret).toMatch(/^whsec_/);
    await corral.sinks.remove('everywhere');
    for (let s = 0; s < SHARDS; s++) {
      expect((await db.client.query(`select 1 from ${schemaOf(s)}.sinks where name = 'everywhere'`)).rowCount).toBe(0);
    }
  });

  it('keeps tokens in the catalog and refuses outbox reads across shards', async () => {
    const token = await corral.tokens.create({ name: 'sharded', scopes: ['read'] });
    expect(token.token).toMatch(/^crl_/);
    expect((await db.client.query(`select 1 from corral.api_tokens where name = 'sharded'`)).rowCount).toBe(1);
    await expect(corral.outbox.list()).rejects.toMatchObject({ code: 'invalid_argument', message: expect.stringContaining('each shard') });
  });
});
