/**
 * Pruning of the runtime projections (src/db/operations/runtime-pruning.ts, rules P1–P3): finished
 * deliveries and ended activations older than the window go; what a live turn, recovery or
 * `corral actor` needs stays; the transcript is untouched; a late result of a pruned delivery is
 * refused as any stale reply.
 */
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { pruneActivations, pruneDeliveries } from '../../src/db/operations/runtime-pruning.ts';
import { pruneRuntimeRows } from '../../src/queue/retention.ts';
import { useTestDatabase } from '../helpers/db.ts';

const DAY = 86_400;
const tdb = useTestDatabase();

/** An activation of `session` at `epoch`, its delivery and its turn, `agedDays` old. */
async function history(
  session: string,
  epoch: number,
  opts: { activation: string; delivery: string; turn: string; agedDays: number },
): Promise<{ activation: string; delivery: string }> {
  const r = await tdb.client.query<{ activation_uid: string; delivery_id: string }>(
    `with conv as (
       insert into corral.conversations (id, agent_uid, session_id) values (gen_random_uuid(), 'prune', $1)
       on conflict (agent_uid, session_id) do update set updated_at = now() returning id
     ), a as (
       insert into corral.activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at, owner_id,
                                       status, end_reason, updated_at, ended_at)
       values (gen_random_uuid(), 'prune', $1, $2, gen_random_uuid(), now(), 'daemon', $3,
               case when $3 = 'active' then null else 'idle' end, now() - $6 * interval '1 day',
               case when $3 = 'active' then null else now() - $6 * interval '1 day' end)
       returning activation_uid
     ), d as (
       insert into corral.deliveries (delivery_id, activation_uid, agent_uid, session_id, actor_epoch, event_id, revision, job_retry_count,
                                      state, updated_at)
       select gen_random_uuid(), a.activation_uid, 'prune', $1, $2, gen_random_uuid(), 0, 0, $4, now() - $6 * interval '1 day' from a
       returning delivery_id, activation_uid, event_id
     ), t as (
       insert into corral.turns (id, conversation_id, event_id, delivery_id, status, activation_uid, actor_epoch, revision, attempt)
       select gen_random_uuid(), conv.id, d.event_id, d.delivery_id, $5, d.activation_uid, $2, 0, 1 from d, conv
     )
     select activation_uid, delivery_id from d`,
    [session, epoch, opts.activation, opts.delivery, opts.turn, opts.agedDays],
  );
  return { activation: r.rows[0]!.activation_uid, delivery: r.rows[0]!.delivery_id };
}

const exists = async (table: 'deliveries' | 'activations', column: string, id: string) =>
  ((await tdb.client.query(`select 1 from corral.${table} where ${column} = $1`, [id])).rowCount ?? 0) === 1;

describe('pruning runtime rows', () => {
  it('deletes finished deliveries and ended activations past the window, keeps what is live, recent, started or latest', async () => {
    // actor "old": three epochs, two of them old; the latest (epoch 3) must stay though old
    const old1 = await history('old', 1, { activation: 'stopped', delivery: 'completed', turn: 'succeeded', agedDays: 3 });
    const old2 = await history('old', 2, { activation: 'failed', delivery: 'failed', turn: 'failed', agedDays: 3 });
    const latest = await history('old', 3, { activation: 'stopped', delivery: 'completed', turn: 'succeeded', agedDays: 3 });
    // recent: inside the window
    const recentPrev = await history('recent', 1, { activation: 'stopped', delivery: 'completed', turn: 'succeeded', agedDays: 0 });
    await history('recent', 2, { activation: 'stopped', delivery: 'completed', turn: 'succeeded', agedDays: 0 });
    // a started turn whose delivery failed long ago: recovery still repairs it through the delivery
    const orphan = await history('orphan', 1, { activation: 'failed', delivery: 'failed', turn: 'started', agedDays: 3 });
    await history('orphan', 2, { activation: 'stopped', delivery: 'completed', turn: 'succeeded', agedDays: 3 });
    // a live turn, with an old lease: nothing of it is finished
    const live = await history('live', 1, { activation: 'active', delivery: 'accepted', turn: 'started', agedDays: 3 });
    const turnsBefore = (await tdb.client.query('select count(*)::int as n from corral.turns')).rows[0] as { n: number };

    const pruned = await pruneRuntimeRows({ db: tdb.database.db, runtimeRetentionSeconds: DAY, batchSize: 2 });
    // deliveries: old1, old2, latest, orphan's epoch 2 (4); activations: old1, old2 (2)
    expect(pruned).toBe(6);

    for (const gone of [old1, old2]) {
      expect(await exists('deliveries', 'delivery_id', gone.delivery)).toBe(false);
      expect(await exists('activations', 'activation_uid', gone.activation)).toBe(false);
    }
    expect(await exists('deliveries', 'delivery_id', latest.delivery)).toBe(false);
    expect(await exists('activations', 'activation_uid', latest.activation)).toBe(true); // the actor's latest
    expect(await exists('deliveries', 'delivery_id', recentPrev.delivery)).toBe(true);
    expect(await exists('activations', 'activation_uid', recentPrev.activation)).toBe(true);
    expect(await exists('deliveries', 'delivery_id', orphan.delivery)).toBe(true); // its turn is still started
    expect(await exists('activations', 'activation_uid', orphan.activation)).toBe(true); // its delivery stays
    expect(await exists('deliveries', 'delivery_id', live.delivery)).toBe(true);
    expect(await exists('activations', 'activation_uid', live.activation)).toBe(true);
    // the transcript is untouched
    expect((await tdb.client.query('select count(*)::int as n from corral.turns')).rows[0]).toEqual(turnsBefore);

    // a second pass has nothing left to do; a window of 0 keeps everything
    expect(await pruneDeliveries(tdb.database.db, DAY, 100)).toBe(0);
    expect(await pruneActivations(tdb.database.db, DAY, 100)).toBe(0);
    expect(await pruneRuntimeRows({ db: tdb.database.db, runtimeRetentionSeconds: 0 })).toBe(0);
  });

  it('skips rows another transaction holds, and gets them on the next pass', async () => {
    const held = await history('held', 1, { activation: 'stopped', delivery: 'completed', turn: 'succeeded', agedDays: 3 });
    await history('held', 2, { activation: 'stopped', delivery: 'completed', turn: 'succeeded', agedDays: 0 });
    const other = new pg.Client({ connectionString: tdb.url });
    await other.connect();
    try {
      await other.query('begin');
      await other.query('select 1 from corral.deliveries where delivery_id = $1 for update', [held.delivery]);
      expect(await pruneDeliveries(tdb.database.db, DAY, 100)).toBe(0);
      await other.query('commit');
      expect(await pruneDeliveries(tdb.database.db, DAY, 100)).toBe(1);
      expect(await pruneActivations(tdb.database.db, DAY, 100)).toBe(1);
    } finally {
      await other.end();
    }
  });
});
