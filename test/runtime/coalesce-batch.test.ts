/**
 * A batch (input policy `coalesce`, src/db/turns/batches.ts) through the wire, with a raw worker peer
 * answering as the test says: turn_start carries every event in order; a failed attempt is retried
 * with the same batch (B3) though more events arrived meanwhile; a batch that fails every attempt
 * goes to the dead-letter queue whole (B4) and a replay brings its events back in order; late and
 * duplicate replies of a batch fail the fence like any other.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { sql } from '../../src/db/orm.ts';
import { actorKey, type ActorKey } from '../../src/base/actor-key.ts';
import { readTranscript } from '../../src/db/turns/transcript.ts';
import { setInputPolicy } from '../../src/db/enqueue/input-policies.ts';
import { replayDeadLetters } from '../../src/ops/dead-letters.ts';
import { cancelTurn } from '../../src/ops/turn-control.ts';
import { eventStatus } from '../../src/db/turns/event-status.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { RawPeer, type Msg } from '../helpers/raw-peer.ts';
import { waitFor } from '../helpers/wait.ts';
import { sendMany } from '../helpers/send.ts';

type Ref = Record<string, unknown> & { event_id: string; actor_epoch: number; delivery_id: string };
type WireEvent = { id: string; data: { text: string }; enqueued_at: string };

let t: TestDaemon | undefined;
const peers: RawPeer[] = [];
afterEach(async () => {
  for (const p of peers.splice(0)) await p.close();
  await t?.stop();
  t = undefined;
});

async function setup(overrides: Parameters<typeof startTestDaemon>[0] = {}) {
  t = await startTestDaemon({ watchdogIntervalMs: 100_000, ...overrides });
  const w = new RawPeer(t.daemon.broker.endpoint, `raw-${peers.length}`);
  peers.push(w);
  await w.register(8);
  return { t, w, db: t.daemon.database.db };
}

const ok = (ref: unknown, text: string) => ({ type: 'turn_result', turn_ref: ref, messages: [{ role: 'assistant', content: { text } }] });
const fail = (ref: unknown) => ({ type: 'turn_error', turn_ref: ref, error: { code: 'boom', message: 'batch failed', retryable: true } });
const texts = (start: Msg) => ((start.events as WireEvent[] | undefined) ?? [start.event as WireEvent]).map((e) => e.data.text);

async function send(t: TestDaemon, key: ActorKey, ...list: string[]): Promise<string[]> {
  const sent = await sendMany(
    t.daemon.database.db,
    list.map((text) => ({ key, event: { text } })),
  );
  return sent.map((e) => e.eventId);
}

/** Makes the actor's retry due now and wakes the consumer (instead of sleeping through the backoff). */
async function retryNow(t: TestDaemon, eventId: string): Promise<void> {
  const db = t.daemon.database.db;
  await waitFor(async () => {
    const r = await db.execute<{ state: string }>(sql`select state::text as state from pgboss.job where id = ${eventId}`);
    return r.rows[0]?.state === 'retry';
  });
  await db.execute(sql`update pgboss.job set start_after = now() where id = ${eventId}`);
  t.daemon.consumer.wake();
}

