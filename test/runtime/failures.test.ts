import { afterEach, describe, expect, it } from 'vitest';
import { sql } from '../../src/db/orm.ts';
import pg from 'pg';
import { actorKey } from '../../src/base/actor-key.ts';
import { retryWindowSeconds } from '../../src/base/backoff.ts';
import { readTranscript } from '../../src/db/turns/transcript.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { RawPeer, type Msg } from '../helpers/raw-peer.ts';
import { waitFor } from '../helpers/wait.ts';
import { sendEvent, sendMany } from '../helpers/send.ts';

type Ref = Record<string, unknown> & { event_id: string; actor_epoch: number; revision: number };

let t: TestDaemon | undefined;
const workers: RawPeer[] = [];
afterEach(async () => {
  for (const w of workers.splice(0)) await w.close();
  await t?.stop();
  t = undefined;
});

async function setup(overrides: Parameters<typeof startTestDaemon>[0] = {}) {
  t = await startTestDaemon(overrides);
  const w = new RawPeer(t.daemon.broker.endpoint, `raw-${workers.length}`);
  workers.push(w);
  await w.register(8);
  return { t, w, db: t.daemon.database.db };
}

const fail = (ref: Ref) => ({ type: 'turn_error', turn_ref: ref, error: { code: 'boom', message: 'handler failed', retryable: true } });
const ok = (ref: Ref, text = 'ok') => ({ type: 'turn_result', turn_ref: ref, messages: [{ role: 'assistant', content: { text } }] });

