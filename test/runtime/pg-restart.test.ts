/**
 * PostgreSQL restarts under a running daemon: its own embedded server (in a temporary
 * CORRAL_HOME, so the shared test server is not touched) is stopped with pg_ctl and started again
 * while turns are in flight and a producer keeps enqueueing. The daemon rides it out: every event
 * whose enqueue was acknowledged, before or during the outage, commits exactly once after it.
 */
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { loadConfig } from '../../src/config.ts';
import { Daemon } from '../../src/daemon/daemon.ts';
import { ensureEmbeddedPostgres, stopEmbeddedPostgres } from '../../src/db/postgres/embedded.ts';
import { runExampleWorker } from '../../src/worker/example.ts';
import type { Worker } from '../../src/worker/sdk.ts';
import { testLogger } from '../helpers/daemon.ts';
import { sleep, waitFor } from '../helpers/wait.ts';
import { sendEvent } from '../helpers/send.ts';

/** How long the server stays down: the point of the step, not a wait for something to happen. */
const DOWN_MS = 1_500;

describe('a PostgreSQL restart under a running daemon', () => {
  let home: string | undefined;
  let daemon: Daemon | undefined;
  const workers: Worker[] = [];

  afterAll(async () => {
    for (const w of workers) await w.stop();
    await daemon?.stop();
    if (home) {
      await stopEmbeddedPostgres(home).catch(() => undefined);
      await rm(home, { recursive: true, force: true });
    }
  });

  it('commits every event enqueued before the outage, and every one acknowledged while a producer kept trying through it, exactly once', async () => {
    home = await mkdtemp(join(tmpdir(), 'corral-pg-restart-'));
    // the server runs as the postgres user when the tests run as root: it must reach the folder
    await chmod(home, 0o755);
    const server = await ensureEmbeddedPostgres({ homeDir: home, ephemeral: true });
    const config = loadConfig({
      homeDir: home,
      endpoint: 'tcp://127.0.0.1:0',
      insecure: true,
      pollIntervalMs: 200,
      watchdogIntervalMs: 500,
      recoveryIntervalMs: 1_000,
      drainMs: 0,
    });
    daemon = new Daemon({ config, databaseUrl: server.url, logger: testLogger });
    await daemon.start();
    const d = daemon;
    for (const id of ['pgr-1', 'pgr-2']) {
      workers.push(await runExampleWorker({ endpoint: d.broker.endpoint, workerId: id, capacity: 4, logger: testLogger }));
    }
    await waitFor(() => d.runtime.workers.isReady('pgr-1') && d.runtime.workers.isReady('pgr-2'), { what: 'workers registered' });

    const acknowledged: string[] = [];
    const enqueue = async (session: string, event: object) => {
      const { eventId } = await sendEvent(d.database.db, actorKey('pgr', session), event);
      acknowledged.push(eventId);
      return eventId;
    };
    // before: turns that are still running when the server stops, and more queued behind them
    for (let i = 0; i < 6; i++) await enqueue(`s${i % 3}`, { text: `before ${i}`, delayMs: 1_000 });
    await waitFor(() => acknowledged.some((id) => d.runtime.workers.workerOf(id) !== undefined), { what: 'a turn in flight' });

    // during: a producer keeps trying; what it was told is enqueued must commit
    let producing = true;
    let refused = 0;
    const producer = (async () => {
      for (let i = 0; producing; i++) {
        try {
          await enqueue(`s${i % 3}`, { text: `during ${i}` });
        } catch {
          refused++;
        }
        await sleep(50);
      }
    })();

    expect(await stopEmbeddedPostgres(home)).toBe(true);
    await sleep(DOWN_MS);
    const again = await ensureEmbeddedPostgres({ homeDir: home, ephemeral: true });
    expect(again.url).toBe(server.url);
    // the producer gets through again once the server is back
    const duringOutage = refused;
    const afterCount = acknowledged.length;
    await waitFor(() => acknowledged.length >= afterCount + 3, { what: 'enqueues acknowledged after the restart' });
    producing = false;
    await producer;
    expect(duringOutage).toBeGreaterThan(0);

    const succeeded = async () =>
      (
        await d.database.pool.query<{ event_id: string; n: number }>(
          `select event_id, count(*)::int as n from corral.turns where status = 'succeeded' group by event_id`,
        )
      ).rows;
    const rows = await waitFor(
      async () => {
        const r = await succeeded();
        return acknowledged.every((id) => r.some((x) => x.event_id === id)) ? r : undefined;
      },
      // well inside the lease (60 s): a result lost to the outage would wait for it, then a retry
      { what: `all ${acknowledged.length} acknowledged events committed`, timeoutMs: 30_000, intervalMs: 200 },
    );
    const byEvent = new Map(rows.map((r) => [r.event_id, r.n]));
    expect(acknowledged.map((id) => byEvent.get(id))).toEqual(acknowledged.map(() => 1));
    // no event's input was written into its conversation twice
    const dupes = await d.database.pool.query(
      `select t.event_id from corral.messages m join corral.turns t on t.id = m.turn_id
        where m.role = 'user' group by t.event_id having count(*) > 1`,
    );
    expect(dupes.rows).toEqual([]);
    expect(d.state).toBe('running');
  });
});
