/** A fresh database per test file, cloned from the run's template (real PostgreSQL). */
import { randomBytes } from 'node:crypto';
import { inject } from 'vitest';
import { createDatabaseOn, type TestDatabase } from './databases.ts';

export { withDatabase, type TestDatabase } from './databases.ts';

export function createTestDatabase(): Promise<TestDatabase> {
  return createDatabaseOn(inject('pgServerUrl'), `corral_t_${randomBytes(6).toString('hex')}`, inject('pgTemplate'));
}