describe('retries and dead letters', () => {
  it('schedules every retry 5–120 s out (default policy), bumps the epoch per attempt, then dead-letters', async () => {
    const { t, w, db } = await setup({ watchdogIntervalMs: 100_000 });
    expect([t.config.retryDelaySeconds, t.config.retryDelayMaxSeconds, t.config.retryLimit]).toEqual([5, 120, 5]);
    const key = actorKey('retry', 's');
    const { eventId } = await sendEvent(db, key, { text: 'x' });
    const epochs: number[] = [];
    const delays: number[] = [];
    for (let attempt = 1; attempt <= 6; attempt++) {
      const start = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === eventId);
      expect(start.attempt).toBe(attempt);
      const ref = start.turn_ref as Ref;
      epochs.push(ref.actor_epoch);
      await w.send(fail(ref));
      if (attempt === 6) break;
      // the actual scheduled retry time, as pg-boss stored it, against the failure's commit time
      const row = await waitFor(async () => {
        const r = await db.execute<{ state: string; delay: number }>(sql`
          select j.state, extract(epoch from j.start_after - t.finished_at)::float as delay
          from pgboss.job j join corral.turns t on t.event_id = j.id
          where j.id = ${eventId} and t.delivery_id = ${ref.delivery_id} and t.status = 'failed'`);
        return r.rows[0]?.state === 'retry' ? r.rows[0] : undefined;
      });
      delays.push(row.delay);
      const window = retryWindowSeconds(attempt, 5, 120);
      expect(row.delay).toBeGreaterThanOrEqual(window.min - 0.01);
      expect(row.delay).toBeLessThanOrEqual(window.max + 0.01);
      // move time instead of sleeping: make the retry due now and wake the consumer
      await db.execute(sql`update pgboss.job set start_after = now() where id = ${eventId}`);
      t.daemon.consumer.wake();
    }
    expect(delays.every((d) => d >= 5 && d <= 120)).toBe(true);
    for (let i = 1; i < epochs.length; i++) expect(epochs[i]).toBeGreaterThan(epochs[i - 1]!);

    const dl = await waitFor(async () => {
      const r = await db.execute<{
        singleton_key: string;
        data: { payload: unknown };
        source_retry_count: number;
        source_output: unknown;
      }>(sql`
        select singleton_key, data, source_retry_count, source_output from pgboss.job
        where name = ${t.daemon.queues.deadLetter} and source_id = ${eventId}`);
      return r.rows[0];
    });
    expect(dl.singleton_key).toBe('retry/s');
    expect(dl.data.payload).toEqual({ text: 'x' });
    expect(dl.source_retry_count).toBe(5);
    expect(JSON.stringify(dl.source_output)).toContain('handler failed');
    // continue mode: the failed original no longer holds the actor
    const orig = await db.execute(sql`select 1 from pgboss.job where id = ${eventId} and name = ${t.daemon.queues.events}`);
    expect(orig.rows).toHaveLength(0);
  });

  it('dead-letters at once a turn_error that is not retryable, spending no retry', async () => {
    const { t, w, db } = await setup();
    expect(t.config.retryLimit).toBe(5);
    const key = actorKey('final', 's');
    const { eventId } = await sendEvent(db, key, { text: 'x' });
    const start = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === eventId);
    await w.send({
      type: 'turn_error',
      turn_ref: start.turn_ref,
      error: { code: 'invalid_input', message: 'cannot do this', retryable: false },
    });
    const dl = await waitFor(async () => {
      const r = await db.execute<{ source_retry_count: number; source_output: unknown }>(sql`
        select source_retry_count, source_output from pgboss.job where name = ${t.daemon.queues.deadLetter} and source_id = ${eventId}`);
      return r.rows[0];
    });
    expect(dl.source_retry_count).toBe(0);
    expect(JSON.stringify(dl.source_output)).toContain('cannot do this');
    // the original neither waits for a retry nor holds the actor (continue mode)
    const orig = await db.execute(sql`select state from pgboss.job where id = ${eventId} and name = ${t.daemon.queues.events}`);
    expect(orig.rows).toHaveLength(0);
    const turns = await db.execute<{ n: number }>(sql`select count(*)::int as n from corral.turns where event_id = ${eventId}`);
    expect(turns.rows[0]!.n).toBe(1);
  });

  it('continue mode: a dead-lettered event leaves the queue and later events of the actor proceed', async () => {
    const { w, db } = await setup({ retryLimit: 0, deadLetterMode: 'continue' });
    const key = actorKey('dl', 'continue');
    const [bad, good] = await sendMany(db, [
      { key, event: { n: 1 } },
      { key, event: { n: 2 } },
    ]);
    const s1 = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === bad!.eventId);
    await w.send(fail(s1.turn_ref as Ref));
    const s2 = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === good!.eventId);
    await w.send(ok(s2.turn_ref as Ref));
    await w.next('turn_committed');
    const tr = await readTranscript(db, key);
    expect(tr.map((x) => x.eventId)).toEqual([good!.eventId]);
    const actor = await db.execute<{ blocked_by_event_id: string | null }>(
      sql`select blocked_by_event_id from corral.actors where agent_uid = 'dl' and session_id = 'continue'`,
    );
    expect(actor.rows[0]?.blocked_by_event_id ?? null).toBeNull();
  });

  it('block mode: the actor holds behind its dead-lettered event; other actors go on', async () => {
    const { t, w, db } = await setup({ retryLimit: 0, deadLetterMode: 'block' });
    const key = actorKey('dl', 'block');
    const other = actorKey('dl', 'other');
    const [bad, held] = await sendMany(db, [
      { key, event: { n: 1 } },
      { key, event: { n: 2 } },
    ]);
    const s1 = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === bad!.eventId);
    await w.send(fail(s1.turn_ref as Ref));
    await waitFor(async () => {
      const r = await db.execute<{ b: string | null }>(
        sql`select blocked_by_event_id as b from corral.actors where agent_uid = 'dl' and session_id = 'block'`,
      );
      return r.rows[0]?.b === bad!.eventId;
    });
    const o = await sendEvent(db, other, { n: 3 });
    const so = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === o.eventId);
    await w.send(ok(so.turn_ref as Ref));
    await w.next('turn_committed');
    // the held event is never dispatched: an event enqueued after it (another actor) is, so the
    // consumer has passed over the held one
    const later = await sendEvent(db, other, { n: 4 });
    t.daemon.consumer.wake();
    const sl = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === later.eventId);
    await w.send(ok(sl.turn_ref as Ref));
    await w.next('turn_committed');
    expect(w.inbox.some((m: Msg) => m.type === 'turn_start' && (m.turn_ref as Ref).event_id === held!.eventId)).toBe(false);
    const states = await db.execute<{ id: string; state: string }>(
      sql`select id, state from pgboss.job where name = ${t.daemon.queues.events} and singleton_key = 'dl/block' order by id`,
    );
    expect(states.rows).toEqual([
      { id: bad!.eventId, state: 'failed' },
      { id: held!.eventId, state: 'created' },
    ]);
  });
});

