/**
 * The turn path's batched statements (src/db/turns/turn-rows.ts: begin, accept, commit) reach each row
 * they write by its key, whatever the statistics say. The case that matters: the tables were
 * analyzed over a history of finished rows (every activation stopped, every delivery completed),
 * then a burst made thousands of rows live. The statistics then say no row is live, so every
 * partial index on live rows is estimated at one row, and a plan that walks such an index with a
 * filter on the key looks as cheap as the key's own index, while it reads every live row per row
 * written (measured: the commit at 95 ms instead of 5 ms per batch after a few bursts).
 * The statements are captured as they run and explained as a daemon connection plans them
 * (`plan_cache_mode = force_generic_plan`).
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { type DbOrTx } from '../../src/db/client.ts';
import { actorKey } from '../../src/base/actor-key.ts';
import { lockLiveActivation, lockLiveActivationsMany } from '../../src/db/turns/activations.ts';
import { acceptDeliveryRowsMany, beginTurnsMany, commitTurnRowsMany, extendLeasesMany } from '../../src/db/turns/turn-rows.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { genericPlan as planOf, planNodes, statementsOf, type Captured, type PlanNode } from '../helpers/plans.ts';

const genericPlan = (s: Captured): Promise<PlanNode> => planOf(tdb.client, s);

const HISTORY = 200_000;
const LIVE = 3_000;
const BATCH = 50;

const tdb = useTestDatabase();

/** The statement `run` sends first, captured in a transaction that is then rolled back. */
async function firstStatementOf(run: (tx: DbOrTx) => Promise<unknown>): Promise<Captured> {
  let statements: Captured[] = [];
  await tdb.database.db
    .transaction(async (tx) => {
      statements = await statementsOf(() => run(tx));
      throw new Error('rolled back');
    })
    .catch((e: unknown) => {
      if ((e as Error).message !== 'rolled back') throw e;
    });
  expect(statements.length, 'a statement ran').toBeGreaterThan(0);
  return statements[0]!;
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
  // a history of finished turns, analyzed while nothing was live
  await tdb.client.query(`
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
  await tdb.client.query(`
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
    -- and as many warm ones, idle between turns
    insert into corral.activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at, owner_id, status, revision)
      select gen_random_uuid(), 'warm', 's' || g, 1, gen_random_uuid(), now() + interval '1 minute', 'daemon', 'active', 0
        from generate_series(1, ${LIVE}) g;
  `);
  const { rows } = await tdb.client.query<{ delivery_id: string; activation_uid: string }>(
    `select delivery_id, activation_uid from corral.deliveries where agent_uid = 'burst' limit ${BATCH}`,
  );
  live = rows.map((r) => ({ deliveryId: r.delivery_id, activationUid: r.activation_uid }));
}, 180_000);

describe('the turn path after a burst on statistics of a finished history', () => {
  it('the accept reaches deliveries and activations by their keys', async () => {
    const [s] = await statementsOf(() => acceptDeliveryRowsMany(tdb.database.db, live, 60_000));
    const plan = await genericPlan(s!);
    expect(accessOf(plan, 'deliveries'), 'deliveries').toEqual(['deliveries_pkey']);
    expect(accessOf(plan, 'activations'), 'activations').toEqual(['activations_pkey']);
  });

  it('a batch of progress reaches the activations by their keys', async () => {
    const [s] = await statementsOf(() =>
      extendLeasesMany(
        tdb.database.db,
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
    await tdb.database.db
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

  // a begin finds an actor's live activation by the actor key; read through the live rows'
  // partial index instead, each begin cost a walk of every live activation (measured: 8–14 ms
  // per wake with 17,600 live, against 0.2–0.5 ms)
  const begins = (agent: string) =>
    Array.from({ length: BATCH }, (_, i) => ({
      key: actorKey(agent, `s${i + 1}`),
      eventId: crypto.randomUUID(),
      jobRetryCount: 0,
      workerId: 'w',
      input: { text: 'hi' },
    }));
  const opts = { leaseMs: 60_000, ownerId: 'daemon', context: { maxMessages: 20, maxBytes: 65_536 } };

  it('a begin on a warm activation reaches activations by the actor key', async () => {
    const s = await firstStatementOf((tx) => beginTurnsMany(tx, begins('warm'), { ...opts, kind: 'warm' }));
    expect(accessOf(await genericPlan(s), 'activations')).toEqual(['activations_actor_epoch']);
  });

  it('a begin of a new activation looks for a live one by the actor key', async () => {
    const s = await firstStatementOf((tx) => beginTurnsMany(tx, begins('new'), { ...opts, kind: 'new' }));
    expect(accessOf(await genericPlan(s), 'activations')).toEqual(['activations_actor_epoch']);
  });

  it("the locks of an actor's live activation reach it by the actor key", async () => {
    const keys = begins('warm').map((b) => b.key);
    const one = await firstStatementOf((tx) => lockLiveActivation(tx, keys[0]!));
    expect(accessOf(await genericPlan(one), 'activations'), 'one').toEqual(['activations_actor_epoch']);
    const many = await genericPlan(await firstStatementOf((tx) => lockLiveActivationsMany(tx, keys)));
    // a bitmap of the keys' index entries, or a scan of that index per key
    const indexes = new Set(planNodes(many).flatMap((n) => (n['Index Name']?.startsWith('activations_') ? [n['Index Name']] : [])));
    expect([...indexes], 'many').toEqual(['activations_actor_epoch']);
    expect(accessOf(many, 'activations'), 'many').not.toContain('Seq Scan');
  });
});
