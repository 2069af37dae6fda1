/**
 * The daemon's periodic statements (watchdog, recovery, retention, pruning) keep their cost to what is live, not to
 * history: on tables holding 200,000 finished rows each (and as many completed jobs, idempotency keys, messages and
 * conversations), right after ANALYZE, the plan every
 * statement gets on a daemon connection (`plan_cache_mode = force_generic_plan`, src/db/client.ts)
 * reads no big table sequentially. The statements are captured as they run (text and values),
 * then prepared and explained on a connection of the same setting.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { listExpiredInFlight, stopIdleActivations } from '../../src/db/turns/activations.ts';
import { unacceptedDeliveriesOf } from '../../src/db/turns/deliveries.ts';
import { completedJobsOlderThan, unsettledFailedJobs } from '../../src/db/boss/jobs.ts';
import { pruneIdempotencyKeys } from '../../src/db/enqueue/idempotency.ts';
import { liveApiTokenNames, pruneExpiredApiTokens } from '../../src/db/operations/api-tokens.ts';
import { claimOutbox, nextOutboxDueMs, pruneOutbox } from '../../src/db/outbox/messages.ts';
import { pruneActivations, pruneDeliveries } from '../../src/db/operations/runtime-pruning.ts';
import { orphanedStartedTurns } from '../../src/db/turns/transcript.ts';
import { pruneTranscripts } from '../../src/db/operations/transcript-retention.ts';
import { DEFAULTS } from '../../src/config.ts';
import { queuesOf } from '../../src/queue/names.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { planNodes, statementsOf, type Captured, type PlanNode } from '../helpers/plans.ts';

const HISTORY = 200_000;
const BIG_TABLES = new Set([
  'activations',
  'turns',
  'deliveries',
  'job',
  'job_common',
  'idempotency_keys',
  'conversations',
  'messages',
  'outbox',
  'api_tokens',
]);

const tdb = useTestDatabase();

const seqScansOf = (plan: PlanNode): string[] =>
  planNodes(plan).flatMap((n) => (n['Node Type'] === 'Seq Scan' && n['Relation Name'] ? [n['Relation Name']] : []));

/** The generic plan of `s`, as a daemon connection would run it. */
async function genericPlan(s: Captured, n: number): Promise<PlanNode> {
  const name = `periodic_${n}`;
  await tdb.client.query(`prepare ${name} as ${s.text}`);
  try {
    const literal = (v: unknown): string =>
      Array.isArray(v) ? `{${v.map((x) => `"${String(x).replaceAll('"', '\\"')}"`).join(',')}}` : String(v);
    const params = s.values.map((v) => (v === null ? 'null' : `'${literal(v).replaceAll("'", "''")}'`)).join(', ');
    const r = await tdb.client.query<{ 'QUERY PLAN': { Plan: PlanNode }[] }>(
      `explain (format json) execute ${name}${s.values.length ? `(${params})` : ''}`,
    );
    return r.rows[0]!['QUERY PLAN'][0]!.Plan;
  } finally {
    await tdb.client.query(`deallocate ${name}`);
  }
}

async function expectNoSequentialScans(what: string, fn: () => Promise<unknown>): Promise<void> {
  const statements = await statementsOf(fn);
  expect(statements.length, `${what} ran no statement`).toBeGreaterThan(0);
  for (const [i, s] of statements.entries()) {
    const scans = seqScansOf(await genericPlan(s, i)).filter((r) => BIG_TABLES.has(r));
    expect(scans, `${what}: a sequential scan of ${scans.join(', ')} in\n${s.text}`).toEqual([]);
  }
}