describe('leases and the watchdog', () => {
  it('fails an expired in-flight activation; the event is retried under a higher epoch and a late result is rejected', async () => {
    const { t, w, db } = await setup({ retryDelaySeconds: 1, retryDelayMaxSeconds: 1 });
    const key = actorKey('lease', 's');
    const { eventId } = await sendEvent(db, key, { text: 'slow' });
    const first = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === eventId);
    const ref1 = first.turn_ref as Ref;
    await w.send({ type: 'turn_accepted', turn_ref: ref1 });
    await waitFor(async () => {
      const r = await db.execute<{ state: string }>(sql`select state from corral.deliveries where delivery_id = ${ref1.delivery_id}`);
      return r.rows[0]?.state === 'accepted';
    });
    expect((await t.daemon.watchdog.tick()).expired).toBe(0);
    // the worker goes silent; move time instead of sleeping: the lease ran out by PostgreSQL's clock
    await db.execute(
      sql`update corral.activations set lease_expires_at = now() - interval '1 second' where activation_uid = ${ref1.activation_uid}`,
    );
    const report = await t.daemon.watchdog.tick();
    expect(report.expired).toBe(1);
    const act = await db.execute<{ status: string; end_reason: string }>(
      sql`select status, end_reason from corral.activations where activation_uid = ${ref1.activation_uid}`,
    );
    expect(act.rows[0]).toEqual({ status: 'failed', end_reason: 'lease_expired' });
    // the late result of the expired attempt changes nothing
    await w.send(ok(ref1, 'late'));
    expect(['stale_epoch', 'activation_not_live']).toContain((await w.next('turn_rejected')).reason);
    // the retry arrives under a higher epoch and commits
    await db.execute(sql`update pgboss.job set start_after = now() where id = ${eventId}`);
    t.daemon.consumer.wake();
    const second = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === eventId);
    const ref2 = second.turn_ref as Ref;
    expect(ref2.actor_epoch).toBeGreaterThan(ref1.actor_epoch);
    expect(second.attempt).toBe(2);
    await w.send(ok(ref2, 'fresh'));
    await w.next('turn_committed');
    const tr = await readTranscript(db, key);
    expect(tr).toHaveLength(1);
    expect(tr[0]!.actorEpoch).toBe(ref2.actor_epoch);
    expect(tr[0]!.messages[1]!.content).toEqual({ text: 'fresh' });
  });

  it('progress messages keep a healthy long turn alive past its initial lease', async () => {
    const { t, w, db } = await setup({ leaseMs: 2_000, progressIntervalMs: 100 });
    const key = actorKey('lease', 'long');
    const { eventId } = await sendEvent(db, key, { text: 'long' });
    const start = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === eventId);
    const ref = start.turn_ref as Ref;
    await w.send({ type: 'turn_accepted', turn_ref: ref });
    const leaseOf = async () =>
      (
        await db.execute<{ ms: number }>(
          sql`select (extract(epoch from lease_expires_at) * 1000)::float as ms from corral.activations where activation_uid = ${ref.activation_uid}`,
        )
      ).rows[0]!.ms;
    const pgNow = async () => (await db.execute<{ ms: number }>(sql`select (extract(epoch from now()) * 1000)::float as ms`)).rows[0]!.ms;
    // each progress message pushes the lease a full lease past PostgreSQL's now; move time
    // instead of sleeping: before each one, the lease is all but run out (200 ms left)
    let lease = await leaseOf();
    for (let i = 0; i < 4; i++) {
      await db.execute(
        sql`update corral.activations set lease_expires_at = now() + interval '200 milliseconds' where activation_uid = ${ref.activation_uid}`,
      );
      const nearlyOut = await leaseOf();
      await w.send({ type: 'turn_progress', turn_ref: ref });
      lease = await waitFor(async () => {
        const l = await leaseOf();
        return l > nearlyOut ? l : undefined;
      });
      expect(lease - (await pgNow())).toBeGreaterThan(1_000);
    }
    // the lease is still alive
    expect((await t.daemon.watchdog.tick()).expired).toBe(0);
    await w.send(ok(ref));
    await w.next('turn_committed');
    expect(await readTranscript(db, key)).toHaveLength(1);
  });

  it('stops a warm activation idle past the idle timeout', async () => {
    const { t, w, db } = await setup({ idleTimeoutMs: 200 });
    const key = actorKey('idle', 's');
    await sendEvent(db, key, { text: 'x' });
    const start = await w.next('turn_start');
    await w.send(ok(start.turn_ref as Ref));
    await w.next('turn_committed');
    await waitFor(async () => (await t.daemon.watchdog.tick()).stoppedIdle === 1, { what: 'idle stop' });
    const r = await db.execute<{ status: string; end_reason: string }>(
      sql`select status, end_reason from corral.activations where agent_uid = 'idle'`,
    );
    expect(r.rows).toEqual([{ status: 'stopped', end_reason: 'idle' }]);
  });
});

