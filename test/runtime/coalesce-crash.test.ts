/**
 * Crash test of a coalesced batch on real processes (`corral daemon`, `corral worker`, real
 * PostgreSQL and ZeroMQ), input policy `coalesce` as the deployment default: a worker killed -9
 * while it runs the batch, then the daemon killed -9 while the batch runs again, then a restart.
 * Every event must be committed exactly once, in order, the batch's events in exactly one
 * succeeded turn, every job completed once; each run of the batch carried the same events.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { useTestDatabase } from '../helpers/db.ts';
import { fastRecoveryEnv, freePort, killAll, spawnCorral, stopGracefully, type Proc, exitOf } from '../helpers/processes.ts';
import { waitFor } from '../helpers/wait.ts';

describe('a coalesced batch through kill -9 of its worker and of the daemon', () => {
  const tdb = useTestDatabase();
  const procs: Proc[] = [];

  afterAll(async () => {
    for (const p of procs) await stopGracefully(p);
    killAll();
  });

  it('commits every event once, in order, the batch in one turn', async () => {
    const endpoint = `tcp://127.0.0.1:${await freePort()}`;
    const env = {
      ...fastRecoveryEnv(tdb.url, endpoint),
      CORRAL_INPUT_POLICY: 'coalesce',
    };
    const start = (args: string[], name: string) => {
      const p = spawnCorral(args, env, name);
      procs.push(p);
      return p;
    };
    const worker = (n: number) =>
      start(['worker', '--id', `cc-w${n}`, '--endpoint', endpoint, '--capacity', '4', '--insecure'], `worker${n}`);
    let daemon = start(['daemon'], 'daemon');
    let w = worker(1);
    const c = tdb.client;
    await waitFor(
      async () => (await c.query(`select 1 from corral.workers where status = 'ready'`).catch(() => ({ rowCount: 0 }))).rowCount! > 0,
      {
        timeoutMs: 30_000,
        what: `a worker registered (log: ${daemon.logPath})`,
      },
    );
    const send = async (...texts: { text: string; delayMs?: number }[]) => {
      const res = await c.query<{ event_id: string }>(`select event_id from corral.send_events($1::jsonb) order by ord`, [
        JSON.stringify(texts.map((data) => ({ agent_uid: 'crash', session_id: 'co', data }))),
      ]);
      return res.rows.map((r) => r.event_id);
    };
    const jobState = async (id: string) =>
      (await c.query<{ state: string }>(`select state::text as state from pgboss.job where id = $1`, [id])).rows[0]?.state;
    const liveBatch = async () =>
      (
        await c.query<{ delivery_id: string; ids: string[] }>(
          `select delivery_id, array(select x->>'event_id' from jsonb_array_elements(coalesced) x) as ids
             from corral.turns where status = 'started' and coalesced is not null`,
        )
      ).rows[0];

    // m1 runs a while; m2 (a long one), m3 and m4 wait and become one batch
    const [m1] = await send({ text: 'm1', delayMs: 800 });
    await waitFor(async () => (await jobState(m1!)) === 'active', { timeoutMs: 20_000, what: 'm1 running' });
    const [m2, m3, m4] = await send({ text: 'm2', delayMs: 4_000 }, { text: 'm3' }, { text: 'm4' });
    const first = await waitFor(liveBatch, { timeoutMs: 20_000, what: `the batch running (log: ${daemon.logPath})` });
    expect(first.ids).toEqual([m3, m4]);

    // 1. the worker dies mid-batch: the turn goes to the other worker (not accepted yet: the same
    // attempt, redirected) or its attempt fails and is retried; either way with the same batch
    w.child.kill('SIGKILL');
    await exitOf(w);
    const [m5] = await send({ text: 'm5' });
    w = worker(2);
    const again = await waitFor(
      async () => {
        const live = await liveBatch();
        return live && live.delivery_id !== first.delivery_id ? live : undefined;
      },
      { timeoutMs: 30_000, what: `the batch run again (log: ${daemon.logPath})` },
    );
    expect(again.ids, 'it carries the same batch, not m5').toEqual([m3, m4]);

    // 2. the daemon dies while the batch runs again; a new one (and the worker, which reconnects) finish
    daemon.child.kill('SIGKILL');
    await exitOf(daemon);
    daemon = start(['daemon'], 'daemon2');
    await waitFor(async () => (await jobState(m5!)) === 'completed', { timeoutMs: 60_000, what: `m5 committed (log: ${daemon.logPath})` });

    const turns = await c.query<{ event_id: string; coalesced: string[] | null; users: string[] }>(
      `select t.event_id, array(select x->>'event_id' from jsonb_array_elements(t.coalesced) x) as coalesced,
              array(select m.content->>'text' from corral.messages m where m.turn_id = t.id and m.role = 'user' order by m.seq) as users
         from corral.turns t where t.status = 'succeeded' order by t.finished_at`,
    );
    expect(turns.rows.map((t) => [t.event_id, t.users])).toEqual([
      [m1, ['m1']],
      [m2, ['m2', 'm3', 'm4']],
      [m5, ['m5']],
    ]);
    expect(turns.rows[1]!.coalesced).toEqual([m3, m4]);
    const seqs = await c.query<{ role: string; text: string | null; seq: number }>(
      `select role, content->>'text' as text, seq from corral.messages order by seq`,
    );
    expect(
      seqs.rows.map((r) => r.seq),
      'seqs gapless',
    ).toEqual(seqs.rows.map((_, i) => i + 1));
    expect(
      seqs.rows.filter((r) => r.role === 'user').map((r) => r.text),
      'each event once, in order',
    ).toEqual(['m1', 'm2', 'm3', 'm4', 'm5']);
    for (const id of [m1, m2, m3, m4, m5]) expect(await jobState(id!), id).toBe('completed');
    const failedAttempts = await c.query<{ n: number }>(
      `select count(*)::int as n from corral.turns where event_id = $1 and status = 'failed'`,
      [m2],
    );
    expect(failedAttempts.rows[0]!.n, 'the batch ran more than once (the worker kill, the daemon kill)').toBeGreaterThanOrEqual(1);
  }, 180_000);
});
