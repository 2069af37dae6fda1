/**
 * Limits that hold whatever workers do: a turn is not offered to more than a few dead routes per
 * dispatch (yet still reaches the live worker), and a turn that keeps reporting progress is
 * failed once it runs past the maximum turn duration.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import type { DaemonMessage } from '../../src/fabric/protocol.ts';
import { runExampleWorker } from '../../src/worker/example.ts';
import { createWorker, type Worker } from '../../src/worker/sdk.ts';
import { createExampleHandler } from '../../src/worker/example.ts';
import { startTestDaemon, testLogger, type TestDaemon } from '../helpers/daemon.ts';
import { waitFor } from '../helpers/wait.ts';
import { RawPeer } from '../helpers/raw-peer.ts';
import { sendEvent } from '../helpers/send.ts';

const cleanups: Array<() => Promise<unknown> | unknown> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

async function daemon(over: Parameters<typeof startTestDaemon>[0]): Promise<TestDaemon> {
  const t = await startTestDaemon(over);
  cleanups.push(() => t.stop());
  return t;
}

describe('dispatch past dead routes', () => {
  it('reaches the live worker a few dead routes at a time, one delivery per dead route at most', async () => {
    const t = await daemon({ maxWorkers: 64 });
    const { broker, runtime } = t.daemon;
    const DEAD = 20;
    const peers: RawPeer[] = [];
    for (let i = 0; i < DEAD; i++) {
      const p = new RawPeer(broker.endpoint, `dead-${i}`);
      await p.sendJson({ v: 1, type: 'worker_ready', worker_id: `dead-${i}`, capacity: 1024 });
      peers.push(p);
    }
    await waitFor(() => runtime.workers.size === DEAD, { what: 'dead peers registered' });
    await Promise.all(peers.map((p) => p.close()));
    await waitFor(() => broker.stats().connections === 0, { what: 'dead peers disconnected' });
    const alive: Worker = await runExampleWorker({ endpoint: broker.endpoint, workerId: 'alive', capacity: 1, logger: testLogger });
    cleanups.push(() => alive.stop());
    await waitFor(() => runtime.workers.isReady('alive'), { what: 'live worker registered' });

    const { eventId } = await sendEvent(t.daemon.database.db, actorKey('dead-routes', 's'), { text: 'x' });
    const committed = await waitFor(
      async () =>
        (
          await t.daemon.database.pool.query<{ worker_id: string }>(
            `select worker_id from corral.turns where event_id = $1 and status = 'succeeded'`,
            [eventId],
          )
        ).rows[0],
      { what: 'commit on the live worker', timeoutMs: 20_000 },
    );
    expect(committed.worker_id).toBe('alive');
    const deliveries = await t.daemon.database.pool.query('select 1 from corral.deliveries where event_id = $1', [eventId]);
    expect(deliveries.rowCount).toBeLessThanOrEqual(DEAD + 1);
  });
});

describe('maximum turn duration', () => {
  it('fails a turn that keeps reporting progress once it runs past maxTurnMs, and cancels it on the worker', async () => {
    const t = await daemon({ maxTurnMs: 1_500, watchdogIntervalMs: 200, leaseMs: 10_000, progressIntervalMs: 300, retryLimit: 0 });
    const received: DaemonMessage[] = [];
    const w = createWorker({
      endpoint: t.daemon.broker.endpoint,
      workerId: 'slow',
      handler: createExampleHandler(),
      logger: testLogger,
      hooks: { onReceive: (m) => void received.push(m) },
    });
    await w.start();
    cleanups.push(() => w.stop());
    await waitFor(() => t.daemon.runtime.workers.isReady('slow'), { what: 'worker registered' });
    const started = Date.now();
    const { eventId } = await sendEvent(t.daemon.database.db, actorKey('slow', 's'), { delayMs: 60_000 });
    const failed = await waitFor(
      async () =>
        (
          await t.daemon.database.pool.query<{ error: { code: string } }>(
            `select error from corral.turns where event_id = $1 and status = 'failed'`,
            [eventId],
          )
        ).rows[0],
      { what: 'turn failed for running too long', timeoutMs: 10_000 },
    );
    expect(failed.error.code).toBe('turn_timeout');
    // well before the 10 s lease, which progress kept renewing anyway
    expect(Date.now() - started).toBeLessThan(8_000);
    await waitFor(() => received.find((m) => m.type === 'turn_cancel' && m.reason === 'turn_timeout'), { what: 'turn_cancel' });
  });
});
