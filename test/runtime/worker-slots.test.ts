/**
 * A worker's slot is free again as soon as the worker sends its turn's final message: the next
 * turn goes to it while the reply is still being committed. Only the worker holding the turn,
 * naming the delivery in flight, frees it. Real PostgreSQL, real sockets.
 */
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import pg from 'pg';
import { actorKey } from '../../src/base/actor-key.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { RawPeer, type Msg } from '../helpers/raw-peer.ts';
import { sendEvent } from '../helpers/send.ts';

type Ref = Record<string, unknown> & { event_id: string; delivery_id: string };

describe('worker slots', () => {
  let t: TestDaemon;
  let w: RawPeer;
  let other: RawPeer;
  let locker: pg.Client;

  beforeEach(async () => {
    t = await startTestDaemon({ drainMs: 0 });
    w = new RawPeer(t.daemon.broker.endpoint, 'slot-1');
    await w.register(1);
    other = new RawPeer(t.daemon.broker.endpoint, 'slot-2');
    locker = new pg.Client({ connectionString: t.db.url });
    await locker.connect();
  });

  afterEach(async () => {
    await locker.query('rollback').catch(() => undefined);
    await locker.end();
    await w.close();
    await other.close();
    await t.stop();
  });

  const enqueue = (session: string) => sendEvent(t.daemon.database.db, actorKey('slots', session), { session });
  const startOf = (eventId: string) => (m: Msg) => (m.turn_ref as Ref).event_id === eventId;

  it("frees a capacity-1 worker's slot when its result arrives, before the commit ends", async () => {
    const a = await enqueue('a');
    const first = await w.next('turn_start', startOf(a.eventId));
    const b = await enqueue('b');
    // the only slot is taken, so the consumer fetches nothing: b waits
    expect(t.daemon.runtime.workers.workerOf(a.eventId)).toBe('slot-1');
    expect(t.daemon.runtime.dispatcher.fetchCapacity()).toBe(0);
    expect(w.inbox.filter((m) => m.type === 'turn_start')).toEqual([]);

    // hold the commit of a's turn: its delivery row is locked elsewhere
    const ref = first.turn_ref as Ref;
    await locker.query('begin');
    await locker.query('select 1 from corral.deliveries where delivery_id = $1 for update', [ref.delivery_id]);
    await w.send({ type: 'turn_result', turn_ref: ref, messages: [{ role: 'assistant', content: 'a done' }] });

    // b is dispatched to the same worker while a's commit still waits for the lock
    const second = await w.next('turn_start', startOf(b.eventId));
    const state = await t.daemon.database.pool.query<{ status: string }>('select status from corral.turns where delivery_id = $1', [
      ref.delivery_id,
    ]);
    expect(state.rows[0]!.status).toBe('started');

    await locker.query('rollback');
    await w.next('turn_committed', (m) => (m.turn_ref as Ref).delivery_id === ref.delivery_id);
    await w.send({ type: 'turn_result', turn_ref: second.turn_ref, messages: [] });
    await w.next('turn_committed', (m) => (m.turn_ref as Ref).event_id === b.eventId);
  });

  it('keeps the slot when a result comes from another worker or names another delivery', async () => {
    await other.register(1);
    const a = await enqueue('c');
    // whichever worker got it holds the turn; the other one is idle
    const [holder, idle, start] = await Promise.race([
      w.next('turn_start', startOf(a.eventId)).then((m) => [w, other, m] as const),
      other.next('turn_start', startOf(a.eventId)).then((m) => [other, w, m] as const),
    ]);
    const ref = start.turn_ref as Ref;
    // the idle worker fills its own slot with another turn first
    const c2 = await enqueue('c2');
    await idle.next('turn_start', startOf(c2.eventId));

    // a forged result (the other worker), and one naming another delivery of the event
    const forgedDelivery = '00000000-0000-4000-8000-000000000000';
    await idle.send({ type: 'turn_result', turn_ref: ref, messages: [] });
    await holder.send({ type: 'turn_result', turn_ref: { ...ref, delivery_id: forgedDelivery }, messages: [] });
    // both are answered, so both were handled (a slot is freed on arrival, before the answer): no
    // slot was freed, and the consumer may fetch nothing
    const rejected = (deliveryId: string) => (m: Msg) => (m.turn_ref as Ref).delivery_id === deliveryId;
    await idle.next('turn_rejected', rejected(ref.delivery_id));
    await holder.next('turn_rejected', rejected(forgedDelivery));
    expect(t.daemon.runtime.workers.workerOf(a.eventId)).toBe(holder.id);
    expect(t.daemon.runtime.workers.freeSlots()).toBe(0);
    expect(t.daemon.runtime.dispatcher.fetchCapacity()).toBe(0);
    const d = await enqueue('d');

    // the real result frees the holder's slot: d goes to it
    await holder.send({ type: 'turn_result', turn_ref: ref, messages: [] });
    await holder.next('turn_start', startOf(d.eventId));
  });
});