beforeAll(async () => {
  // the file's client explains the statements, planning them as a daemon connection does
  await tdb.client.query('set plan_cache_mode = force_generic_plan');
  // history: finished activations, deliveries and turns of 200,000 events; a few live ones
  await tdb.client.query(`
    insert into corral.conversations (id, agent_uid, session_id) values ('00000000-0000-4000-8000-000000000001', 'history', 's');
    insert into corral.activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at, owner_id, status, end_reason, updated_at)
      select gen_random_uuid(), 'history', 's' || g, 1, gen_random_uuid(), now() - interval '1 day', 'gone-daemon', 'stopped', 'idle', now() - interval '1 day'
        from generate_series(1, ${HISTORY}) g;
    insert into corral.activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at, owner_id, status, current_event_id)
      select gen_random_uuid(), 'live', 's' || g, 1, gen_random_uuid(), now() + interval '1 minute', 'daemon', 'active',
             case when g % 2 = 0 then gen_random_uuid() end
        from generate_series(1, 5) g;
    insert into corral.deliveries (delivery_id, activation_uid, agent_uid, session_id, actor_epoch, event_id, revision, job_retry_count, worker_id, state)
      select gen_random_uuid(), a.activation_uid, a.agent_uid, a.session_id, 1, gen_random_uuid(), 0, 0, 'gone-worker', 'completed'
        from corral.activations a where a.agent_uid = 'history';
    insert into corral.turns (id, conversation_id, event_id, delivery_id, status, activation_uid, actor_epoch, revision, attempt, finished_at)
      select gen_random_uuid(), '00000000-0000-4000-8000-000000000001', d.event_id, d.delivery_id, 'succeeded', d.activation_uid, 1, 0, 1, now()
        from corral.deliveries d;
    insert into corral.messages (conversation_id, turn_id, seq, role, content)
      select t.conversation_id, t.id, row_number() over (order by t.id), 'user', '{}'::jsonb from corral.turns t;
    update corral.conversations set next_seq = ${HISTORY} + 1 where agent_uid = 'history';
    -- the conversations of many other agents' sessions; transcript retention for 'history' (2 days) and a small agent
    insert into corral.conversations (id, agent_uid, session_id)
      select gen_random_uuid(), 'crowd-' || (g % 1000), 's' || g from generate_series(1, ${HISTORY}) g;
    insert into corral.transcript_retention (agent_uid, keep_seconds) values ('history', 2 * 86400), ('crowd-7', 86400);
    insert into pgboss.job (id, name, data, state, policy, singleton_key, completed_on, created_on)
      select gen_random_uuid(), 'actor-events', '{}'::jsonb, 'completed', 'key_strict_fifo', 'history/s' || g, now() - interval '1 day', now() - interval '1 day'
        from generate_series(1, ${HISTORY}) g;
    insert into corral.idempotency_keys (agent_uid, session_id, key, event_id, data_sha256, created_at)
      select 'history', 's' || g, 'k', gen_random_uuid(), repeat('0', 64), now() - interval '1 day'
        from generate_series(1, ${HISTORY}) g;
    -- an outbox that delivered a message for each of them (an hour ago), and a few pending
    insert into corral.sinks (name, url, secret) values ('hooks', 'http://127.0.0.1:9/', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw');
    insert into corral.outbox (sink, webhook_id, agent_uid, session_id, turn_id, event_id, position, body, state, attempts, delivered_at, updated_at, created_at)
      select 'hooks', 'm' || g, 'history', 's' || g, gen_random_uuid(), gen_random_uuid(), 0, '{}', 'delivered', 1,
             now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour'
        from generate_series(1, ${HISTORY}) g;
    insert into corral.outbox (sink, webhook_id, agent_uid, session_id, turn_id, event_id, position, body, next_attempt_at)
      select 'hooks', 'p' || g, 'live', 's' || (g % 3), gen_random_uuid(), gen_random_uuid(), 0, '{}', now() + interval '1 minute'
        from generate_series(1, 10) g;
    -- short-lived tokens a backend minted per conversation, none expired yet, and a few that never expire
    insert into corral.api_tokens (name, token_sha256, scopes, actors, expires_at)
      select 'chat-' || g, md5(g::text) || md5((g + 1)::text), array['read', 'send'], array['chat/s' || g], now() + interval '1 hour'
        from generate_series(1, ${HISTORY}) g;
    insert into corral.api_tokens (name, token_sha256, scopes)
      select 'server-' || g, md5((-g)::text) || md5((-g - 1)::text), array['read'] from generate_series(1, 5) g;
    analyze corral.api_tokens;
    analyze corral.outbox;
    analyze pgboss.job_common;
    analyze corral.idempotency_keys;
    analyze corral.activations;
    analyze corral.deliveries;
    analyze corral.turns;
    analyze corral.messages;
    analyze corral.conversations;
    analyze corral.transcript_retention;
  `);
}, 120_000);

