/**
 * Named (prepared) statements for the turn's hot path. PostgreSQL parses and plans an unnamed
 * statement on every call; a named one is prepared once per connection and reused, which on a
 * busy daemon is a good part of the server time per turn (see docs/benchmarks.md).
 *
 * The statement is still written with Drizzle's `sql` template; only its execution goes to the
 * connection the caller's transaction holds, with a name. A name must always carry the same text.
 */
import { PgDialect, type SQL } from './orm.ts';
import type { QueryResultRow } from 'pg';
import type { DbOrTx } from './client.ts';

const dialect = new PgDialect();

/** What runs a named (prepared) statement: a pg Pool or Client. */
export interface Queryable {
  query<R extends QueryResultRow>(config: { name: string; text: string; values: unknown[] }): Promise<{ rows: R[] }>;
}

/** The pg client (inside a transaction) or pool behind a Drizzle handle. */
function connectionOf(dbOrTx: DbOrTx): Queryable | undefined {
  const client = (dbOrTx as unknown as { session?: { client?: unknown } }).session?.client as Partial<Queryable> | undefined;
  return client && typeof client.query === 'function' ? (client as Queryable) : undefined;
}

export async function executeNamed<R extends QueryResultRow>(dbOrTx: DbOrTx, name: string, query: SQL): Promise<R[]> {
  const connection = connectionOf(dbOrTx);
  if (!connection) return (await dbOrTx.execute<R>(query)).rows as R[];
  const { sql: text, params } = dialect.sqlToQuery(query);
  return (await connection.query<R>({ name, text, values: params })).rows;
}