describe('a coalesced batch on the wire', { timeout: 60_000 }, () => {
  it('carries every event in order, and a failed attempt is retried with the same batch under a higher epoch', async () => {
    const { t, w, db } = await setup();
    await setInputPolicy(db, 'cb', null, 'coalesce');
    const key = actorKey('cb', 's');
    const [m1] = await send(t, key, 'm1');
    const s1 = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === m1);
    expect(s1.events, 'one event: no events field').toBeUndefined();
    const [m2, m3] = await send(t, key, 'm2', 'm3');
    await w.send(ok(s1.turn_ref, 'r1'));
    const s2 = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === m2);
    expect(texts(s2)).toEqual(['m2', 'm3']);
    expect((s2.events as WireEvent[]).map((e) => e.id)).toEqual([m2, m3]);
    expect((s2.event as WireEvent).id, 'event is the batch head').toBe(m2);
    // m4 comes while the batch runs; the attempt fails
    const [m4] = await send(t, key, 'm4');
    await w.send(fail(s2.turn_ref));
    await w.next('turn_failed', (m) => (m.turn_ref as Ref).delivery_id === (s2.turn_ref as Ref).delivery_id);
    await retryNow(t, m2!);
    const s3 = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === m2 && m.attempt === 2);
    expect(texts(s3), 'the retry takes the batch its first attempt took').toEqual(['m2', 'm3']);
    expect((s3.turn_ref as Ref).actor_epoch).toBeGreaterThan((s2.turn_ref as Ref).actor_epoch);
    // the failed attempt's late result fails its fence; the retry commits
    await w.send(ok(s2.turn_ref, 'late'));
    await w.next('turn_rejected', (m) => (m.turn_ref as Ref).delivery_id === (s2.turn_ref as Ref).delivery_id);
    await w.send(ok(s3.turn_ref, 'r23'));
    await w.send(ok(s3.turn_ref, 'r23'));
    const s4 = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === m4);
    expect(texts(s4)).toEqual(['m4']);
    await w.send(ok(s4.turn_ref, 'r4'));
    await w.next('turn_committed', (m) => (m.turn_ref as Ref).event_id === m4);
    const tr = await readTranscript(db, key);
    expect(tr.map((x) => x.messages.map((m) => (m.content as { text: string }).text))).toEqual([
      ['m1', 'r1'],
      ['m2', 'm3', 'r23'],
      ['m4', 'r4'],
    ]);
    expect(tr.map((x) => x.messages.map((m) => m.seq))).toEqual([
      [1, 2],
      [3, 4, 5],
      [6, 7],
    ]);
    const jobs = await db.execute<{ state: string }>(
      sql`select state::text as state from pgboss.job where id = any(${sql.param([m1, m2, m3, m4])}::uuid[]) order by created_on, id`,
    );
    expect(jobs.rows.map((r) => r.state)).toEqual(['completed', 'completed', 'completed', 'completed']);
    const succeeded = await db.execute<{ n: number }>(
      sql`select count(*)::int as n from corral.turns where status = 'succeeded' and event_id = any(${sql.param([m1, m2, m3, m4])}::uuid[])`,
    );
    expect(succeeded.rows[0]!.n, 'one succeeded turn per batch').toBe(3);
  });

  it('a cancel of a batch cancels every event of it, and keeps what the person sent', async () => {
    const { t, w, db } = await setup();
    await setInputPolicy(db, 'cc', null, 'coalesce');
    const key = actorKey('cc', 's');
    const [m1] = await send(t, key, 'm1');
    const s1 = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === m1);
    const [m2, m3] = await send(t, key, 'm2', 'm3');
    await w.send(ok(s1.turn_ref, 'r1'));
    const s2 = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === m2);
    expect(texts(s2)).toEqual(['m2', 'm3']);
    await cancelTurn({ db, boss: t.daemon.boss, queueName: t.daemon.queues.events }, key, 'enough');
    await w.next('turn_cancel', (m) => (m.turn_ref as Ref).delivery_id === (s2.turn_ref as Ref).delivery_id);
    const [m4] = await send(t, key, 'm4');
    const s4 = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === m4);
    expect(texts(s4), 'the cancelled batch does not come back').toEqual(['m4']);
    await w.send(ok(s4.turn_ref, 'r4'));
    await w.next('turn_committed', (m) => (m.turn_ref as Ref).event_id === m4);
    const tr = await readTranscript(db, key);
    expect(tr.map((x) => [x.status, x.messages.map((m) => (m.content as { text: string }).text)])).toEqual([
      ['succeeded', ['m1', 'r1']],
      ['cancelled', ['m2', 'm3']],
      ['succeeded', ['m4', 'r4']],
    ]);
    for (const id of [m2!, m3!]) expect((await eventStatus(db, t.daemon.queues, id)).state, id).toBe('cancelled');
  });

  it('interrupt on the wire: turn_cancel "interrupted", the late result refused, the next turn_start holds both events at attempt 1', async () => {
    const { t, w, db } = await setup();
    await setInputPolicy(db, 'ci', null, 'interrupt');
    const key = actorKey('ci', 's');
    const [m1] = await send(t, key, 'm1');
    const s1 = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === m1);
    await w.send({ type: 'turn_accepted', turn_ref: s1.turn_ref });
    // the interrupt comes through corral.send_events (the SQL send) like any application's
    await db.execute(sql`select corral.send_event('ci', 's', '{"text": "m2"}'::jsonb)`);
    const cancel = await w.next('turn_cancel', (m) => (m.turn_ref as Ref).delivery_id === (s1.turn_ref as Ref).delivery_id);
    expect(cancel.reason).toBe('interrupted');
    await w.send(ok(s1.turn_ref, 'too late'));
    await w.next('turn_rejected', (m) => (m.turn_ref as Ref).delivery_id === (s1.turn_ref as Ref).delivery_id);
    const s2 = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === m1 && m !== s1);
    expect(texts(s2)).toEqual(['m1', 'm2']);
    expect(s2.attempt, 'the interrupted attempt was not spent').toBe(1);
    expect((s2.turn_ref as Ref).actor_epoch).toBeGreaterThan((s1.turn_ref as Ref).actor_epoch);
    await w.send(ok(s2.turn_ref, 'r12'));
    await w.next('turn_committed', (m) => (m.turn_ref as Ref).delivery_id === (s2.turn_ref as Ref).delivery_id);
    const tr = await readTranscript(db, key);
    expect(tr.map((x) => [x.status, x.messages.map((m) => (m.content as { text: string }).text)])).toEqual([
      ['interrupted', []],
      ['succeeded', ['m1', 'm2', 'r12']],
    ]);
  });

  it('dead-letters a batch that fails every attempt whole, and a replay brings its events back in order', async () => {
    const { t, w, db } = await setup({ retryLimit: 1, deadLetterMode: 'continue' });
    await setInputPolicy(db, 'cd', null, 'coalesce');
    const key = actorKey('cd', 's');
    const [m1] = await send(t, key, 'm1');
    const s1 = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === m1);
    const [m2, m3, m4] = await send(t, key, 'm2', 'm3', 'm4');
    await w.send(ok(s1.turn_ref, 'r1'));
    const a1 = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === m2);
    expect(texts(a1)).toEqual(['m2', 'm3', 'm4']);
    const [m5] = await send(t, key, 'm5');
    await w.send(fail(a1.turn_ref));
    await retryNow(t, m2!);
    const a2 = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === m2 && m.attempt === 2);
    expect(texts(a2)).toEqual(['m2', 'm3', 'm4']);
    await w.send(fail(a2.turn_ref));
    const dead = await w.next('turn_failed', (m) => (m.turn_ref as Ref).delivery_id === (a2.turn_ref as Ref).delivery_id);
    expect(dead.dead_lettered).toBe(true);
    // m5 was not in the batch: it runs on its own once the batch is gone
    const s5 = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === m5);
    expect(texts(s5)).toEqual(['m5']);
    await w.send(ok(s5.turn_ref, 'r5'));
    await w.next('turn_committed', (m) => (m.turn_ref as Ref).event_id === m5);
    const letters = await db.execute<{ id: string; source_id: string }>(
      sql`select id, source_id from pgboss.job where name = ${t.daemon.queues.deadLetter} order by source_id`,
    );
    expect(
      letters.rows.map((r) => r.source_id),
      'every event of the batch is a dead letter',
    ).toEqual([m2, m3, m4]);
    const left = await db.execute<{ n: number }>(
      sql`select count(*)::int as n from pgboss.job where name = ${t.daemon.queues.events} and id = any(${sql.param([m2, m3, m4])}::uuid[])`,
    );
    expect(left.rows[0]!.n, 'none stays in the actor queue').toBe(0);
    // a replay re-sends them with their ids, in order: one batch again
    const results = await replayDeadLetters(
      { db, boss: t.daemon.boss, queues: t.daemon.queues },
      letters.rows.map((r) => r.id),
    );
    expect(results.map((r) => r.outcome)).toEqual(['reinserted', 'reinserted', 'reinserted']);
    const again = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === m2 && m.attempt === 1);
    expect(texts(again)).toEqual(['m2', 'm3', 'm4']);
    await w.send(ok(again.turn_ref, 'r234'));
    await w.next('turn_committed', (m) => (m.turn_ref as Ref).event_id === m2);
    const tr = await readTranscript(db, key);
    expect(tr.map((x) => x.messages.map((m) => (m.content as { text: string }).text))).toEqual([
      ['m1', 'r1'],
      ['m5', 'r5'],
      ['m2', 'm3', 'm4', 'r234'],
    ]);
  });
});
