/** Creating and dropping throwaway databases on a PostgreSQL server (no test runner needed). */
import pg from 'pg';

export interface TestDatabase {
  url: string;
  name: string;
  drop(): Promise<void>;
}

/** The comment that marks the kept database of a failed test (see helpers/db.ts, global-setup.ts). */
export const KEPT_COMMENT = 'corral: kept, a test failed';

export function withDatabase(url: string, database: string): string {
  const u = new URL(url);
  u.pathname = `/${database}`;
  return u.toString();
}

async function admin<T>(serverUrl: string, fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = new pg.Client({ connectionString: serverUrl });
  await c.connect();
  try {
    return await fn(c);
  } finally {
    await c.end();
  }
}

/** Creates database `name` on the server of `serverUrl` (cloned from `template` if given). */
export async function createDatabaseOn(serverUrl: string, name: string, template?: string): Promise<TestDatabase> {
  await admin(serverUrl, (c) => c.query(`create database ${name}${template ? ` template ${template}` : ''}`));
  return {
    url: withDatabase(serverUrl, name),
    name,
    drop: () => admin(serverUrl, (c) => c.query(`drop database if exists ${name} with (force)`)).then(() => undefined),
  };
}
