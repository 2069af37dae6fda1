/**
 * The protocol points a worker written from docs/protocol.md alone relies on: a restarted worker
 * gets its turns back at once, an accepted turn_error is answered, the welcome tells the timings.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { sql } from '../../src/db/orm.ts';
import { actorKey } from '../../src/base/actor-key.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { RawPeer } from '../helpers/raw-peer.ts';
import { waitFor } from '../helpers/wait.ts';
import type { Config } from '../../src/config.ts';
import { sendEvent } from '../helpers/send.ts';

type Ref = Record<string, unknown> & { event_id: string; delivery_id: string; revision: number };

describe('worker protocol', () => {
  let t: TestDaemon | undefined;
  const workers: RawPeer[] = [];

  afterEach(async () => {
    for (const w of workers.splice(0)) await w.close();
    await t?.stop();
    t = undefined;
  });

  async function setup(overrides: Partial<Config> = {}) {
    t = await startTestDaemon({ leaseMs: 60_000, drainMs: 0, ...overrides });
    const w = new RawPeer(t.daemon.broker.endpoint, 'wp-1-a', undefined, 'wp-1');
    workers.push(w);
    return { t, w, db: t.daemon.database.db };
  }

  it('the welcome tells lease, stale timeout and retry policy', async () => {
    const { t, w } = await setup({ retryLimit: 3, retryDelaySeconds: 2, retryDelayMaxSeconds: 60 });
    const welcome = await w.register(1);
    expect(welcome).toMatchObject({
      heartbeat_interval_ms: t.config.workerHeartbeatMs,
      progress_interval_ms: t.config.progressIntervalMs,
      lease_ms: 60_000,
      stale_ms: t.config.workerStaleMs,
      retry: { limit: 3, delay_s: 2, delay_max_s: 60, backoff: true },
    });
    expect(t.config.progressIntervalMs).toBe(10_000);
  });

  it('re-dispatches the turns of a restarted worker at once, to itself when it is the only worker, spending no attempt', async () => {
    const { t, w, db } = await setup();
    await w.register(1, { instance: 'run-1' });
    const { eventId } = await sendEvent(db, actorKey('restart', 's'), { text: 'x' });
    const first = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === eventId);
    await w.send({ type: 'turn_accepted', turn_ref: first.turn_ref });
    await w.close();
    // the process restarted: a new connection, same worker id, a new instance
    const again = new RawPeer(t.daemon.broker.endpoint, 'wp-1-b', undefined, 'wp-1');
    workers.push(again);
    const startedAt = Date.now();
    await again.register(1, { instance: 'run-2' });
    const second = await again.next('turn_start', (m) => (m.turn_ref as Ref).event_id === eventId, 10_000);
    // well within the 60 s lease: it did not wait for the lease to expire
    expect(Date.now() - startedAt).toBeLessThan(10_000);
    expect(second.attempt).toBe(1);
    expect((second.turn_ref as Ref).delivery_id).not.toBe((first.turn_ref as Ref).delivery_id);
    await again.send({ type: 'turn_accepted', turn_ref: second.turn_ref });
    await again.send({ type: 'turn_result', turn_ref: second.turn_ref, messages: [{ role: 'assistant', content: 'ok' }] });
    await again.next('turn_committed');
    const turns = await db.execute<{ status: string; attempt: number }>(
      sql`select status, attempt from corral.turns where event_id = ${eventId} order by started_at`,
    );
    expect(turns.rows.map((r) => r.status)).toEqual(['failed', 'succeeded']);
    expect(turns.rows.every((r) => r.attempt === 1)).toBe(true);
  });

  it('answers an accepted turn_error with turn_failed (retry / dead-lettered) and a hand-back with handed_back', async () => {
    const { t, w, db } = await setup();
    await w.register(2);
    const a = await sendEvent(db, actorKey('answer', 'retry'), { n: 1 });
    const sa = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === a.eventId);
    await w.send({ type: 'turn_error', turn_ref: sa.turn_ref, error: { code: 'boom', message: 'x', retryable: true } });
    expect(await w.next('turn_failed')).toMatchObject({ turn_ref: sa.turn_ref, retry: true, dead_lettered: false });

    const b = await sendEvent(db, actorKey('answer', 'final'), { n: 2 });
    const sb = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === b.eventId);
    await w.send({ type: 'turn_error', turn_ref: sb.turn_ref, error: { code: 'bad_input', message: 'x', retryable: false } });
    expect(await w.next('turn_failed')).toMatchObject({ turn_ref: sb.turn_ref, retry: false, dead_lettered: true });
    // a repeat of the same error is fenced out
    await w.send({ type: 'turn_error', turn_ref: sb.turn_ref, error: { code: 'bad_input', message: 'x', retryable: false } });
    expect((await w.next('turn_rejected')).reason).toBe('already_failed');

    const c = await sendEvent(db, actorKey('answer', 'handback'), { n: 3 });
    const sc = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === c.eventId);
    await w.send({ type: 'turn_error', turn_ref: sc.turn_ref, error: { code: 'over_capacity', message: 'full', retryable: true } });
    expect(await w.next('turn_failed')).toMatchObject({ turn_ref: sc.turn_ref, retry: true, dead_lettered: false, handed_back: true });
    // handed back without spending an attempt: it is dispatched again (here once a worker
    // registers) as attempt 1
    const other = new RawPeer(t.daemon.broker.endpoint, 'wp-2');
    workers.push(other);
    await other.register(1);
    const again = await waitFor(() =>
      [w, other].flatMap((x) => x.inbox).find((m) => m.type === 'turn_start' && (m.turn_ref as Ref).event_id === c.eventId),
    );
    expect(again.attempt).toBe(1);
  });
});
