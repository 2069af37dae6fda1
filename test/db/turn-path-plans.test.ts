/**
 * The turn path's batched statements (src/db/turn-rows.ts: begin, accept, commit) reach each row
 * they write by its key, whatever the statistics say. The case that matters: the tables were
 * analyzed over a history of finished rows (every activation stopped, every delivery completed),
 * then a burst made thousands of rows live. The statistics then say no row is live, so every
 * partial index on live rows is estimated at one row, and a plan that walks such an index with a
 * filter on the key looks as cheap as the key's own index, while it reads every live row per row
 * written (measured: the commit at 95 ms instead of 5 ms per batch after a few bursts).
 * The statements are captured as they run and explained as a daemon connection plans them
 * (`plan_cache_mode = force_generic_plan`).
 */
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openDatabase, type Database } from '../../src/db/client.ts';
import { acceptDeliveryRowsMany, commitTurnRowsMany, extendLeasesMany } from '../../src/db/turn-rows.ts';
import { createTestDatabase, type TestDatabase } from '../helpers/db.ts';
import { planNodes, statementsOf, type Captured, type PlanNode } from '../helpers/plans.ts';

const HISTORY = 200_000;
const LIVE = 3_000;
const BATCH = 50;

let tdb: TestDatabase;
let database: Database;
let c: pg.Client;

async function genericPlan(s: Captured): Promise<PlanNode> {
  await c.query('begin');
  try {
    await c.query('set local plan_cache_mode = force_generic_plan');
    await c.query(`prepare turn_path as ${s.text}`);
    const params = s.values.map((v) =>
      v === null ? 'null' : `'${String(typeof v === 'object' ? JSON.stringify(v) : v).replaceAll("'", "''")}'`,
    );
    const r = await c.query<{ 'QUERY PLAN': { Plan: PlanNode }[] }>(
      `explain (format json) execute turn_path${params.length ? `(${params.join(', ')})` : ''}`,
    );
    return r.rows[0]!['QUERY PLAN'][0]!.Plan;
  } finally {
    await c.query('rollback');
    await c.query('deallocate turn_path').catch(() => undefined);
  }
}

/** The indexes (or scans) a plan reaches `table` through. */
const accessOf = (plan: PlanNode, table: string): string[] =>
  planNodes(plan)
    .filter((n) => n['Relation Name'] === table && n['Node Type'] !== 'ModifyTable')
    .map((n) => n['Index Name'] ?? n['Node Type']);

interface Live {
  deliveryId: string;
  activationUid: string;
}
let live: Live[] = [];