describe('steering and cancellation', () => {
  it('cancel: the worker is told to stop, the turn is recorded cancelled with its user message, a late result is rejected, the actor moves on', async () => {
    const { t, w, db } = await setup();
    const key = actorKey('cancel', 's');
    const [a, b] = await sendMany(db, [
      { key, event: { n: 1 } },
      { key, event: { n: 2 } },
    ]);
    const s1 = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === a!.eventId);
    await t.daemon.cancel(key, 'user pressed stop');
    const cancel = await w.next('turn_cancel');
    expect((cancel.turn_ref as Ref).event_id).toBe(a!.eventId);
    await w.send(ok(s1.turn_ref as Ref, 'late'));
    expect((await w.next('turn_rejected')).reason).toBe('cancelled');
    const turn = await db.execute<{ status: string }>(sql`select status from corral.turns where event_id = ${a!.eventId}`);
    expect(turn.rows).toEqual([{ status: 'cancelled' }]);
    const s2 = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === b!.eventId);
    // the next turn's context holds what the person sent in the cancelled one
    expect(s2.context).toMatchObject({ messages: [{ seq: 1, role: 'user', content: { n: 1 } }], current_seq: 2 });
    await w.send(ok(s2.turn_ref as Ref));
    await w.next('turn_committed');
    const transcript = await readTranscript(db, key);
    expect(transcript.map((x) => [x.eventId, x.status, x.cancelReason])).toEqual([
      [a!.eventId, 'cancelled', 'user pressed stop'],
      [b!.eventId, 'succeeded', undefined],
    ]);
    expect(transcript.map((x) => x.messages.map((m) => [m.seq, m.role, m.content]))).toEqual([
      [[1, 'user', { n: 1 }]],
      [
        [2, 'user', { n: 2 }],
        [3, 'assistant', { text: 'ok' }],
      ],
    ]);
  });
});

describe('recovery', () => {
  it('repairs a started turn whose fence rows are gone: the turn is failed and the event retried under a new epoch', async () => {
    const { t, w, db } = await setup({ retryDelaySeconds: 1, retryDelayMaxSeconds: 1 });
    const key = actorKey('recover', 's');
    const { eventId } = await sendEvent(db, key, { text: 'x' });
    const s1 = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === eventId);
    const ref1 = s1.turn_ref as Ref;
    // lose the runtime projections (as if a process and its rows vanished)
    await db.execute(sql`delete from corral.deliveries where event_id = ${eventId}`);
    await db.execute(sql`delete from corral.activations where activation_uid = ${ref1.activation_uid}`);
    const report = await t.daemon.recovery.tick();
    expect(report).toMatchObject({ repairedTurns: 1, retriedEvents: 1 });
    const turn = await db.execute<{ status: string }>(sql`select status from corral.turns where delivery_id = ${ref1.delivery_id}`);
    expect(turn.rows).toEqual([{ status: 'failed' }]);
    await w.send(ok(ref1, 'late'));
    expect((await w.next('turn_rejected')).reason).toBe('unknown_delivery');
    await db.execute(sql`update pgboss.job set start_after = now() where id = ${eventId}`);
    t.daemon.consumer.wake();
    // the next attempt's turn_start, under a higher epoch: the inbox may also hold a second
    // turn_start of the first attempt (once seen under a loaded CI run: its fence sent again, as a
    // redirect does); a retry under the same epoch never comes, and the wait then times out
    const s2 = await w.next(
      'turn_start',
      (m) => (m.turn_ref as Ref).event_id === eventId && (m.turn_ref as Ref).actor_epoch > ref1.actor_epoch,
    );
    expect((s2.turn_ref as Ref).delivery_id).not.toBe(ref1.delivery_id);
    await w.send(ok(s2.turn_ref as Ref));
    await w.next('turn_committed');
    expect(await readTranscript(db, key)).toHaveLength(1);
  });
});

describe('dispatch', () => {
  it('a failed send marks the delivery send_failed and dispatches the event to another worker', async () => {
    const { t, w: gone, db } = await setup();
    const other = new RawPeer(t.daemon.broker.endpoint, 'raw-other');
    workers.push(other);
    await other.register(1);
    // raw-0's window of 4 turns (it has taken none yet) and raw-other's 1
    await waitFor(() => t.daemon.runtime.workers.freeSlots() === 5, { what: 'both workers registered' });
    // the first worker (more free slots, so the preferred one) disappears without a word
    await gone.close();
    await waitFor(
      async () => (await t.daemon.broker.send('raw-0', { v: 1, type: 'error', code: 'probe', message: 'probe' })).ok === false,
      {
        what: 'route to the closed worker gone',
      },
    );
    const key = actorKey('dispatch', 's');
    const { eventId } = await sendEvent(db, key, { text: 'x' });
    const start = await other.next('turn_start', (m) => (m.turn_ref as Ref).event_id === eventId);
    await other.send(ok(start.turn_ref as Ref));
    await other.next('turn_committed');
    const rows = await db.execute<{ worker_id: string; state: string }>(
      sql`select worker_id, state from corral.deliveries where event_id = ${eventId} order by created_at`,
    );
    expect(rows.rows).toEqual([
      { worker_id: 'raw-0', state: 'send_failed' },
      { worker_id: 'raw-other', state: 'completed' },
    ]);
    expect(await readTranscript(db, key)).toHaveLength(1);
  });
});

