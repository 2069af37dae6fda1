/**
 * Why the `key_strict_fifo` fetch costs what it costs at a backlog: pg-boss's own fetch statement
 * (captured from `boss.fetch` through a recording `db`), run under EXPLAIN (ANALYZE, BUFFERS) in a
 * rolled-back transaction on the actor queue, at backlogs of new actors (one queued event each),
 * first on the statistics the table has (never analyzed since it was created, as on a fresh daemon,
 * or as left by the last autoanalyze) and then after ANALYZE. See docs/benchmarks.md.
 *
 *   npm run bench:fetch-plan -- [--backlogs 1000,10000,100000] [--plans] [--alternative]
 *                               [--events-per-actor K]
 *
 * `--alternative` also runs corral's own fetch (src/db/boss/fetch.ts: the same claim, walking the
 * queue in fetch order instead of taking every key's head first) on the same rows, and checks it
 * claims as many jobs.
 */
import { parseArgs } from 'node:util';
import pg from 'pg';
import { DEFAULTS } from '../src/config.ts';
import { openDatabase } from '../src/db/client.ts';
import { migrateDatabase } from '../src/db/migrate.ts';
import { createBoss, ensureQueues } from '../src/queue/boss.ts';
import { sendEventsInBatches } from '../src/db/enqueue/send.ts';
import { Cleanup, progress } from './lib/common.ts';
import { openBenchDatabase } from './lib/database.ts';
import { freshDatabase } from './lib/daemon-process.ts';
import { claimStatement } from '../src/db/boss/internals.ts';

const { values } = parseArgs({
  options: {
    backlogs: { type: 'string', default: '1000,10000,100000' },
    plans: { type: 'boolean', default: false },
    alternative: { type: 'boolean', default: false },
    'events-per-actor': { type: 'string', default: '1' },
  },
});
const backlogs = values.backlogs.split(',').map(Number);
/** Queued events per actor: 1 = every queued event is its actor's head (a burst to new actors). */
const perActor = Number(values['events-per-actor']);

interface Explained {
  ms: number;
  /** The plan's first lines (the costly nodes are near the top). */
  plan: string[];
}

async function explain(pool: pg.Pool, text: string, params: unknown[] | undefined): Promise<Explained> {
  const c = await pool.connect();
  try {
    await c.query('begin');
    const res = await c.query<{ 'QUERY PLAN': string }>(`explain (analyze, buffers, costs off) ${text}`, params);
    await c.query('rollback');
    const plan = res.rows.map((r) => r['QUERY PLAN']);
    const ms = Number(/Execution Time: ([\d.]+) ms/.exec(plan.join('\n'))?.[1] ?? Number.NaN);
    return { ms, plan };
  } finally {
    c.release();
  }
}

/** Runs `text` in a rolled-back transaction and returns how many jobs it claimed. */
async function claimed(pool: pg.Pool, text: string, params: unknown[] | undefined): Promise<number> {
  const c = await pool.connect();
  try {
    await c.query('begin');
    const res = await c.query(text, params);
    await c.query('rollback');
    return res.rowCount ?? 0;
  } finally {
    c.release();
  }
}

async function main(): Promise<void> {
  const cleanup = new Cleanup();
  try {
    const server = await openBenchDatabase(cleanup);
    const db = await freshDatabase(server.url, cleanup, 'corral_plan');
    await migrateDatabase(db.url);
    const pool = new pg.Pool({ connectionString: db.url, max: 3 });
    cleanup.defer('close pool', () => pool.end());
    // pg-boss on a recording connection: the fetch statement it builds, with its parameters.
    let fetchSql: { text: string; values: unknown[] | undefined } | undefined;
    const boss = createBoss(db.url, DEFAULTS, {
      db: {
        executeSql: async (text: string, params?: unknown[]) => {
          if (text.includes('strict_fifo_heads')) fetchSql = { text, values: params };
          return pool.query(text, params);
        },
      },
    });
    await boss.start();
    cleanup.defer('stop pg-boss', () => boss.stop({ graceful: false, close: false }));
    await ensureQueues(boss, DEFAULTS);
    // The table as a running daemon leaves it: analyzed while small (autovacuum's view of a table
    // that just got its first rows), then a burst.
    await boss.fetch(DEFAULTS.queueName, { batchSize: DEFAULTS.fetchBatchSize });
    if (!fetchSql) throw new Error('no key_strict_fifo fetch statement captured');
    const { rows } = await pool.query<{ t: string }>('select table_name as t from pgboss.queue where name = $1', [DEFAULTS.queueName]);
    const table = `pgboss.${rows[0]!.t}`;
    const client = openDatabase(db.url, { max: 2 });
    cleanup.defer('close client', () => client.close());
    let queued = 0;
    process.stdout.write(
      `key_strict_fifo fetch (batch ${DEFAULTS.fetchBatchSize}) on ${table}, ${perActor} queued event(s) per actor, EXPLAIN ANALYZE, rolled back\n`,
    );
    const alt = values.alternative ? claimStatement('pgboss', rows[0]!.t) : undefined;
    const altValues = [DEFAULTS.queueName, DEFAULTS.fetchBatchSize];
    process.stdout.write(
      `backlog   reltuples before   stale stats ms   after ANALYZE ms${alt ? '   corral fetch: stale ms   after ANALYZE ms' : ''}\n`,
    );
    for (const target of backlogs) {
      while (queued < target) {
        const n = Math.min(5_000, target - queued);
        await sendEventsInBatches(
          client.db,
          Array.from({ length: n }, (_, i) => ({
            agentUid: `plan-${Math.floor((queued + i) / perActor)}`,
            sessionId: 's',
            data: { text: 'x' },
          })),
        );
        queued += n;
      }
      const rel = (await pool.query<{ n: number }>(`select reltuples::float8 as n from pg_class where oid = $1::regclass`, [table]))
        .rows[0]!.n;
      const stale = await explain(pool, fetchSql.text, fetchSql.values);
      const altStale = alt ? await explain(pool, alt, altValues) : undefined;
      await pool.query(`analyze ${table}`);
      const fresh = await explain(pool, fetchSql.text, fetchSql.values);
      const altFresh = alt ? await explain(pool, alt, altValues) : undefined;
      if (alt) {
        // Both statements claim the same number of jobs (each in a rolled-back transaction).
        const [a, b] = [await claimed(pool, fetchSql.text, fetchSql.values), await claimed(pool, alt, altValues)];
        if (a !== b) throw new Error(`corral's fetch claimed ${b} jobs, pg-boss's ${a}`);
      }
      process.stdout.write(
        `${String(target).padStart(7)}   ${String(rel).padStart(16)}   ${stale.ms.toFixed(1).padStart(14)}   ${fresh.ms.toFixed(1).padStart(16)}` +
          `${altStale && altFresh ? `   ${altStale.ms.toFixed(1).padStart(22)}   ${altFresh.ms.toFixed(1).padStart(16)}` : ''}\n`,
      );
      if (values.plans && altFresh)
        process.stdout.write(`\n-- ${target} queued, corral's fetch, after ANALYZE:\n${altFresh.plan.join('\n')}\n\n`);
      if (values.plans) {
        process.stdout.write(`\n-- ${target} queued, stale statistics:\n${stale.plan.join('\n')}\n`);
        process.stdout.write(`\n-- ${target} queued, after ANALYZE:\n${fresh.plan.join('\n')}\n\n`);
      }
      // The next level starts from statistics of this one, as autoanalyze would have left them.
    }
  } catch (e) {
    progress(`failed: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}`);
    process.exitCode = 1;
  } finally {
    await cleanup.run();
  }
}

await main();
