/**
 * A worker that goes silent past the stale timeout is taken out of dispatch by the watchdog: the
 * turns it never accepted go to another worker at once (same attempt, a new delivery), while the
 * ones it accepted keep their delivery and wait for their lease. Real PostgreSQL, real sockets.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { createExampleHandler } from '../../src/worker/example.ts';
import { createWorker, type Worker } from '../../src/worker/sdk.ts';
import { startTestDaemon, testLogger, type TestDaemon } from '../helpers/daemon.ts';
import { RawPeer, type Msg } from '../helpers/raw-peer.ts';
import { waitFor } from '../helpers/wait.ts';
import { sendEvent } from '../helpers/send.ts';

type Ref = Record<string, unknown> & { event_id: string; delivery_id: string };

describe('a stale worker', () => {
  let t: TestDaemon | undefined;
  let silent: RawPeer | undefined;
  let healthy: Worker | undefined;

  afterEach(async () => {
    await healthy?.stop();
    await silent?.close();
    await t?.stop();
  });

  it('loses the turns it never accepted to another worker; its accepted turn stays', async () => {
    // the watchdog runs only when the test ticks it
    t = await startTestDaemon({ workerStaleMs: 1_500, workerHeartbeatMs: 100, watchdogIntervalMs: 100_000, drainMs: 0 });
    const { daemon } = t;
    const db = daemon.database.db;
    const deliveryOf = async (deliveryId: string) =>
      (
        await daemon.database.pool.query<{ state: string; worker_id: string }>(
          'select state, worker_id from corral.deliveries where delivery_id = $1',
          [deliveryId],
        )
      ).rows[0];

    // a raw peer sends nothing unless told: it registers, takes two turns, accepts one, then is silent
    silent = new RawPeer(daemon.broker.endpoint, 'stale-a');
    await silent.register(2);
    const unaccepted = await sendEvent(db, actorKey('stale', 'unaccepted'), { text: 'moves' });
    const accepted = await sendEvent(db, actorKey('stale', 'accepted'), { text: 'stays' });
    const startOf = (eventId: string) => (m: Msg) => (m.turn_ref as Ref).event_id === eventId;
    const first = (await silent.next('turn_start', startOf(unaccepted.eventId))).turn_ref as Ref;
    const kept = (await silent.next('turn_start', startOf(accepted.eventId))).turn_ref as Ref;
    await silent.send({ type: 'turn_accepted', turn_ref: kept });
    await waitFor(async () => (await deliveryOf(kept.delivery_id))?.state === 'accepted', { what: 'accept written' });

    healthy = createWorker({
      endpoint: daemon.broker.endpoint,
      workerId: 'stale-b',
      capacity: 2,
      handler: createExampleHandler(),
      logger: testLogger,
    });
    await healthy.start();
    await waitFor(() => daemon.runtime.workers.isReady('stale-b'), { what: 'stale-b registered' });

    const report = await waitFor(
      async () => {
        const r = await daemon.watchdog.tick();
        return r.staleWorkers.includes('stale-a') ? r : undefined;
      },
      { what: 'stale-a declared stale', intervalMs: 100 },
    );
    expect(report).toMatchObject({ staleWorkers: ['stale-a'], redispatched: 1 });

    // the unaccepted turn commits on the other worker, on the same attempt, under a new delivery
    const moved = await waitFor(
      async () =>
        (
          await daemon.database.pool.query<{ worker_id: string; delivery_id: string; attempt: number }>(
            `select worker_id, delivery_id, attempt from corral.turns where event_id = $1 and status = 'succeeded'`,
            [unaccepted.eventId],
          )
        ).rows[0],
      { what: 'the unaccepted turn committed elsewhere', timeoutMs: 15_000 },
    );
    expect(moved).toMatchObject({ worker_id: 'stale-b', attempt: 1 });
    expect(moved.delivery_id).not.toBe(first.delivery_id);
    expect(await deliveryOf(first.delivery_id)).toMatchObject({ state: 'superseded', worker_id: 'stale-a' });
    // the accepted turn is still the silent worker's: its lease decides
    expect(await deliveryOf(kept.delivery_id)).toEqual({ state: 'accepted', worker_id: 'stale-a' });
    expect(daemon.broker.isRegistered('stale-a')).toBe(false);
  });
});
