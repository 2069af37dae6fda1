/**
 * A fresh database per test file, cloned from the run's template (real PostgreSQL). The database
 * of a failed test is not dropped but marked (a comment on the database) and named, for
 * inspection with psql; the run's teardown then keeps the embedded server's folder.
 * Databases created here and neither dropped nor kept are reported by the leak check.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, inject } from 'vitest';
import { openDatabase, type Database } from '../../src/db/client.ts';
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

/** The test database of a file (`useTestDatabase`), ready once the file's `beforeAll` ran. */
export interface TestDatabaseFixture {
  /** Its URL and name. */
  readonly url: string;
  readonly name: string;
  /** A pool on it (Drizzle's `db`, pg's `pool`), open for the whole file. */
  readonly database: Database;
  /** One connected pg client on it, for the file's own queries. */
  readonly client: pg.Client;
}

/**
 * The one test-database fixture: a fresh database for the file (cloned from the migrated
 * template; `empty`: one corral never touched), with a pool and a client on it, made in
 * `beforeAll` and closed and dropped in `afterAll` (kept when a test failed). Call it at the top
 * level of a file, or of a `describe`.
 */
export function useTestDatabase(opts: { empty?: boolean; connections?: number } = {}): TestDatabaseFixture {
  let db: TestDatabase | undefined;
  let database: Database | undefined;
  let client: pg.Client | undefined;
  beforeAll(async () => {
    db = await createTestDatabase(opts.empty ? { empty: true } : {});
    database = openDatabase(db.url, { max: opts.connections ?? 2, applicationName: 'corral-test' });
    client = new pg.Client({ connectionString: db.url });
    await client.connect();
  });
  afterAll(async () => {
    await client?.end().catch(() => undefined);
    await database?.close();
    await db?.drop();
  });
  const ready = <T>(v: T | undefined, what: string): T => {
    if (v === undefined) throw new Error(`the test database's ${what} is used before the file's beforeAll ran`);
    return v;
  };
  return {
    get url() {
      return ready(db, 'url').url;
    },
    get name() {
      return ready(db, 'name').name;
    },
    get database() {
      return ready(database, 'pool');
    },
    get client() {
      return ready(client, 'client');
    },
  };
}

/** Fresh test databases for the tests of a file (`useTestDatabases`): each dropped after its test. */
export interface TestDatabases {
  /** A new database for the running test (`empty`: one corral never touched). */
  fresh(opts?: { empty?: boolean }): Promise<TestDatabase>;
}

/**
 * For a file whose tests each need a database of their own (a daemon's first start, a crash):
 * `fresh()` makes one, dropped after the test that made it (kept when it failed).
 */
export function useTestDatabases(): TestDatabases {
  const made: TestDatabase[] = [];
  afterEach(async () => {
    for (const db of made.splice(0)) await db.drop();
  });
  return {
    async fresh(opts = {}) {
      const db = await createTestDatabase(opts);
      made.push(db);
      return db;
    },
  };
}
