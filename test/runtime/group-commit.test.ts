/**
 * Group commit: results of many turns in one transaction (TurnCommits.commitMany and the
 * runtime's commit pipeline). Valid, stale, duplicate and foreign results mixed in one batch each
 * get their own outcome, checked from the database; a batch never lets a turn stand without its
 * job completed.
 */
import { randomUUID } from 'node:crypto';
import { sql } from '../../src/db/orm.ts';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import type { Fence } from '../../src/db/turns/fence.ts';
import { fromWire } from '../../src/runtime/fence.ts';
import type { CommitRequest } from '../../src/runtime/turn-commit.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { RawPeer, type Msg } from '../helpers/raw-peer.ts';
import { sendMany } from '../helpers/send.ts';

type Ref = Parameters<typeof fromWire>[0];

describe('group commit', () => {
  let t: TestDaemon;
  let worker: RawPeer;
  const db = () => t.daemon.database.db;

  async function state(eventId: string) {
    const r = await db().execute<{ turn: string; messages: number; job_state: string; delivery: string }>(sql`
      select (select status from corral.turns where event_id = ${eventId} order by started_at desc limit 1) as turn,
             (select count(*)::int from corral.messages m join corral.turns t on t.id = m.turn_id where t.event_id = ${eventId}) as messages,
             (select state from pgboss.job where id = ${eventId}) as job_state,
             (select state from corral.deliveries where event_id = ${eventId} order by created_at desc limit 1) as delivery`);
    return r.rows[0]!;
  }

  async function startTurns(prefix: string, n: number): Promise<Ref[]> {
    const events = await sendMany(
      db(),
      Array.from({ length: n }, (_, i) => ({ key: actorKey(`${prefix}-${i}`, 's'), event: { text: `t${i}` } })),
    );
    const ids = new Set(events.map((e) => e.eventId));
    const refs: Ref[] = [];
    while (refs.length < n) {
      const start = await worker.next('turn_start', (m: Msg) => ids.has((m.turn_ref as Ref).event_id));
      refs.push(start.turn_ref as Ref);
    }
    return refs.sort((a, b) => a.event_id.localeCompare(b.event_id));
  }

  const request = (f: Fence, workerId = 'raw-gc'): CommitRequest => ({
    fence: f,
    workerId,
    messages: [{ role: 'assistant', content: { text: `done ${f.eventId}` } }],
  });

  beforeAll(async () => {
    // the raw peers take batches of turns without a word before their results: no window
    t = await startTestDaemon({ workerInitialTurns: 1024 });
    worker = new RawPeer(t.daemon.broker.endpoint, 'raw-gc');
    await worker.register(64); // turns committed straight through the store keep their runtime slots
  });

  afterAll(async () => {
    await worker?.close();
    await t?.stop();
  });

  beforeEach(() => {
    worker.inbox.length = 0;
  });

  it('gives each result of a mixed batch its own outcome, and writes only the valid ones', async () => {
    const [a, b, c, d, e] = (await startTurns('mix', 5)).map(fromWire) as [Fence, Fence, Fence, Fence, Fence];
    const outcomes = await t.daemon.runtime.commits.commitMany([
      request(a),
      request({ ...c, revision: c.revision + 1 }), // stale revision
      request(b),
      request(a), // the same result twice in one batch
      request(d, 'someone-else'), // not the worker the turn was given to
      request({ ...e, deliveryId: randomUUID() }), // unknown delivery
      request({ ...e, actorEpoch: e.actorEpoch + 1 }), // stale epoch
    ]);
    expect(outcomes).toEqual([
      { outcome: 'committed' },
      { outcome: 'rejected', reason: 'stale_revision' },
      { outcome: 'committed' },
      { outcome: 'duplicate' },
      { outcome: 'rejected', reason: 'wrong_worker' },
      { outcome: 'rejected', reason: 'unknown_delivery' },
      { outcome: 'rejected', reason: 'stale_epoch' },
    ]);
    for (const f of [a, b])
      expect(await state(f.eventId)).toEqual({ turn: 'succeeded', messages: 2, job_state: 'completed', delivery: 'completed' });
    const transcript = await db().execute<{ seq: number; role: string; text: string }>(sql`
      select m.seq::int as seq, m.role, m.content->>'text' as text
        from corral.messages m join corral.turns t on t.id = m.turn_id where t.event_id = ${a.eventId} order by m.seq`);
    expect(transcript.rows).toEqual([
      { seq: 1, role: 'user', text: 't0' },
      { seq: 2, role: 'assistant', text: `done ${a.eventId}` },
    ]);
    for (const f of [c, d, e]) expect((await state(f.eventId)).turn).toBe('started');
    for (const f of [c, d, e]) expect((await state(f.eventId)).messages).toBe(0);
    for (const f of [c, d, e]) expect((await state(f.eventId)).job_state).toBe('active');

    // A later batch with the same results: duplicates for the committed, commits for the rest.
    const again = await t.daemon.runtime.commits.commitMany([request(a), request(c), request(d), request(e)]);
    expect(again).toEqual([{ outcome: 'duplicate' }, { outcome: 'committed' }, { outcome: 'committed' }, { outcome: 'committed' }]);
    for (const f of [c, d, e])
      expect(await state(f.eventId)).toEqual({ turn: 'succeeded', messages: 2, job_state: 'completed', delivery: 'completed' });
  });

  it('applies accepts and progress in the same transaction, in arrival order', async () => {
    const [x, y] = (await startTurns('kinds', 2)).map(fromWire) as [Fence, Fence];
    const before = await db().execute<{ lease: Date }>(
      sql`select lease_expires_at as lease from corral.activations where activation_uid = ${x.activationUid}`,
    );
    const outcomes = await t.daemon.runtime.commits.replyMany([
      { kind: 'accept', fence: x, workerId: 'raw-gc' },
      { kind: 'progress', fence: x, workerId: 'raw-gc' },
      { kind: 'accept', fence: y, workerId: 'someone-else' },
      { kind: 'commit', ...request(x) },
      { kind: 'progress', fence: x, workerId: 'raw-gc' }, // the turn is over by now
    ]);
    expect(outcomes.map((o) => o.outcome)).toEqual(['accepted', 'extended', 'rejected', 'committed', 'rejected']);
    expect(outcomes[2]).toEqual({ outcome: 'rejected', reason: 'wrong_worker' });
    expect(outcomes[4]).toEqual({ outcome: 'rejected', reason: 'already_committed' });
    const extended = outcomes[1] as { leaseExpiresAt: Date };
    expect(extended.leaseExpiresAt.getTime()).toBeGreaterThanOrEqual(new Date(before.rows[0]!.lease).getTime());
    expect(await state(x.eventId)).toEqual({ turn: 'succeeded', messages: 2, job_state: 'completed', delivery: 'completed' });
    expect((await state(y.eventId)).delivery).not.toBe('accepted');
  });

  it('begins a batch of warm, new and superseding actors: a statement each for warm and new ones, a transaction for the superseding one', async () => {
    const [w] = (await startTurns('begin-warm', 1)).map(fromWire) as [Fence];
    expect(await t.daemon.runtime.commits.commitMany([request(w)])).toEqual([{ outcome: 'committed' }]);
    const [stale] = (await startTurns('begin-stale', 1)).map(fromWire) as [Fence];
    const job = (agentUid: string, payload: unknown) => ({
      id: randomUUID(),
      retryCount: 0,
      data: { agentUid, sessionId: 's', payload, enqueuedAt: new Date().toISOString() },
    });
    const jobs = [job('begin-warm-0', { x: 1 }), job('begin-new', null), job('begin-stale-0', [1, 2])];
    // the second waits for a worker: its delivery is `created`; the others go out at once: `sent`
    const settled = await t.daemon.runtime.begin.beginMany(jobs.map((j, i) => ({ job: j, workerId: i === 1 ? null : 'raw-gc' })));
    const started = settled.map((s) => (s.ok ? s.value : expect.unreachable(String(s.error))));

    expect(started.map((s) => s.fence.eventId)).toEqual(jobs.map((j) => j.id));
    expect(started[0]!.fence.activationUid).toBe(w.activationUid); // the warm activation, reused
    expect(started[0]!.fence.actorEpoch).toBe(w.actorEpoch);
    expect(started[1]!.fence.actorEpoch).toBe(1);
    expect(started[2]!.fence.actorEpoch).toBe(stale.actorEpoch + 1); // the stale one superseded
    const rows = await db().execute<{
      event_id: string;
      state: string;
      status: string;
      input: unknown;
      input_type: string;
      epoch: number;
    }>(sql`
      select d.event_id, d.state, t.status, t.input, jsonb_typeof(t.input) as input_type, d.actor_epoch::int as epoch
        from corral.deliveries d join corral.turns t using (delivery_id)
       where d.delivery_id in (${sql.join(
         started.map((s) => sql`${s.fence.deliveryId}::uuid`),
         sql`, `,
       )})
       order by d.event_id`);
    const byEvent = new Map(rows.rows.map((r) => [r.event_id, r]));
    expect(started.map((s) => byEvent.get(s.fence.eventId))).toEqual([
      { event_id: jobs[0]!.id, state: 'sent', status: 'started', input: { x: 1 }, input_type: 'object', epoch: w.actorEpoch },
      { event_id: jobs[1]!.id, state: 'created', status: 'started', input: null, input_type: 'null', epoch: 1 },
      { event_id: jobs[2]!.id, state: 'sent', status: 'started', input: [1, 2], input_type: 'array', epoch: stale.actorEpoch + 1 },
    ]);
    expect((await state(stale.eventId)).delivery).toBe('superseded');
    const live = await db().execute<{ n: number }>(sql`
      select count(*)::int as n from corral.activations
       where agent_uid in ('begin-warm-0', 'begin-new', 'begin-stale-0') and status in ('starting', 'active', 'draining')`);
    expect(live.rows[0]!.n).toBe(3); // one live activation per actor (I1)
  });

  it('rejects a reply whose job is no longer active at its attempt (job_not_active), without disturbing the batch', async () => {
    const [a, b] = (await startTurns('jobfence', 2)).map(fromWire) as [Fence, Fence];
    // b's job attempt is no longer the one its delivery holds (pg-boss settled and retried it)
    await db().execute(sql`update pgboss.job set retry_count = retry_count + 1 where id = ${b.eventId}`);
    expect(await t.daemon.runtime.commits.commitMany([request(a), request(b)])).toEqual([
      { outcome: 'committed' },
      { outcome: 'rejected', reason: 'job_not_active' },
    ]);
    expect((await state(a.eventId)).job_state).toBe('completed');
    expect(await state(b.eventId)).toMatchObject({ turn: 'started', job_state: 'active' });
    await db().execute(sql`update pgboss.job set retry_count = retry_count - 1 where id = ${b.eventId}`);
  });

  it('rolls the whole batch back when a job does not settle after its fence held', async () => {
    const [a, b] = (await startTurns('unsettled', 2)).map(fromWire) as [Fence, Fence];
    // pg-boss settles b's job between the fence check and the completion: a trigger on b's turn
    // row (written after the check, before the completion) moves the job's attempt on.
    await db().execute(
      sql.raw(`
      create or replace function pg_temp_settle_b() returns trigger language plpgsql as $$
      begin
        update pgboss.job set retry_count = retry_count + 1 where id = '${b.eventId}';
        return new;
      end $$;
      create trigger settle_b after update on corral.turns
        for each row when (new.delivery_id = '${b.deliveryId}') execute function pg_temp_settle_b();`),
    );
    try {
      await expect(t.daemon.runtime.commits.commitMany([request(a), request(b)])).rejects.toThrow(/did not settle/);
      expect((await state(a.eventId)).turn).toBe('started');
      expect((await state(a.eventId)).job_state).toBe('active');
    } finally {
      await db().execute(sql`drop trigger settle_b on corral.turns; drop function pg_temp_settle_b()`);
    }
  });

  it('commits a burst of results sent at once, answering each worker result', async () => {
    const refs = await startTurns('burst', 12);
    const stale = refs[0]!;
    for (const ref of refs.slice(1)) {
      await worker.send({ type: 'turn_result', turn_ref: ref, messages: [{ role: 'assistant', content: { text: 'ok' } }] });
    }
    await worker.send({ type: 'turn_result', turn_ref: { ...stale, revision: stale.revision + 5 }, messages: [] });
    const committed: Msg[] = [];
    for (const _ of refs.slice(1)) committed.push(await worker.next('turn_committed'));
    const rejected = await worker.next('turn_rejected');
    expect(new Set(committed.map((m) => (m.turn_ref as Ref).event_id))).toEqual(new Set(refs.slice(1).map((r) => r.event_id)));
    expect(rejected.reason).toBe('stale_revision');
    for (const ref of refs.slice(1)) expect((await state(ref.event_id)).job_state).toBe('completed');
    expect((await state(stale.event_id)).job_state).toBe('active');
  });
});
