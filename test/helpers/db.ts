/**
 * A fresh database per test file, cloned from the run's template (real PostgreSQL). The database
 * of a failed test is not dropped but marked (a comment on the database) and named, for
 * inspection with psql; the run's teardown then keeps the embedded server's folder.
 * Databases created here and neither dropped nor kept are reported by the leak check.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { inject } from 'vitest';
import { maskUrl } from '../../src/config.ts';
import { KEPT_COMMENT, createDatabaseOn, type TestDatabase } from './databases.ts';
import { testFailed } from './failures.ts';

export { withDatabase, type TestDatabase } from './databases.ts';

const open = new Set<string>();

/** Test databases of this file neither dropped nor kept. */
export function undroppedDatabases(): string[] {
  return [...open];
}

/** A database cloned from the migrated template; with `empty`, one corral has never touched. */
export async function createTestDatabase(opts: { empty?: boolean } = {}): Promise<TestDatabase> {
  const serverUrl = inject('pgServerUrl');
  const name = `corral_t_${randomBytes(6).toString('hex')}`;
  const db = await createDatabaseOn(serverUrl, name, opts.empty ? undefined : inject('pgTemplate'));
  open.add(db.name);
  return {
    ...db,
    async drop() {
      open.delete(db.name);
      if (!testFailed()) return db.drop();
      const c = new pg.Client({ connectionString: serverUrl });
      await c.connect();
      await c.query(`comment on database ${db.name} is '${KEPT_COMMENT}'`).finally(() => c.end());
      console.error(`kept the database of a failed test: ${db.name} (${maskUrl(db.url)})`);
    },
  };
}
