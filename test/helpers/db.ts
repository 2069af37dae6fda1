/**
 * A fresh database per test file, cloned from the run's template (real PostgreSQL). The database
 * of a failed test is not dropped: its name is printed, for inspection with psql.
 */
import { randomBytes } from 'node:crypto';
import { inject } from 'vitest';
import { maskUrl } from '../../src/config.ts';
import { createDatabaseOn, type TestDatabase } from './databases.ts';
import { testFailed } from './failures.ts';

export { withDatabase, type TestDatabase } from './databases.ts';

export async function createTestDatabase(): Promise<TestDatabase> {
  const db = await createDatabaseOn(inject('pgServerUrl'), `corral_t_${randomBytes(6).toString('hex')}`, inject('pgTemplate'));
  return {
    ...db,
    async drop() {
      if (testFailed()) {
        console.error(`kept the database of a failed test: ${db.name} (${maskUrl(db.url)})`);
        return;
      }
      await db.drop();
    },
  };
}
