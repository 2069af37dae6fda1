/**
 * Key scopes (`corral keys add-worker ID --agents PATTERN…`) on a real daemon with CURVE on and
 * real SDK workers: a scoped key is never given a turn of an agent outside its scope, and a
 * result of it that emits outside its scope is rejected `emit_denied` and writes nothing.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { addWorkerKey, keyPaths, workerCredentials } from '../../src/fabric/keys.ts';
import { createExampleHandler } from '../../src/worker/example.ts';
import { createWorker, type Worker } from '../../src/worker/sdk.ts';
import { startTestDaemon, testLogger, type TestDaemon } from '../helpers/daemon.ts';
import { waitFor } from '../helpers/wait.ts';
import { sendEvent } from '../helpers/send.ts';

describe('key scopes', () => {
  let home: string;
  let t: TestDaemon;
  const workers: Worker[] = [];

  async function startWorker(id: string, agents?: string[]): Promise<void> {
    const key = addWorkerKey(keyPaths(home), t.daemon.security!.keys.publicKey, id, agents ? { agents } : {});
    const w = createWorker({
      endpoint: t.daemon.broker.endpoint,
      workerId: id,
      capacity: 4,
      handler: createExampleHandler(),
      logger: testLogger,
      ...workerCredentials(key),
    });
    await w.start();
    workers.push(w);
    await waitFor(() => t.daemon.runtime.workers.isReady(id), { what: `${id} registered`, timeoutMs: 15_000 });
  }

  const query = async <R extends Record<string, unknown>>(text: string, values: unknown[] = []) =>
    (await t.daemon.database.pool.query<R>(text, values)).rows;

  beforeAll(async () => {
    home = mkdtempSync(join(tmpdir(), 'corral-scopes-'));
    t = await startTestDaemon({ insecure: false, homeDir: home, keyPollMs: 50, retryLimit: 0, watchdogIntervalMs: 200 });
    await startWorker('support-worker', ['support-*']);
  });

  afterAll(async () => {
    for (const w of workers) await w.stop({ graceMs: 0 });
    await t.stop();
    rmSync(home, { recursive: true, force: true });
  });

  it('a result emitting to an agent outside the scope is rejected emit_denied, and nothing is enqueued for it', async () => {
    const { eventId } = await sendEvent(t.daemon.database.db, actorKey('support-eu', 'emitter'), {
      text: 'x',
      emit: { actor: 'billing/stolen', data: { text: 'injected' } },
    });
    const turn = await waitFor(
      async () =>
        (
          await query<{ status: string; error: { code?: string } }>(
            `select status, error from corral.turns where event_id = $1 and status <> 'started'`,
            [eventId],
          )
        )[0],
      { what: 'the emitting turn to end', timeoutMs: 15_000, intervalMs: 50 },
    );
    expect(turn).toMatchObject({ status: 'failed', error: { code: 'emit_denied' } });
    // dead-lettered (no retries here): the injected event exists nowhere
    const injected = await query(`select id from pgboss.job where singleton_key = 'billing/stolen'`);
    expect(injected).toEqual([]);
    expect(
      await query(`select 1 from corral.turns t join corral.conversations c on c.id = t.conversation_id where c.agent_uid = 'billing'`),
    ).toEqual([]);
  });

  it('a turn of an agent outside the scope waits for a worker that may take it, and is never offered to the scoped one', async () => {
    const db = t.daemon.database.db;
    const outside = await sendEvent(db, actorKey('billing', 'invoice'), { text: 'outside' });
    const inside = await sendEvent(db, actorKey('support-us', 'ticket'), { text: 'inside' });
    await waitFor(
      async () => (await query(`select 1 from corral.turns where event_id = $1 and status = 'succeeded'`, [inside.eventId])).length === 1,
      { what: 'the turn in scope to commit', timeoutMs: 15_000, intervalMs: 50 },
    );
    // the scoped worker had room all along; the other turn is begun but parked, offered to nobody
    expect(await query(`select worker_id from corral.deliveries where event_id = $1 and worker_id is not null`, [outside.eventId])).toEqual(
      [],
    );
    await startWorker('any-worker');
    const done = await waitFor(
      async () =>
        (
          await query<{ worker_id: string }>(`select worker_id from corral.turns where event_id = $1 and status = 'succeeded'`, [
            outside.eventId,
          ])
        )[0],
      { what: 'the turn outside the scope to commit on the unscoped worker', timeoutMs: 15_000, intervalMs: 50 },
    );
    expect(done.worker_id).toBe('any-worker');
    const offered = await query<{ worker_id: string }>(
      `select distinct worker_id from corral.deliveries where event_id = $1 and worker_id is not null`,
      [outside.eventId],
    );
    expect(offered.map((r) => r.worker_id)).toEqual(['any-worker']);
  });
});
