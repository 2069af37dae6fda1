/**
 * The actor queue's claim keeps a cost that follows the batch, whatever the statistics say
 * (src/db/boss/fetch.ts). The worst case of a week of history: the job table analyzed while
 * nothing was queued (`state` reads `{completed}=1`, every partial index on queued rows is
 * estimated at one row), then a backlog. Under the installed function's planner settings the
 * plan never sorts and never scans the table, and the head lookup probes `job_i10`; the function
 * itself reads about as many index entries as it claims, where a lookup through `job_i11` would
 * read the whole backlog per claimed job.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { DEFAULTS } from '../../src/config.ts';
import { CLAIM_FUNCTION, CLAIM_KEYS_FUNCTION, CLAIM_SIGNATURE, claimStatement, queueTable } from '../../src/db/boss/fetch.ts';
import { loadFenceRowsMany } from '../../src/db/turns/fence.ts';
import { queuesOf } from '../../src/queue/names.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { genericPlan, planNodes, statementsOf, type PlanNode } from '../helpers/plans.ts';

const q = queuesOf(DEFAULTS);
const HISTORY = 200_000;
const BACKLOG = 20_000;
const LIMIT = 50;

const tdb = useTestDatabase();
let table: string;

beforeAll(async () => {
  table = await queueTable(tdb.client, q);
  const t = `${q.schema}.${table}`;
  await tdb.client.query(`
    insert into ${t} (id, name, data, state, policy, singleton_key, created_on, started_on, completed_on)
    select gen_random_uuid(), '${q.events}', '{}'::jsonb, 'completed', 'key_strict_fifo', 'history/s' || g,
           now() - interval '1 day', now() - interval '1 day', now() - interval '1 day'
      from generate_series(1, ${HISTORY}) g`);
  // analyzed with nothing queued, then a backlog of new actors arrives
  await tdb.client.query(`analyze ${t}`);
  await tdb.client.query(`
    insert into ${t} (id, name, data, state, policy, singleton_key)
    select gen_random_uuid(), '${q.events}', '{}'::jsonb, 'created', 'key_strict_fifo', 'backlog/s' || g
      from generate_series(1, ${BACKLOG}) g`);
}, 120_000);

/** Index entries of the job table read so far (pg_stat_user_indexes, flushed). */
async function reads(): Promise<number> {
  await tdb.client.query('select pg_stat_force_next_flush()');
  await tdb.client.query('select pg_stat_clear_snapshot()');
  const { rows } = await tdb.client.query<{ n: string }>(
    `select coalesce(sum(idx_tup_read), 0) as n from pg_stat_user_indexes where schemaname = $1 and relname = $2`,
    [q.schema, table],
  );
  return Number(rows[0]!.n);
}