describe('periodic statements on a history of 200,000 finished turns, right after ANALYZE', () => {
  it('the watchdog lists expired leases without reading the history', async () => {
    await expectNoSequentialScans('listExpiredInFlight', () => listExpiredInFlight(tdb.database.db));
  });

  it("the HTTP API's check of its open streams' tokens reads them by name, not every token", async () => {
    const names = Array.from({ length: 64 }, (_, i) => `chat-${i * 997 + 1}`);
    await expectNoSequentialScans('liveApiTokenNames', () => liveApiTokenNames(tdb.database.db, names));
    expect((await liveApiTokenNames(tdb.database.db, [...names, 'no-such-token'])).size).toBe(64);
  });

  it('the watchdog stops idle activations without reading the history', async () => {
    await expectNoSequentialScans('stopIdleActivations', () => stopIdleActivations(tdb.database.db, 300_000, 100));
  });

  it("the watchdog lists a stale worker's unaccepted deliveries without reading its history", async () => {
    await expectNoSequentialScans('unacceptedDeliveriesOf', () => unacceptedDeliveriesOf(tdb.database.db, 'gone-worker'));
  });

  it('the retention sweep finds nothing due (every completed job a day old) without reading the job table', async () => {
    const retention = DEFAULTS.completedRetentionSeconds;
    await expectNoSequentialScans('completedJobsOlderThan', () =>
      completedJobsOlderThan(tdb.database.db, 'pgboss', 'actor-events', retention, 1000),
    );
    await expectNoSequentialScans('pruneExpiredApiTokens', () => pruneExpiredApiTokens(tdb.database.db, retention, 1000));
    await expectNoSequentialScans('pruneIdempotencyKeys', () => pruneIdempotencyKeys(tdb.database.db, queuesOf(DEFAULTS), retention, 1000));
  });

  it('the pruning of runtime rows finds nothing due (every row younger than its window) without reading the tables', async () => {
    await expectNoSequentialScans('pruneDeliveries', () => pruneDeliveries(tdb.database.db, 2 * 86_400, 1000));
    await expectNoSequentialScans('pruneActivations', () => pruneActivations(tdb.database.db, 2 * 86_400, 1000));
  });

  it("transcript retention finds nothing due (every turn younger than its agent's window) without reading the tables", async () => {
    await expectNoSequentialScans('pruneTranscripts', () => pruneTranscripts(tdb.database.db));
  });

  it('the outbox claims, finds its next due message and prunes (nothing due) without reading what it delivered', async () => {
    await expectNoSequentialScans('claimOutbox', () => claimOutbox(tdb.database.db, { owner: 'd', limit: 64, free: {}, graceMs: 5000 }));
    await expectNoSequentialScans('nextOutboxDueMs', () => nextOutboxDueMs(tdb.database.db));
    await expectNoSequentialScans('pruneOutbox', () => pruneOutbox(tdb.database.db, DEFAULTS.completedRetentionSeconds, 1000));
    expect(await claimOutbox(tdb.database.db, { owner: 'd', limit: 64, free: {}, graceMs: 5000 }), 'none is due yet').toEqual([]);
  });

  it('recovery finds orphaned started turns without reading the history', async () => {
    await expectNoSequentialScans('orphanedStartedTurns', () => orphanedStartedTurns(tdb.database.db, 1000));
  });

  it('recovery finds the dead letters pg-boss made by itself without reading the history', async () => {
    await expectNoSequentialScans('unsettledFailedJobs', () => unsettledFailedJobs(tdb.database.db, 'pgboss', 'actor-events', 1000));
    expect(await unsettledFailedJobs(tdb.database.db, 'pgboss', 'actor-events', 1000), 'none in a history of completed jobs').toEqual([]);
  });

  // last: it adds live rows the other statements would see
  it('the idle stop reads the activations idle long enough, not every warm one', async () => {
    await tdb.client.query(`
      insert into corral.activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at, owner_id, status)
        select gen_random_uuid(), 'warm', 's' || g, 1, gen_random_uuid(), now() + interval '1 minute', 'daemon', 'active'
          from generate_series(1, 20000) g;
      analyze corral.activations;
    `);
    const statements = await statementsOf(() => stopIdleActivations(tdb.database.db, 300_000, 100));
    const indexes = new Set<string>();
    for (const [i, s] of statements.entries())
      for (const n of planNodes(await genericPlan(s, i))) if (n['Index Name']?.startsWith('activations_')) indexes.add(n['Index Name']);
    expect([...indexes], 'through the idle index only').toEqual(['activations_idle']);
    expect(await stopIdleActivations(tdb.database.db, 300_000, 100), 'nothing due among 20,000 warm activations').toBe(0);
  });
});
