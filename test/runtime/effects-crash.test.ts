/**
 * Crash test on a real daemon process: the daemon is killed -9 while its commit transaction is
 * open, after the emitted event was inserted and before the commit. The event must not exist;
 * after a restart the turn commits once more and its emitted event exists exactly once.
 */
import { afterAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { useTestDatabase } from '../helpers/db.ts';
import { fastRecoveryEnv, freePort, killAll, spawnCorral, type Proc, stopGracefully, exitOf } from '../helpers/processes.ts';
import { RawPeer, type Msg } from '../helpers/raw-peer.ts';
import { waitFor } from '../helpers/wait.ts';

type Ref = Record<string, unknown> & { event_id: string; delivery_id: string; session_id: string };

describe('durable effects survive kill -9 of the daemon between result and commit', () => {
  const tdb = useTestDatabase();
  let daemon: Proc | undefined;
  let blocker: pg.Client | undefined;
  let worker: RawPeer | undefined;
  let serving = true;

  afterAll(async () => {
    serving = false;
    await worker?.close();
    await blocker?.end().catch(() => undefined);
    await stopGracefully(daemon);
    killAll();
  });

  it('the emitted event commits exactly once, with its turn', async () => {
    const port = await freePort();
    const endpoint = `tcp://127.0.0.1:${port}`;
    const env = {
      ...fastRecoveryEnv(tdb.url, endpoint),
      CORRAL_LOG_LEVEL: 'debug',
    };
    daemon = spawnCorral(['daemon'], env, 'daemon');
    const c = tdb.client;

    const w = (worker = new RawPeer(endpoint, `crash-fx-${Date.now()}`, undefined, 'crash-fx'));
    const register = async () => {
      await w.send({ type: 'worker_ready', worker_id: 'crash-fx', capacity: 4 });
      await w.next('worker_welcome', () => true, 30_000);
    };
    await register();

    const results: Msg[] = [];
    // the worker: accepts every turn; the source turn emits one event to crash/dst
    let lastBeat = 0;
    const serve = async () => {
      while (serving) {
        // heartbeats: a restarted daemon answers them not_registered, so the worker registers again
        if (Date.now() - lastBeat > 300) {
          lastBeat = Date.now();
          await w.send({ type: 'worker_heartbeat', worker_id: 'crash-fx', in_flight: 0 });
        }
        const i = w.inbox.findIndex((m) => m.type === 'turn_start' || (m.type === 'error' && m.code === 'not_registered'));
        if (i < 0) {
          await new Promise((r) => setTimeout(r, 20));
          continue;
        }
        const m = w.inbox.splice(i, 1)[0]!;
        if (m.type === 'error') {
          await w.send({ type: 'worker_ready', worker_id: 'crash-fx', capacity: 4 });
          // after re-registering, re-send results with no answer (as the SDK does)
          for (const r of results) await w.send(r);
          continue;
        }
        const ref = m.turn_ref as Ref;
        await w.send({ type: 'turn_accepted', turn_ref: ref });
        const res = {
          type: 'turn_result',
          turn_ref: ref,
          messages: [{ role: 'assistant', content: 'done' }],
          ...(ref.session_id === 'src' ? { emit: [{ actor: 'crash/dst', data: { from: 'src' } }] } : {}),
        };
        if (ref.session_id === 'src') results.push(res);
        await w.send(res);
      }
    };

    // hold the source event's job row: the commit then blocks in pg-boss's complete, after the
    // turn's rows and the emitted event were written inside its transaction
    const send = spawnCorral(['send', 'crash/src', '{"text":"go"}'], env, 'send');
    expect(await exitOf(send)).toBe(0);
    const eventId = send.log().trim().split('\n').at(-1)!;
    blocker = new pg.Client({ connectionString: tdb.url });
    await blocker.connect();
    await waitFor(async () => (await c.query(`select 1 from pgboss.job where id = $1 and state = 'active'`, [eventId])).rowCount === 1, {
      timeoutMs: 20_000,
      what: 'the source event fetched',
    });
    await blocker.query('begin');
    await blocker.query(`select 1 from pgboss.job where id = $1 for update`, [eventId]);
    const serving1 = serve();

    await waitFor(
      async () =>
        (
          await c.query(
            `select 1 from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock' and query ilike '%completed_on%'`,
          )
        ).rowCount! > 0,
      { timeoutMs: 20_000, what: `the commit waiting on the job row (log: ${daemon.logPath})` },
    );
    daemon.child.kill('SIGKILL');
    await exitOf(daemon);
    await blocker.query('rollback');
    // nothing of the open transaction stands: no turn, no emitted event
    const dstJobs = `select count(*)::int as n from pgboss.job where singleton_key = 'crash/dst'`;
    expect((await c.query(dstJobs)).rows[0].n).toBe(0);
    expect(
      (await c.query(`select count(*)::int as n from corral.turns where event_id = $1 and status = 'succeeded'`, [eventId])).rows[0].n,
    ).toBe(0);

    // restart: the turn is re-run (or its result re-sent) and commits once, with its event
    daemon = spawnCorral(['daemon'], env, 'daemon2');
    await waitFor(
      async () =>
        (
          await c.query(`select count(*)::int as n from corral.turns t join corral.conversations cv on cv.id = t.conversation_id
                         where cv.session_id = 'dst' and t.status = 'succeeded'`)
        ).rows[0].n === 1,
      { timeoutMs: 60_000, what: `the emitted event committed (log: ${daemon.logPath})` },
    );
    expect(
      (await c.query(`select count(*)::int as n from corral.turns where event_id = $1 and status = 'succeeded'`, [eventId])).rows[0].n,
    ).toBe(1);
    expect((await c.query(dstJobs)).rows[0].n).toBe(1);
    const emitted = await c.query(`select emitted from corral.turns where event_id = $1 and status = 'succeeded'`, [eventId]);
    const dst = await c.query(`select id from pgboss.job where singleton_key = 'crash/dst'`);
    expect(emitted.rows[0].emitted.map((e: { event_id: string }) => e.event_id)).toEqual([dst.rows[0].id]);
    serving = false;
    await serving1;
  }, 150_000);
});
