/**
 * The database handle: a pg Pool wrapped by Drizzle. `Db` is the pool-level handle, `Tx` a
 * transaction; query modules take `DbOrTx` first so callers can compose them in one transaction.
 */
import pg from 'pg';
import { drizzle, type ExtractTablesWithRelations, type NodePgDatabase, type NodePgQueryResultHKT, type PgTransaction } from './orm.ts';
import * as schema from './schema.ts';

export type Schema = typeof schema;
export type Db = NodePgDatabase<Schema> & { $client: pg.Pool };
export type Tx = PgTransaction<NodePgQueryResultHKT, Schema, ExtractTablesWithRelations<Schema>>;
export type DbOrTx = Db | Tx;

export interface Database {
  db: Db;
  pool: pg.Pool;
  url: string;
  close(): Promise<void>;
}

export interface OpenOptions {
  max?: number;
  applicationName?: string;
  /** Called for errors on idle clients (e.g. the server restarted); must not throw. */
  onError?: (err: Error) => void;
  /** The pool's client class: a shard's, whose statements name the shard's schemas (src/db/shards/shard-sql.ts). */
  Client?: typeof pg.Client;
}

/**
 * corral's named statements (src/db/prepared.ts) are written for a generic plan (ids arrive as
 * arrays, batches as one JSON recordset): planning them once per connection is the point of
 * naming them. PostgreSQL's default would plan each one again on every call while it judges the
 * generic plan costlier than its custom ones, which for these statements it always does. The
 * setting reaches every parameterised statement of the connection, Drizzle's unnamed ones too: a
 * condition that a partial index must prove (a status among the live ones) is written with
 * literals, never parameters (src/db/turns/activations.ts; test/db/periodic-plans.test.ts explains the
 * periodic statements on a large history and fails on a sequential scan). Set per session rather
 * than as a startup option, which connection poolers such as PgBouncer refuse.
 */
const GENERIC_PLANS = 'set plan_cache_mode = force_generic_plan';

export function openDatabase(url: string, opts: OpenOptions = {}): Database {
  const pool = new pg.Pool({
    connectionString: url,
    ...(opts.Client ? { Client: opts.Client } : {}),
    max: opts.max ?? 10,
    application_name: opts.applicationName ?? 'corral',
    connectionTimeoutMillis: 10_000,
    idleTimeoutMillis: 30_000,
    // Runs before the pool hands a new client out, so the caller's first statement does not queue
    // behind this one on a busy client (which pg deprecates).
    onConnect: async (client) => {
      // A client checked out by a transaction has no pool listener: when the server goes away
      // between two statements its 'error' event would be unhandled and end the process. The
      // statement in flight fails on its own (and is retried by the caller); this only keeps the
      // process alive.
      client.on('error', (err) => opts.onError?.(err));
      // should it fail, statements are planned as before (and the next statement reports a lost server)
      await client.query(GENERIC_PLANS).catch(() => undefined);
    },
  });
  // Without a listener an idle client's error (server restart) would crash the process.
  pool.on('error', (err) => opts.onError?.(err));
  const db = drizzle(pool, { schema }) as Db;
  let closed = false;
  return {
    db,
    pool,
    url,
    async close() {
      if (closed) return;
      closed = true;
      await pool.end();
    },
  };
}
