import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { sql } from '../../src/db/orm.ts';
import { actorKey } from '../../src/base/actor-key.ts';
import { isUniqueViolation } from '../../src/base/errors.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { RawPeer, type Msg } from '../helpers/raw-peer.ts';
import { waitFor } from '../helpers/wait.ts';
import { sendEvent } from '../helpers/send.ts';

type Ref = Record<string, unknown> & { event_id: string; revision: number; actor_epoch: number };

describe('fenced commit', () => {
  let t: TestDaemon;
  let worker: RawPeer;
  const db = () => t.daemon.database.db;

  async function counts(eventId: string) {
    const r = await db().execute<{ succeeded: number; messages: number; job_state: string }>(sql`
      select (select count(*)::int from corral.turns where event_id = ${eventId} and status = 'succeeded') as succeeded,
             (select count(*)::int from corral.messages m join corral.turns t on t.id = m.turn_id where t.event_id = ${eventId}) as messages,
             (select state from pgboss.job where id = ${eventId}) as job_state`);
    return r.rows[0]!;
  }

  async function startTurn(session: string, payload: unknown = { text: 'hi' }): Promise<{ start: Msg; ref: Ref }> {
    const { eventId } = await sendEvent(db(), actorKey('fence', session), payload);
    const start = await worker.next('turn_start', (m) => (m.turn_ref as Ref).event_id === eventId);
    const ref = start.turn_ref as Ref;
    await worker.send({ type: 'turn_accepted', turn_ref: ref });
    return { start, ref };
  }

  const result = (ref: Ref) => ({
    type: 'turn_result',
    turn_ref: ref,
    messages: [{ role: 'assistant', content: { text: 'done' } }],
  });

  beforeAll(async () => {
    t = await startTestDaemon();
    worker = new RawPeer(t.daemon.broker.endpoint, 'raw-1');
    await worker.register(4);
  });

  afterAll(async () => {
    await worker?.close();
    await t?.stop();
  });

  beforeEach(() => {
    worker.inbox.length = 0;
  });

  it('rejects a result with a stale epoch and changes nothing', async () => {
    const { ref } = await startTurn('epoch');
    await worker.send(result({ ...ref, actor_epoch: ref.actor_epoch + 1 }));
    const rej = await worker.next('turn_rejected');
    expect(rej.reason).toBe('stale_epoch');
    expect(await counts(ref.event_id)).toEqual({ succeeded: 0, messages: 0, job_state: 'active' });
    // the genuine result still commits afterwards
    await worker.send(result(ref));
    await worker.next('turn_committed');
    expect(await counts(ref.event_id)).toEqual({ succeeded: 1, messages: 2, job_state: 'completed' });
  });

  it('rejects progress with a stale revision after the turn was steered', async () => {
    const { ref } = await startTurn('revision');
    const steered = await t.daemon.steer(actorKey('fence', 'revision'), { note: 'be brief' });
    expect(steered.revision).toBe(ref.revision + 1);
    const steer = await worker.next('turn_steer');
    expect((steer.turn_ref as Ref).revision).toBe(ref.revision + 1);
    await worker.send({ type: 'turn_progress', turn_ref: ref });
    expect((await worker.next('turn_rejected')).reason).toBe('stale_revision');
    expect(await counts(ref.event_id)).toEqual({ succeeded: 0, messages: 0, job_state: 'active' });
    await worker.send(result(steer.turn_ref as Ref));
    await worker.next('turn_committed');
    expect(await counts(ref.event_id)).toEqual({ succeeded: 1, messages: 2, job_state: 'completed' });
  });

  it('commits a result that missed a steer and applies the steer as the next event', async () => {
    const { ref } = await startTurn('late-steer');
    await t.daemon.steer(actorKey('fence', 'late-steer'), { note: 'one more thing' });
    await worker.next('turn_steer');
    // the handler had finished before the steer: its result carries the old revision
    await worker.send(result(ref));
    await worker.next('turn_committed', (m) => (m.turn_ref as Ref).event_id === ref.event_id);
    expect(await counts(ref.event_id)).toEqual({ succeeded: 1, messages: 2, job_state: 'completed' });
    const turn = await db().execute<{ revision: number; emitted: { event_id: string; steer_revision: number }[] }>(
      sql`select revision, emitted from corral.turns where event_id = ${ref.event_id} and status = 'succeeded'`,
    );
    expect(turn.rows[0]!.revision).toBe(ref.revision);
    expect(turn.rows[0]!.emitted).toHaveLength(1);
    expect(turn.rows[0]!.emitted[0]!.steer_revision).toBe(ref.revision + 1);
    // the steer's input is the actor's next event
    const next = await worker.next('turn_start', (m) => (m.turn_ref as Ref).session_id === 'late-steer');
    expect((next.event as { data: unknown }).data).toEqual({ note: 'one more thing' });
    expect((next.turn_ref as Ref).event_id).toBe(turn.rows[0]!.emitted[0]!.event_id);
    await worker.send({ type: 'turn_accepted', turn_ref: next.turn_ref });
    await worker.send(result(next.turn_ref as Ref));
    await worker.next('turn_committed', (m) => (m.turn_ref as Ref).event_id === (next.turn_ref as Ref).event_id);
  });

  it('rejects a result after the lease expired and changes nothing', async () => {
    const { ref } = await startTurn('lease');
    // the accept lands first (else it too is answered lease_expired, late, during another test)
    await waitFor(async () => {
      const r = await db().execute<{ state: string }>(sql`select state from corral.deliveries where delivery_id = ${ref.delivery_id}`);
      return r.rows[0]?.state === 'accepted';
    });
    // move time instead of sleeping: the lease ran out a second ago by PostgreSQL's clock
    await db().execute(
      sql`update corral.activations set lease_expires_at = now() - interval '1 second' where activation_uid = ${ref.activation_uid}`,
    );
    await worker.send(result(ref));
    expect((await worker.next('turn_rejected')).reason).toBe('lease_expired');
    expect(await counts(ref.event_id)).toEqual({ succeeded: 0, messages: 0, job_state: 'active' });
  });

  it('commits a replayed result once and answers the replay with turn_committed', async () => {
    const { ref } = await startTurn('replay');
    await worker.send(result(ref));
    await worker.send(result(ref));
    await worker.send(result(ref));
    for (let i = 0; i < 3; i++) await worker.next('turn_committed');
    expect(await counts(ref.event_id)).toEqual({ succeeded: 1, messages: 2, job_state: 'completed' });
    const rejected = worker.inbox.filter((m) => m.type === 'turn_rejected' && (m.turn_ref as Ref).event_id === ref.event_id);
    expect(rejected.map((m) => m.reason)).toEqual([]);
  });

  it('rejects a result that names another session, a made-up delivery, or comes from another worker', async () => {
    const a = await startTurn('cross-a');
    const b = await startTurn('cross-b');
    await worker.send(result({ ...a.ref, session_id: 'cross-b' }));
    expect((await worker.next('turn_rejected')).reason).toBe('wrong_actor');
    await worker.send(result({ ...a.ref, delivery_id: b.ref.delivery_id }));
    expect(['wrong_actor', 'unknown_activation']).toContain((await worker.next('turn_rejected')).reason);
    await worker.send(result({ ...a.ref, delivery_id: '00000000-0000-4000-8000-000000000000' }));
    expect((await worker.next('turn_rejected')).reason).toBe('unknown_delivery');
    const other = new RawPeer(t.daemon.broker.endpoint, 'raw-2');
    try {
      await other.register(1);
      await other.send(result(a.ref));
      expect((await other.next('turn_rejected')).reason).toBe('wrong_worker');
    } finally {
      await other.close();
    }
    expect(await counts(a.ref.event_id)).toEqual({ succeeded: 0, messages: 0, job_state: 'active' });
    expect(await counts(b.ref.event_id)).toEqual({ succeeded: 0, messages: 0, job_state: 'active' });
  });

  it('refuses a second live activation for one actor key (I1), even when two transactions race', async () => {
    const key = actorKey('race', 's');
    const attempt = (epoch: number) =>
      db().transaction(async (tx) => {
        await tx.execute(sql`
          insert into corral.activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at, owner_id, status)
          values (gen_random_uuid(), ${key.agentUid}, ${key.sessionId}, ${epoch}, gen_random_uuid(), now() + interval '1 minute', 'test', 'active')`);
        await tx.execute(sql`select pg_sleep(0.2)`);
      });
    const results = await Promise.allSettled([attempt(101), attempt(102)]);
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    const failure = results.find((r) => r.status === 'rejected') as PromiseRejectedResult;
    expect(isUniqueViolation(failure.reason, 'activations_one_live')).toBe(true);
    const live = await db().execute<{ n: number }>(
      sql`select count(*)::int as n from corral.activations where agent_uid = 'race' and status in ('starting','active','draining')`,
    );
    expect(live.rows[0]!.n).toBe(1);
  });

  it('keeps routing after invalid frames', async () => {
    await worker.sendRaw(Buffer.from([0xff, 0x00, 0x13]));
    await worker.sendRaw('{"v":1,"type":"turn_result"}');
    await worker.sendRaw('not json at all');
    await worker.sendRaw('a', 'b', 'c');
    await worker.send({ type: 'no_such_type' });
    const { ref } = await startTurn('after-garbage');
    await worker.send(result(ref));
    await worker.next('turn_committed');
    expect(await counts(ref.event_id)).toMatchObject({ succeeded: 1 });
  });
});
