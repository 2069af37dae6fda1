/**
 * Crash test of a next turn begun in its predecessor's commit (N1 of src/runtime/turn-commit.ts), on
 * real processes (`corral daemon`, `corral worker`, real PostgreSQL and ZeroMQ): the daemon is
 * killed -9 right after such a commit is durable and before the next turn's `turn_start` went out
 * (crash point `continued-commit`, src/base/crash-points.ts). The next event is then claimed and
 * begun in the database but never reached a worker; a new daemon must retry it, and every event
 * must be committed exactly once, in order.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { useTestDatabase } from '../helpers/db.ts';
import { exitOf, fastRecoveryEnv, freePort, killAll, spawnCorral, stopGracefully, type Proc } from '../helpers/processes.ts';
import { waitFor } from '../helpers/wait.ts';

describe('kill -9 of the daemon between a commit that began the next turn and its dispatch', () => {
  const tdb = useTestDatabase();
  const procs: Proc[] = [];

  afterAll(async () => {
    for (const p of procs) await stopGracefully(p);
    killAll();
  });

  it('loses and doubles nothing: the stranded turn is retried, every event commits once, in order', async () => {
    const endpoint = `tcp://127.0.0.1:${await freePort()}`;
    const env = fastRecoveryEnv(tdb.url, endpoint);
    const start = (args: string[], name: string, extra: Record<string, string> = {}) => {
      const p = spawnCorral(args, { ...env, ...extra }, name);
      procs.push(p);
      return p;
    };
    const c = tdb.client;
    let daemon = start(['daemon'], 'daemon', { CORRAL_CRASH_AT: 'continued-commit' });
    start(['worker', '--id', 'cont-w1', '--endpoint', endpoint, '--capacity', '4', '--insecure'], 'worker');
    await waitFor(
      async () => (await c.query(`select 1 from corral.workers where status = 'ready'`).catch(() => ({ rowCount: 0 }))).rowCount! > 0,
      { timeoutMs: 30_000, what: `a worker registered (log: ${daemon.logPath})` },
    );
    // eight events queued at once: the first comes through the fetch, the others through commits
    const texts = Array.from({ length: 8 }, (_, i) => `c${i + 1}`);
    const sent = await c.query<{ event_id: string }>(`select event_id from corral.send_events($1::jsonb) order by ord`, [
      JSON.stringify(texts.map((text) => ({ agent_uid: 'crash', session_id: 'cont', data: { text } }))),
    ]);
    const ids = sent.rows.map((r) => r.event_id);
    expect(await exitOf(daemon), `the daemon reached the crash point (log: ${daemon.logPath})`).toBeNull();

    // what the kill left: c1 committed; c2 claimed and begun in that same commit, sent to no one
    const jobState = async (id: string) =>
      (await c.query<{ state: string }>(`select state::text as state from pgboss.job where id = $1`, [id])).rows[0]?.state;
    expect(await jobState(ids[0]!)).toBe('completed');
    expect(await jobState(ids[1]!)).toBe('active');
    const stranded = await c.query<{ status: string; state: string; current: string | null }>(
      `select t.status, d.state, a.current_event_id as current
         from corral.turns t join corral.deliveries d using (delivery_id) join corral.activations a on a.activation_uid = t.activation_uid
        where t.event_id = $1`,
      [ids[1]],
    );
    expect(stranded.rows).toEqual([{ status: 'started', state: 'sent', current: ids[1] }]);
    for (const id of ids.slice(2)) expect(await jobState(id), 'the rest still queued').toBe('created');

    daemon = start(['daemon'], 'daemon2');
    await waitFor(async () => (await jobState(ids.at(-1)!)) === 'completed', {
      timeoutMs: 60_000,
      what: `every event committed (log: ${daemon.logPath})`,
    });
    const turns = await c.query<{ event_id: string; attempts: number; succeeded: number }>(
      `select event_id, count(*)::int as attempts, count(*) filter (where status = 'succeeded')::int as succeeded
         from corral.turns group by event_id`,
    );
    const byEvent = new Map(turns.rows.map((t) => [t.event_id, t]));
    for (const id of ids) expect(byEvent.get(id)?.succeeded, `${id} committed once`).toBe(1);
    expect(byEvent.get(ids[1]!)?.attempts, 'the stranded attempt failed and the event ran again').toBeGreaterThanOrEqual(2);
    const messages = await c.query<{ role: string; text: string | null; seq: number }>(
      `select role, content->>'text' as text, seq from corral.messages order by seq`,
    );
    expect(
      messages.rows.map((r) => r.seq),
      'seqs gapless',
    ).toEqual(messages.rows.map((_, i) => i + 1));
    expect(
      messages.rows.filter((r) => r.role === 'user').map((r) => r.text),
      'each event once, in order',
    ).toEqual(texts);
    expect(messages.rows.filter((r) => r.role === 'assistant').map((r) => r.text)).toEqual(texts.map((t) => `echo: ${t}`));
    for (const id of ids) expect(await jobState(id), id).toBe('completed');
  }, 180_000);
});
