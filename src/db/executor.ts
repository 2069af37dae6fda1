/**
 * Running one of corral's statements on a connection the caller owns, inside the caller's
 * transaction when it is in one (the client's `send(…, { db })`): a node-postgres `Client`,
 * `PoolClient` or `Pool`, a Drizzle database or transaction of any schema and driver, or an
 * `{ executeSql(text, values) }` adapter, as pg-boss takes.
 */
import type { SQL } from './orm.ts';

import type { PgQueryable, SqlAdapter, StatementTarget } from './views.ts';

export type { PgQueryable, SqlAdapter, DrizzleExecutable, StatementTarget } from './views.ts';

/** Drizzle's dialect, loaded on first use: `runText` alone (`corral send`) needs no Drizzle. */
let dialect: Promise<{ sqlToQuery(q: SQL): { sql: string; params: unknown[] } }> | undefined;
const dialectOf = () => (dialect ??= import('./orm.ts').then((m) => new m.PgDialect()));

function isFunction(v: unknown): v is (...args: unknown[]) => unknown {
  return typeof v === 'function';
}

function rowsOf(result: unknown): Record<string, unknown>[] {
  if (Array.isArray(result)) return result as Record<string, unknown>[];
  const rows = (result as { rows?: unknown } | null | undefined)?.rows;
  return Array.isArray(rows) ? (rows as Record<string, unknown>[]) : [];
}

/** Whether `v` is something `runStatement` can run on. */
export function isStatementTarget(v: unknown): v is StatementTarget {
  if (v === null || typeof v !== 'object') return false;
  const o = v as Record<string, unknown>;
  return isFunction(o.executeSql) || isFunction(o.query) || isFunction(o.execute);
}

/**
 * Runs `query` on `target` and returns its rows. A Drizzle handle on node-postgres runs it on
 * the connection it holds (its transaction's), so a Drizzle of another copy or version works too;
 * on another driver it goes through its `execute`.
 */
export async function runStatement(target: StatementTarget, query: SQL): Promise<Record<string, unknown>[]> {
  const t = target as unknown as Record<string, unknown>;
  if (!isFunction(t.executeSql) && !isFunction(t.query) && !clientOf(t) && isFunction(t.execute)) {
    return rowsOf(await (target as { execute(q: SQL): PromiseLike<unknown> }).execute(query));
  }
  const { sql: text, params } = (await dialectOf()).sqlToQuery(query);
  return runText(target, text, params);
}

/** Runs statement `text` with `params` ($1, $2 …) on `target`, as `runStatement` does, and returns its rows. */
export async function runText(target: StatementTarget, text: string, params: readonly unknown[]): Promise<Record<string, unknown>[]> {
  const t = target as unknown as Record<string, unknown>;
  if (isFunction(t.executeSql)) return rowsOf(await (target as SqlAdapter).executeSql(text, [...params]));
  if (isFunction(t.query)) return rowsOf(await (target as PgQueryable).query(text, [...params]));
  const client = clientOf(t);
  if (client) return rowsOf(await client.query(text, [...params]));
  if (isFunction(t.execute)) {
    // a Drizzle handle on another driver: the text as a Drizzle statement with the same parameters
    const { sql } = await import('./orm.ts');
    const parts = text.split(/\$\d+/);
    const order = [...text.matchAll(/\$(\d+)/g)].map((m) => params[Number(m[1]) - 1]);
    const strings = Object.assign([...parts], { raw: [...parts] }) as unknown as TemplateStringsArray;
    return rowsOf(await (target as { execute(q: SQL): PromiseLike<unknown> }).execute(sql(strings, ...order)));
  }
  throw new TypeError('not a database connection: expected a pg Client or PoolClient, a Drizzle transaction, or { executeSql }');
}

/** The node-postgres client a Drizzle handle holds, if it holds one. */
function clientOf(t: Record<string, unknown>): PgQueryable | undefined {
  const client = (t.session as { client?: unknown } | undefined)?.client as Record<string, unknown> | undefined;
  return client && isFunction(client.query) ? (client as unknown as PgQueryable) : undefined;
}
