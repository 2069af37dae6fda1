/**
 * Durable effects: a turn_result's `emit` entries are enqueued in the commit transaction, exactly
 * once with the turn, never without it; bounded count and size; delayed events wait.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from '../../src/db/orm.ts';
import { actorKey } from '../../src/base/actor-key.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { RawPeer, type Msg } from '../helpers/raw-peer.ts';
import { corral } from '../cli/helpers.ts';
import { sendEvent } from '../helpers/send.ts';

type Ref = Record<string, unknown> & { event_id: string; delivery_id: string; session_id: string; activation_uid: string };

describe('durable effects', () => {
  let t: TestDaemon;
  let w: RawPeer;
  const db = () => t.daemon.database.db;

  beforeAll(async () => {
    t = await startTestDaemon({ drainMs: 0, maxEventBytes: 1024 });
    w = new RawPeer(t.daemon.broker.endpoint, 'fx-1');
    await w.register(8);
  });

  afterAll(async () => {
    await w.close();
    await t.stop();
  });

  async function start(session: string, data: unknown = { n: 1 }): Promise<Msg> {
    const { eventId } = await sendEvent(db(), actorKey('fx', session), data);
    const s = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === eventId);
    await w.send({ type: 'turn_accepted', turn_ref: s.turn_ref });
    return s;
  }

  const result = (s: Msg, emit?: unknown[]) => ({
    type: 'turn_result',
    turn_ref: s.turn_ref,
    messages: [{ role: 'assistant', content: 'ok' }],
    ...(emit ? { emit } : {}),
  });

  async function jobsFor(session: string) {
    const r = await db().execute<{ id: string; data: { payload: unknown }; delay_ms: number }>(sql`
      select id, data, (extract(epoch from start_after - created_on) * 1000)::int as delay_ms from pgboss.job
       where name = ${t.daemon.queues.events} and singleton_key = ${`fx/${session}`} order by id`);
    return r.rows;
  }

  it('enqueues emitted events with the commit, once, and records them on the turn', async () => {
    const s = await start('src');
    const emit = [
      { actor: 'fx/dst-a', data: { hello: 'a' } },
      { actor: 'fx/dst-b', data: { hello: 'b' } },
    ];
    await w.send(result(s, emit));
    await w.send(result(s, emit)); // a duplicate writes nothing again
    await w.next('turn_committed');
    await w.next('turn_committed');
    const a = await w.next('turn_start', (m) => (m.turn_ref as Ref).session_id === 'dst-a');
    expect((a.event as { data: unknown }).data).toEqual({ hello: 'a' });
    await w.next('turn_start', (m) => (m.turn_ref as Ref).session_id === 'dst-b');
    expect(await jobsFor('dst-a')).toHaveLength(1);
    expect(await jobsFor('dst-b')).toHaveLength(1);
    const turn = await db().execute<{ emitted: { event_id: string; actor: string; data: unknown }[] }>(
      sql`select emitted from corral.turns where event_id = ${(s.turn_ref as Ref).event_id} and status = 'succeeded'`,
    );
    expect(turn.rows[0]!.emitted.map((e) => [e.actor, e.data])).toEqual([
      ['fx/dst-a', { hello: 'a' }],
      ['fx/dst-b', { hello: 'b' }],
    ]);
    expect(turn.rows[0]!.emitted[0]!.event_id).toBe((a.turn_ref as Ref).event_id);
    // operators see what a turn emitted
    const tr = await corral(['transcript', 'fx/src'], t.db.url);
    expect(tr.code).toBe(0);
    expect(tr.stdout).toContain(`emitted → fx/dst-a: {"hello":"a"} (event ${(a.turn_ref as Ref).event_id})`);
    const actor = await corral(['actor', 'fx/src'], t.db.url);
    expect(actor.code).toBe(0);
    expect(actor.stdout).toContain('2 → fx/dst-a, fx/dst-b');
  });

  it('a delayed self-event arrives no earlier than its delay', async () => {
    const s = await start('timer');
    const sentAt = Date.now();
    await w.send(result(s, [{ actor: 'fx/timer', data: { remind: true }, delay_ms: 1500 }]));
    await w.next('turn_committed');
    const [job] = (await jobsFor('timer')).filter((j) => (j.data.payload as { remind?: boolean }).remind);
    expect(job!.delay_ms).toBeGreaterThanOrEqual(1490);
    t.daemon.consumer.wake();
    const next = await w.next('turn_start', (m) => (m.turn_ref as Ref).session_id === 'timer', 20_000);
    expect(Date.now() - sentAt).toBeGreaterThanOrEqual(1500);
    expect((next.event as { data: unknown }).data).toEqual({ remind: true });
  });

  it('rejects a result breaking the limits (emit_limit) and writes nothing of it', async () => {
    const cases: [string, unknown[]][] = [
      ['too-many', Array.from({ length: 33 }, (_, i) => ({ actor: 'fx/x', data: i }))],
      ['bad-actor', [{ actor: 'no-slash', data: 1 }]],
      ['too-big', [{ actor: 'fx/x', data: 'y'.repeat(2000) }]],
      ['bad-delay', [{ actor: 'fx/x', data: 1, delay_ms: -5 }]],
      ['no-data', [{ actor: 'fx/x' }]],
    ];
    for (const [session, emit] of cases) {
      const s = await start(session);
      await w.send(result(s, emit));
      // the accept sent just before may be written after the refusal failed the attempt: it is then
      // refused too (`already_failed`), harmlessly, and that answer can come first
      const rej = await w.next('turn_rejected', (m) => (m.turn_ref as Ref).session_id === session && m.reason !== 'already_failed');
      expect(rej.reason).toBe('emit_limit');
      const turns = await db().execute<{ n: number }>(
        sql`select count(*)::int as n from corral.turns where event_id = ${(s.turn_ref as Ref).event_id} and status = 'succeeded'`,
      );
      expect(turns.rows[0]!.n).toBe(0);
    }
    expect(await jobsFor('x')).toHaveLength(0);
  });

  it('a result that fails its fence enqueues nothing', async () => {
    const s = await start('fenced');
    await db().execute(
      sql`update corral.activations set lease_expires_at = now() - interval '1 second' where activation_uid = ${(s.turn_ref as Ref).activation_uid}`,
    );
    await w.send(result(s, [{ actor: 'fx/never', data: 1 }]));
    expect((await w.next('turn_rejected', (m) => (m.turn_ref as Ref).session_id === 'fenced')).reason).toBe('lease_expired');
    expect(await jobsFor('never')).toHaveLength(0);
  });
});
