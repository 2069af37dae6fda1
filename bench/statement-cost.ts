/**
 * Micro-benchmark: the client-side CPU cost of one SQL statement through `pg`, through drizzle,
 * and through a drizzle prepared statement, on an embedded PostgreSQL (see docs/benchmarks.md,
 * "Where the time goes"). Useful to check a change to corral's hot path statements.
 *
 *   node bin/run-ts.js bench/statement-cost.ts [count]
 */
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { eq, sql } from '../src/db/orm.ts';
import { openDatabase } from '../src/db/client.ts';
import { ensureEmbeddedPostgres, stopEmbeddedPostgres } from '../src/db/postgres/embedded.ts';
import { migrateDatabase } from '../src/db/migrate.ts';
import { deliveries } from '../src/db/schema.ts';

const N = Number(process.argv[2] ?? 3000);
const ID = '00000000-0000-0000-0000-000000000000';

const home = await mkdtemp(join(tmpdir(), 'corral-stmt-'));
await chmod(home, 0o755);
try {
  const server = await ensureEmbeddedPostgres({ homeDir: home, ephemeral: true, database: 'stmt' });
  await migrateDatabase(server.url);
  const d = openDatabase(server.url, { max: 20, applicationName: 'corral-bench' });
  try {
    const measure = async (name: string, concurrency: number, fn: () => Promise<unknown>) => {
      for (let i = 0; i < 200; i++) await fn(); // warm-up
      const c0 = process.cpuUsage();
      const t0 = performance.now();
      let left = N;
      await Promise.all(
        Array.from({ length: concurrency }, async () => {
          while (left-- > 0) await fn();
        }),
      );
      const wall = performance.now() - t0;
      const c = process.cpuUsage(c0);
      console.log(
        `${name.padEnd(34)} concurrency ${String(concurrency).padStart(2)}: ${((N * 1000) / wall).toFixed(0).padStart(5)}/s, ` +
          `${((c.user + c.system) / N).toFixed(0).padStart(4)} µs CPU per call`,
      );
    };
    const prepared = d.db
      .select()
      .from(deliveries)
      .where(eq(deliveries.deliveryId, sql.placeholder('id')))
      .prepare('bench_select_delivery');
    for (const concurrency of [1, 20]) {
      await measure('pg: select 1', concurrency, () => d.pool.query('select 1'));
      await measure('pg: parameterised select by pk', concurrency, () =>
        d.pool.query('select * from corral.deliveries where delivery_id = $1', [ID]),
      );
      await measure('drizzle: select row by pk', concurrency, () => d.db.select().from(deliveries).where(eq(deliveries.deliveryId, ID)));
      await measure('drizzle: same, prepared', concurrency, () => prepared.execute({ id: ID }));
      await measure('drizzle: update by pk', concurrency, () =>
        d.db
          .update(deliveries)
          .set({ state: 'sent', updatedAt: sql`now()` })
          .where(eq(deliveries.deliveryId, ID)),
      );
      await measure('drizzle: tx (begin, select, commit)', concurrency, () =>
        d.db.transaction(async (tx) => {
          await tx.select().from(deliveries).where(eq(deliveries.deliveryId, ID));
        }),
      );
    }
  } finally {
    await d.close();
  }
} finally {
  await stopEmbeddedPostgres(home).catch(() => false);
  await rm(home, { recursive: true, force: true });
}
