/**
 * Content PostgreSQL cannot store (NUL, lone surrogates) and numbers JSON cannot keep: refused at
 * once with a clear reason, never left to hang until a lease runs out, never silently changed.
 * The reference SDK refuses such an outcome itself (`turn_error{unstorable_result}`); the daemon's
 * own refusal of a raw peer's result is in bounded-results.test.ts.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import type { DaemonMessage } from '../../src/fabric/protocol.ts';
import { createWorker, type Worker } from '../../src/worker/sdk.ts';
import { startTestDaemon, testLogger, type TestDaemon } from '../helpers/daemon.ts';
import { CORRAL, run } from '../cli/helpers.ts';
import { waitFor } from '../helpers/wait.ts';
import { sendEvent } from '../helpers/send.ts';

describe('unstorable content', () => {
  let t: TestDaemon;
  let worker: Worker;
  const received: DaemonMessage[] = [];

  beforeAll(async () => {
    // the lease is long: a rejection that waited for it would fail the deadlines below
    t = await startTestDaemon({ leaseMs: 60_000, retryLimit: 0 });
    worker = createWorker({
      endpoint: t.daemon.broker.endpoint,
      workerId: 'unstorable-w',
      logger: testLogger,
      hooks: { onReceive: (m) => void received.push(m) },
      handler: async (ctx) => {
        const data = ctx.event.data as { kind?: string };
        const text = data.kind === 'nul' ? 'before\u0000after' : data.kind === 'surrogate' ? 'half \ud83d pair' : 'fine';
        return { messages: [{ role: 'assistant', content: { text } }] };
      },
    });
    await worker.start();
    await waitFor(() => t.daemon.runtime.workers.freeSlots() === 1, { what: 'worker registered' });
  });

  afterAll(async () => {
    await worker?.stop();
    await t?.stop();
  });

  for (const kind of ['nul', 'surrogate'] as const) {
    it(`fails a turn whose outcome has ${kind === 'nul' ? 'a NUL' : 'a lone surrogate'} at once, without sending it`, async () => {
      const { daemon } = t;
      const { eventId } = await sendEvent(daemon.database.db, actorKey('unstorable', kind), { kind });
      const started = Date.now();
      const failed = await waitFor(() => received.find((m) => m.type === 'turn_failed' && m.turn_ref.event_id === eventId), {
        what: 'turn_failed',
        timeoutMs: 5_000,
      });
      expect(failed).toMatchObject({ dead_lettered: true });
      const turn = await waitFor(
        async () =>
          (
            await daemon.database.pool.query<{ status: string; error: { code: string; message: string } }>(
              `select status, error from corral.turns where event_id = $1 and status = 'failed'`,
              [eventId],
            )
          ).rows[0],
        { what: 'turn failed', timeoutMs: 5_000 },
      );
      expect(turn.error.code).toBe('unstorable_result');
      expect(turn.error.message).toMatch(/cannot store/);
      expect(Date.now() - started).toBeLessThan(5_000);
    });
  }

  it('the library refuses an event or a steering input nested deeper than 100 levels before writing anything', async () => {
    const { daemon } = t;
    let deep: unknown = 'x';
    for (let i = 0; i < 10_000; i++) deep = { a: deep };
    await expect(sendEvent(daemon.database.db, actorKey('unstorable', 'deep'), deep)).rejects.toMatchObject({
      code: 'invalid_argument',
      message: expect.stringMatching(/nested deeper than 100 levels/),
    });
    await expect(daemon.steer(actorKey('unstorable', 'deep'), deep)).rejects.toMatchObject({
      code: 'invalid_argument',
      message: expect.stringMatching(/nested deeper than 100 levels/),
    });
    const r = await daemon.database.pool.query(
      `select 1 from corral.turns t join corral.conversations c on c.id = t.conversation_id where c.session_id = 'deep'`,
    );
    expect(r.rowCount).toBe(0);
  });

  it('a clean result still commits', async () => {
    const { daemon } = t;
    const { eventId } = await sendEvent(daemon.database.db, actorKey('unstorable', 'clean'), { kind: 'ok' });
    await waitFor(
      async () =>
        (await daemon.database.pool.query(`select 1 from corral.turns where event_id = $1 and status = 'succeeded'`, [eventId])).rowCount,
      { what: 'commit', timeoutMs: 10_000 },
    );
  });

  it('corral send refuses such JSON with a usage error (exit 2) before touching the database', async () => {
    for (const json of ['{"t":"a\\u0000b"}', '{"t":"\\ud800"}', '{"n":1e400}', `${'['.repeat(101)}${']'.repeat(101)}`]) {
      // stdout and stderr are complete once the process has closed them
      const r = await run([CORRAL, 'send', 'a/b', json], { DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none' });
      expect(r.code, r.stderr).toBe(2);
      expect(r.stderr).toMatch(/cannot be stored/);
    }
  });
});