describe('graceful stop', () => {
  it('fetches nothing new and lets in-flight turns finish before stopping', async () => {
    const { t: daemon, w, db } = await setup();
    const key = actorKey('drain', 's');
    const [first, second] = await sendMany(db, [
      { key, event: { n: 1 } },
      { key, event: { n: 2 } },
    ]);
    const start = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === first!.eventId);
    const stopped = daemon.daemon.stop({ drainMs: 5_000 });
    expect(daemon.daemon.state).toBe('stopping');
    // the consumer is gone before the first turn ends, so nothing can fetch the second event
    await waitFor(() => !daemon.daemon.supervisor!.children().some((c) => c.name === 'queue-consumer'), { what: 'consumer removed' });
    await w.send(ok(start.turn_ref as Ref));
    await stopped;
    // the daemon's pool is closed now: read with a client of our own
    const pgc = new pg.Client({ connectionString: daemon.db.url });
    await pgc.connect();
    const r = (await pgc.query(`select event_id, status from corral.turns order by started_at`)).rows;
    await pgc.end();
    expect(r).toEqual([{ event_id: first!.eventId, status: 'succeeded' }]);
    expect(w.inbox.some((m) => m.type === 'turn_start' && (m.turn_ref as Ref).event_id === second!.eventId)).toBe(false);
  });
});

describe('job heartbeats', () => {
  it('the daemon touches the pg-boss jobs of its in-flight turns, so pg-boss does not fail them', async () => {
    const { t, w, db } = await setup();
    const { eventId } = await sendEvent(db, actorKey('keeper', 's'), { text: 'x' });
    await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === eventId);
    const heartbeat = async () =>
      (
        await db.execute<{ hb: Date | null; hs: number | null }>(
          sql`select heartbeat_on as hb, heartbeat_seconds as hs from pgboss.job where id = ${eventId}`,
        )
      ).rows[0]!;
    expect((await heartbeat()).hs).toBe(t.config.jobHeartbeatSeconds);
    // move time instead of sleeping: the job was last touched a minute ago
    await db.execute(sql`update pgboss.job set heartbeat_on = now() - interval '1 minute' where id = ${eventId}`);
    const before = await heartbeat();
    expect(await t.daemon.jobKeeper.tick()).toBe(1);
    const after = await heartbeat();
    expect(after.hb).not.toBeNull();
    expect(new Date(after.hb!).getTime()).toBeGreaterThan(new Date(before.hb!).getTime());
  });
});

describe('retention', () => {
  it('deletes completed events past the retention and never a failed one', async () => {
    const { t, w, db } = await setup({ retryLimit: 0, deadLetterMode: 'block', completedRetentionSeconds: 3600 });
    const [done, held] = await sendMany(db, [
      { key: actorKey('ret', 'ok'), event: { n: 1 } },
      { key: actorKey('ret', 'bad'), event: { n: 2 } },
    ]);
    for (let i = 0; i < 2; i++) {
      const s = await w.next('turn_start');
      const ref = s.turn_ref as Ref;
      await w.send(ref.event_id === done!.eventId ? ok(ref) : fail(ref));
    }
    await w.next('turn_committed');
    const state = async (id: string) =>
      (await db.execute<{ state: string }>(sql`select state from pgboss.job where id = ${id} and name = ${t.daemon.queues.events}`)).rows[0]
        ?.state;
    await waitFor(async () => (await state(held!.eventId)) === 'failed', { what: 'held head failed' });
    expect((await t.daemon.retention.tick()).jobs).toBe(0); // too recent
    // move time instead of sleeping: both finished two hours ago
    await db.execute(sql`update pgboss.job set completed_on = now() - interval '2 hours' where id in (${done!.eventId}, ${held!.eventId})`);
    expect((await t.daemon.retention.tick()).jobs).toBe(1);
    expect(await state(done!.eventId)).toBeUndefined();
    expect(await state(held!.eventId)).toBe('failed');
    expect((await readTranscript(db, actorKey('ret', 'ok'))).map((x) => x.eventId)).toEqual([done!.eventId]);
  });
});