beforeAll(async () => {
  tdb = await createTestDatabase();
  database = openDatabase(tdb.url, { max: 2 });
  c = new pg.Client({ connectionString: tdb.url });
  await c.connect();
  // a history of finished turns, analyzed while nothing was live
  await c.query(`
    insert into corral.conversations (id, agent_uid, session_id)
      select gen_random_uuid(), 'history', 's' || g from generate_series(1, ${HISTORY}) g;
    insert into corral.activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at, owner_id, status, end_reason, ended_at)
      select gen_random_uuid(), 'history', 's' || g, 1, gen_random_uuid(), now() - interval '1 hour', 'gone', 'stopped', 'idle', now() - interval '1 hour'
        from generate_series(1, ${HISTORY}) g;
    insert into corral.deliveries (delivery_id, activation_uid, agent_uid, session_id, actor_epoch, event_id, revision, job_retry_count, worker_id, state)
      select gen_random_uuid(), a.activation_uid, a.agent_uid, a.session_id, 1, gen_random_uuid(), 0, 0, 'w', 'completed' from corral.activations a;
    insert into corral.turns (id, conversation_id, event_id, delivery_id, status, activation_uid, actor_epoch, revision, attempt, finished_at)
      select gen_random_uuid(), v.id, d.event_id, d.delivery_id, 'succeeded', d.activation_uid, 1, 0, 1, now()
        from corral.deliveries d join corral.conversations v using (agent_uid, session_id);
    analyze corral.conversations; analyze corral.activations; analyze corral.deliveries; analyze corral.turns;
  `);
  // then a burst: live activations with a turn in flight each
  await c.query(`
    insert into corral.conversations (id, agent_uid, session_id)
      select gen_random_uuid(), 'burst', 's' || g from generate_series(1, ${LIVE}) g;
    insert into corral.activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at, owner_id, status, current_event_id, revision)
      select gen_random_uuid(), 'burst', 's' || g, 1, gen_random_uuid(), now() + interval '1 minute', 'daemon', 'active', gen_random_uuid(), 0
        from generate_series(1, ${LIVE}) g;
    insert into corral.deliveries (delivery_id, activation_uid, agent_uid, session_id, actor_epoch, event_id, revision, job_retry_count, worker_id, state)
      select gen_random_uuid(), a.activation_uid, a.agent_uid, a.session_id, 1, a.current_event_id, 0, 0, 'w', 'sent'
        from corral.activations a where a.agent_uid = 'burst';
    insert into corral.turns (id, conversation_id, event_id, delivery_id, status, activation_uid, actor_epoch, revision, attempt, input)
      select gen_random_uuid(), v.id, d.event_id, d.delivery_id, 'started', d.activation_uid, 1, 0, 1, '{"text":"hi"}'
        from corral.deliveries d join corral.conversations v using (agent_uid, session_id) where d.agent_uid = 'burst';
  `);
  const { rows } = await c.query<{ delivery_id: string; activation_uid: string }>(
    `select delivery_id, activation_uid from corral.deliveries where agent_uid = 'burst' limit ${BATCH}`,
  );
  live = rows.map((r) => ({ deliveryId: r.delivery_id, activationUid: r.activation_uid }));
}, 180_000);

afterAll(async () => {
  await c?.end();
  await database?.close();
  await tdb?.drop();
});

describe('the turn path after a burst on statistics of a finished history', () => {
  it('the accept reaches deliveries and activations by their keys', async () => {
    const [s] = await statementsOf(() => acceptDeliveryRowsMany(database.db, live, 60_000));
    const plan = await genericPlan(s!);
    expect(accessOf(plan, 'deliveries'), 'deliveries').toEqual(['deliveries_pkey']);
    expect(accessOf(plan, 'activations'), 'activations').toEqual(['activations_pkey']);
  });

  it('a batch of progress reaches the activations by their keys', async () => {
    const [s] = await statementsOf(() =>
      extendLeasesMany(
        database.db,
        live.map((l) => l.activationUid),
        60_000,
      ),
    );
    expect(accessOf(await genericPlan(s!), 'activations')).toEqual(['activations_pkey']);
  });

  it('the commit reaches turns, conversations, deliveries and activations by their keys', async () => {
    const rows = live.map((l) => ({
      ...l,
      revision: 0,
      workerId: 'w',
      output: { text: 'ok' },
      messages: [{ role: 'assistant', content: { text: 'ok' } }],
      leaseMs: 60_000,
    }));
    let statements: Captured[] = [];
    await database.db
      .transaction(async (tx) => {
        statements = await statementsOf(() => commitTurnRowsMany(tx, rows));
        throw new Error('rolled back');
      })
      .catch((e: unknown) => {
        if ((e as Error).message !== 'rolled back') throw e;
      });
    const commit = statements.find((s) => /update corral\.turns/.test(s.text));
    expect(commit, 'the commit statement ran').toBeDefined();
    const plan = await genericPlan(commit!);
    expect(accessOf(plan, 'turns'), 'turns').toEqual(['turns_delivery']);
    expect(accessOf(plan, 'conversations'), 'conversations').toEqual(['conversations_pkey']);
    expect(accessOf(plan, 'deliveries'), 'deliveries').toEqual(['deliveries_pkey']);
    expect(accessOf(plan, 'activations'), 'activations').toEqual(['activations_pkey']);
  });
});
