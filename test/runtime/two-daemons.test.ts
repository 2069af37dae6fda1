/**
 * Two daemons on one database under load, as OS processes, each with its own worker processes:
 * many events to a few hundred actors, enqueued while both run. Checked from the database:
 *  - never two live activations of one actor key (sampled every few ms during the run; and the
 *    partial unique index that guarantees it is in place),
 *  - per-actor order: each actor's user messages, in transcript order, carry its events in enqueue
 *    order,
 *  - every event committed exactly once (one succeeded turn, two transcript messages),
 *  - both daemons ran turns and actors moved between them (the test means nothing otherwise).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import type { PgBoss } from 'pg-boss';
import { actorKey } from '../../src/base/actor-key.ts';
import { DEFAULTS } from '../../src/config.ts';
import { createBoss } from '../../src/queue/boss.ts';
import { sendMany } from '../helpers/send.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { freePort, killAll, spawnCorral, type Proc } from '../helpers/processes.ts';
import { waitFor } from '../helpers/wait.ts';

const ACTORS = 300;
const EVENTS_PER_ACTOR = 8;
const WORKERS_PER_DAEMON = 2;

describe('two daemons on one database', () => {
  const tdb = useTestDatabase();
  const procs: Proc[] = [];
  const homes: string[] = [];

  let boss: PgBoss | undefined;

  afterAll(async () => {
    await boss?.stop({ graceful: false, close: true });
    for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGTERM');
    await Promise.race([Promise.all(procs.map((p) => p.exited)), new Promise((r) => setTimeout(r, 8_000))]);
    killAll();
    for (const h of homes) rmSync(h, { recursive: true, force: true });
  });

  it('never runs an actor twice at once, keeps per-actor order and commits every event once', { timeout: 90_000 }, async () => {
    const env = {
      DATABASE_URL: tdb.url,
      CORRAL_INSECURE: '1',
      // Short leases and idle timeout: actors move between the daemons within the test's time.
      CORRAL_LEASE_MS: '3000',
      CORRAL_PROGRESS_INTERVAL_MS: '500',
      CORRAL_IDLE_TIMEOUT_MS: '300',
      CORRAL_WATCHDOG_INTERVAL_MS: '100',
      CORRAL_WORKER_HEARTBEAT_MS: '200',
      CORRAL_WORKER_STALE_MS: '2000',
      CORRAL_RETRY_DELAY_S: '1',
      CORRAL_RETRY_DELAY_MAX_S: '2',
      CORRAL_LOG_LEVEL: 'warn',
    };
    // Worker processes of their own, with ids that say which daemon they serve.
    for (const d of ['a', 'b']) {
      const port = await freePort();
      const endpoint = `tcp://127.0.0.1:${port}`;
      const home = mkdtempSync(join(tmpdir(), `corral-two-${d}-`));
      homes.push(home);
      procs.push(spawnCorral(['daemon'], { ...env, CORRAL_HOME: home, CORRAL_ENDPOINT: endpoint }, `daemon-${d}`));
      for (let w = 1; w <= WORKERS_PER_DAEMON; w++) {
        procs.push(
          spawnCorral(
            ['worker', '--id', `two-${d}-${w}`, '--endpoint', endpoint, '--capacity', '16', '--insecure'],
            { ...env, CORRAL_HOME: home },
            `worker-${d}-${w}`,
          ),
        );
      }
    }
    const c = tdb.client;
    await waitFor(
      async () =>
        (await c.query(`select count(*)::int as n from corral.workers where status = 'ready'`)).rows[0].n === 2 * WORKERS_PER_DAEMON,
      { timeoutMs: 30_000, what: `4 workers registered (logs: ${procs.map((p) => p.logPath).join(', ')})` },
    );

    // The guarantee the sampler checks is also the schema's: one live activation per actor key.
    const index = await c.query<{ def: string }>(
      `select indexdef as def from pg_indexes where schemaname = 'corral' and indexname = 'activations_one_live'`,
    );
    expect(index.rows[0]?.def).toMatch(/UNIQUE INDEX .* \(agent_uid, session_id\) WHERE/);

    // Sample live activations while the load runs, on a connection of its own.
    const sampler = new pg.Client({ connectionString: tdb.url });
    await sampler.connect();
    let samples = 0;
    const doubles: unknown[] = [];
    let sampling = true;
    const sampling$ = (async () => {
      while (sampling) {
        const r = await sampler.query(
          `select agent_uid, session_id, count(*)::int as n from corral.activations
            where status in ('starting', 'active', 'draining') group by 1, 2 having count(*) > 1`,
        );
        samples++;
        doubles.push(...r.rows);
        await new Promise((res) => setTimeout(res, 5));
      }
    })();

    // Events in waves, each wave one insert over every actor, so both daemons hold actors at once
    // and actors move between them.
    const total = ACTORS * EVENTS_PER_ACTOR;
    boss = createBoss(tdb.url, DEFAULTS, { max: 2 });
    await boss.start();
    for (let k = 0; k < EVENTS_PER_ACTOR; k++) {
      await sendMany(
        tdb.database.db,
        Array.from({ length: ACTORS }, (_, i) => ({ key: actorKey('two', `s${i}`), event: { text: `wave ${k}`, k } })),
      );
      await new Promise((r) => setTimeout(r, 300));
    }
    await waitFor(
      async () => (await c.query(`select count(*)::int as n from corral.turns where status = 'succeeded'`)).rows[0].n >= total,
      { timeoutMs: 60_000, intervalMs: 200, what: `${total} turns committed` },
    );
    sampling = false;
    await sampling$;
    await sampler.end();

    expect(samples).toBeGreaterThan(20);
    expect(doubles).toEqual([]);

    // Exactly once: one succeeded turn per event, with its two transcript messages.
    const once = await c.query<{ events: number; bad: number }>(
      `with t as (select event_id, count(*) filter (where status = 'succeeded') as ok from corral.turns group by event_id)
       select count(*)::int as events, count(*) filter (where ok <> 1)::int as bad from t`,
    );
    expect(once.rows[0]).toEqual({ events: total, bad: 0 });
    const messages = await c.query<{ n: number }>(
      `select count(*)::int as n from corral.messages m join corral.turns t on t.id = m.turn_id where t.status = 'succeeded'`,
    );
    expect(messages.rows[0]!.n).toBe(2 * total);

    // Per-actor order: the user messages in transcript order carry k = 0, 1, 2, …
    const order = await c.query<{ session_id: string; ks: number[] }>(
      `select cv.session_id, array_agg((m.content->>'k')::int order by m.seq) as ks
         from corral.messages m join corral.conversations cv on cv.id = m.conversation_id
        where m.role = 'user' group by cv.session_id`,
    );
    expect(order.rows.length).toBe(ACTORS);
    const expected = Array.from({ length: EVENTS_PER_ACTOR }, (_, k) => k);
    const outOfOrder = order.rows.filter((r) => JSON.stringify(r.ks) !== JSON.stringify(expected));
    expect(outOfOrder).toEqual([]);

    // Both daemons ran turns.
    const owners = await c.query<{ n: number }>(`select count(distinct owner_id)::int as n from corral.activations`);
    expect(owners.rows[0]!.n).toBe(2);
    // … and actors moved between them (an activation of each daemon for one key, one after the other).
    const moved = await c.query<{ n: number }>(
      `select count(*)::int as n from (select 1 from corral.activations group by agent_uid, session_id having count(distinct owner_id) = 2) x`,
    );
    expect(moved.rows[0]!.n).toBeGreaterThan(0);
  });
});