describe('the claim on statistics that see no queued job', () => {
  it('the statistics are the worst case: state reads {completed} only', async () => {
    const { rows } = await tdb.client.query<{ vals: string }>(
      `select most_common_vals::text as vals from pg_stats where schemaname = $1 and tablename = $2 and attname = 'state'`,
      [q.schema, table],
    );
    expect(rows[0]?.vals).toBe('{completed}');
  });

  it("under the function's settings the generic plan never sorts or scans the table, and heads come from job_i10", async () => {
    const { rows } = await tdb.client.query<{ config: string[] | null }>(
      `select proconfig as config from pg_proc where oid = $1::regprocedure`,
      [CLAIM_SIGNATURE],
    );
    const settings = rows[0]?.config ?? [];
    expect(settings).toEqual(expect.arrayContaining(['enable_sort=off', 'enable_seqscan=off', 'enable_bitmapscan=off']));
    await tdb.client.query('begin');
    try {
      for (const s of settings) {
        const [k, v] = s.split('=');
        await tdb.client.query(`set local ${k} = ${v}`);
      }
      await tdb.client.query('set local plan_cache_mode = force_generic_plan');
      await tdb.client.query(`prepare claim_plan(text, int) as ${claimStatement(q.schema, table)}`);
      const res = await tdb.client.query<{ 'QUERY PLAN': { Plan: PlanNode }[] }>(
        `explain (format json) execute claim_plan('${q.events}', ${LIMIT})`,
      );
      const all = planNodes(res.rows[0]!['QUERY PLAN'][0]!.Plan);
      const kinds = all.map((n) => n['Node Type']);
      expect(kinds, 'no sort').not.toContain('Sort');
      expect(kinds, 'no incremental sort').not.toContain('Incremental Sort');
      expect(
        all.filter((n) => ['Seq Scan', 'Bitmap Heap Scan'].includes(n['Node Type'])).map((n) => n['Relation Name']),
        'no scan of the job table',
      ).toEqual([]);
      const indexes = all.map((n) => n['Index Name']).filter(Boolean);
      expect(indexes, 'the head lookup probes job_i10').toContain(`${table}_i10`);
      expect(indexes, 'the walk in fetch order is job_i11').toContain(`${table}_i11`);
    } finally {
      await tdb.client.query('rollback');
    }
  });

  it('the function claims a full batch reading about as many index entries as it claims, not the backlog', async () => {
    const before = await reads();
    await tdb.client.query('begin');
    let claimed: number;
    try {
      const res = await tdb.client.query(`select * from ${CLAIM_FUNCTION}($1, $2)`, [q.events, LIMIT]);
      claimed = res.rowCount ?? 0;
    } finally {
      await tdb.client.query('rollback');
    }
    const read = (await reads()) - before;
    expect(claimed).toBe(LIMIT);
    // a head lookup through job_i11 would read the backlog once per claimed job: 50 × 20,000
    expect(read, `index entries read for ${LIMIT} claimed jobs`).toBeLessThan(20 * LIMIT);
  });

  it("the claim of named keys' heads (a busy actor's next turn) reads a few index entries per key, not the backlog", async () => {
    // the backlog's keys hold one job each; give some a second, so `more` has something to find
    const t = `${q.schema}.${table}`;
    const keys = Array.from({ length: LIMIT }, (_, i) => `backlog/s${i * 7 + 3}`);
    await tdb.client.query(
      `insert into ${t} (id, name, data, state, policy, singleton_key)
       select gen_random_uuid(), '${q.events}', '{}'::jsonb, 'created', 'key_strict_fifo', k from unnest($1::text[]) as k`,
      [keys.slice(0, 10)],
    );
    const before = await reads();
    await tdb.client.query('begin');
    let rows: { more: boolean }[];
    try {
      rows = (await tdb.client.query<{ more: boolean }>(`select * from ${CLAIM_KEYS_FUNCTION}($1, $2::text[])`, [q.events, keys])).rows;
    } finally {
      await tdb.client.query('rollback');
    }
    const read = (await reads()) - before;
    expect(rows).toHaveLength(LIMIT);
    expect(rows.filter((r) => r.more)).toHaveLength(10);
    expect(read, `index entries read for ${LIMIT} named keys`).toBeLessThan(20 * LIMIT);
  });

  it("a reply's attempt check reaches its job by the key, not through the live jobs' partial index", async () => {
    // on these statistics no job is active: a walk of every live job's index entry would look as
    // cheap as the key's own index (measured: 5 ms per reply after a few bursts on a week of history)
    const [s] = await statementsOf(() => loadFenceRowsMany(tdb.database.db, { schema: q.schema, queue: q.events }, [crypto.randomUUID()]));
    const jobs = planNodes(await genericPlan(tdb.client, s!)).filter(
      (n) => n['Index Name']?.startsWith(`${table}_`) || n['Relation Name'] === table,
    );
    expect(
      jobs.map((n) => n['Index Name'] ?? n['Node Type']),
      'the job table is read by its key',
    ).toEqual([`${table}_pkey`]);
  });

  it("a reject policy's busy check (corral.actor_busy) reads a few index entries, not the backlog", async () => {
    for (const [key, busy] of [
      ['backlog/s7', true],
      ['history/s7', false],
      ['nobody/s7', false],
    ] as const) {
      const before = await reads();
      const { rows } = await tdb.client.query<{ busy: boolean }>('select corral.actor_busy($1) as busy', [key]);
      const read = (await reads()) - before;
      expect(rows[0]!.busy, key).toBe(busy);
      // a lookup through job_i14 or job_i11 would walk the 20,000 queued jobs
      expect(read, `index entries read for ${key}`).toBeLessThan(20);
    }
  });

  it("a coalesce batch (corral.actor_batch) reads its key's entries, not the backlog, and keeps their order", async () => {
    const t = `${q.schema}.${table}`;
    const data = (n: number) =>
      JSON.stringify({ agentUid: 'batch', sessionId: 's1', payload: { n }, enqueuedAt: '2026-01-01T00:00:00.000Z' });
    const ids: string[] = [];
    await tdb.client.query('begin');
    try {
      for (let n = 0; n < 6; n++) {
        const { rows } = await tdb.client.query<{ id: string }>(
          `insert into ${t} (id, name, data, state, policy, singleton_key, created_on)
           values (gen_random_uuid(), $1, $2::jsonb, 'created', 'key_strict_fifo', 'batch/s1', now() + $3 * interval '1 ms') returning id`,
          [q.events, data(n), n],
        );
        ids.push(rows[0]!.id);
      }
      await tdb.client.query(`insert into corral.input_policies (agent_uid, policy, max_events) values ('batch', 'coalesce', 4)`);
      const before = await reads();
      const { rows } = await tdb.client.query<{ batch: { event_id: string; data: { n: number } }[] }>(
        'select corral.actor_batch($1, $2, 0, $3::jsonb, true, 1000000) as batch',
        [q.events, ids[0], data(0)],
      );
      const read = (await reads()) - before;
      expect(
        rows[0]!.batch.map((m) => m.data.n),
        'the next three, in order (max-events 4 with the head)',
      ).toEqual([1, 2, 3]);
      expect(rows[0]!.batch.map((m) => m.event_id)).toEqual(ids.slice(1, 4));
      expect(read, 'index entries read for a batch of four').toBeLessThan(20);
    } finally {
      await tdb.client.query('rollback');
    }
  });
});
