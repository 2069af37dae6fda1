/**
 * A shard's SQL: corral's statements name shard 0's schemas (`corral.`, `"corral".`, `'corral'`,
 * and pg-boss's schema in the one migration that names it); a shard k > 0 runs the same
 * statements with its own schemas' names put in (src/base/shard-map.ts, S3).
 *
 *  Q1 Only whole schema names are replaced: the quoted identifier `"corral"`, a bare `corral`
 *     followed by a dot or after `SCHEMA`, and the literal `'corral'` (a schema looked up by name).
 *     `corral_producer` (a role of the cluster), `corral_migrations` and identifiers that merely
 *     contain the word are left as they are.
 *  Q2 Shard 0's text is never touched: `--shards 1` runs exactly the statements it ran before.
 *  Q3 Statements are a fixed set of texts: each rewritten text is kept, so a statement costs one
 *     lookup after its first run (the map is bounded; past its bound texts are rewritten again).
 */
import pg from 'pg';
import { BASE_SCHEMA, shardSchemas } from '../../base/shard-map.ts';

export type SqlRewrite = (text: string) => string;

/** Bound of Q3's map: far above corral's count of statement texts. */
const MAX_KEPT_TEXTS = 4096;

const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** Q1: the rewrite of shard `shard`'s statements (the identity for shard 0, Q2). */
export function shardSqlRewrite(shard: number, bossSchema: string): SqlRewrite {
  if (shard === 0) return (text) => text;
  const to = shardSchemas(shard, bossSchema);
  const rules: Array<[RegExp, string]> = [
    [new RegExp(`"${BASE_SCHEMA}"`, 'g'), `"${to.corral}"`],
    [new RegExp(`(?<![A-Za-z0-9_$."])${BASE_SCHEMA}\\.`, 'g'), `${to.corral}.`],
    [new RegExp(`\\bSCHEMA ${BASE_SCHEMA}\\b`, 'gi'), `SCHEMA ${to.corral}`],
    [new RegExp(`'${BASE_SCHEMA}'`, 'g'), `'${to.corral}'`],
    [new RegExp(`"${escape(bossSchema)}"`, 'g'), `"${to.boss}"`],
    [new RegExp(`(?<![A-Za-z0-9_$."])${escape(bossSchema)}\\.`, 'g'), `${to.boss}.`],
    [new RegExp(`'${escape(bossSchema)}'`, 'g'), `'${to.boss}'`],
  ];
  const kept = new Map<string, string>();
  return (text) => {
    const done = kept.get(text);
    if (done !== undefined) return done;
    let out = text;
    for (const [re, by] of rules) out = out.replace(re, by);
    if (kept.size < MAX_KEPT_TEXTS) kept.set(text, out);
    return out;
  };
}

const pgClient = pg.Client;

type QueryArg = string | { text: string } | undefined;

function rewriteQuery(q: QueryArg, rewrite: SqlRewrite): QueryArg {
  if (typeof q === 'string') return rewrite(q);
  // a submittable (pg's Query, a cursor) keeps its prototype: its text is rewritten in place
  if (q && typeof q === 'object' && typeof (q as { submit?: unknown }).submit === 'function' && typeof q.text === 'string') {
    q.text = rewrite(q.text);
    return q;
  }
  if (q && typeof q === 'object' && typeof q.text === 'string') return { ...q, text: rewrite(q.text) };
  return q;
}

/** `client` with every statement's text rewritten (for Drizzle's migrator and one-connection work). */
export function rewritingClient<C extends pg.ClientBase>(client: C, rewrite: SqlRewrite): C {
  return new Proxy(client, {
    get(target, prop) {
      if (prop === 'query') {
        return (q: QueryArg, ...rest: unknown[]) => (target.query as (...a: unknown[]) => unknown)(rewriteQuery(q, rewrite), ...rest);
      }
      const v: unknown = Reflect.get(target, prop, target);
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
    },
  });
}

/**
 * A `pg.Client` class whose statements are rewritten, for pools (`new pg.Pool({ Client })`):
 * corral's pool of a shard and that shard's pg-boss pool alike, so every connection of a shard's
 * runtime runs the shard's names (Q1), including statements a pooled client runs for `pool.query`.
 */
export function shardClientClass(rewrite: SqlRewrite): typeof pg.Client {
  return class ShardClient extends pgClient {
    override query(...args: unknown[]): never {
      const [q, ...rest] = args as [QueryArg, ...unknown[]];
      return (super.query as (...a: unknown[]) => never)(rewriteQuery(q, rewrite), ...rest);
    }
  };
}

/** The connection class of shard `shard`'s pools and clients. */
export const shardClientOf = (shard: number, bossSchema: string): typeof pg.Client => shardClientClass(shardSqlRewrite(shard, bossSchema));

/** The `{ executeSql }` adapter pg-boss takes, on `client`, with the shard's names put in. */
export function rewritingBossDb(client: pg.ClientBase, rewrite: SqlRewrite) {
  return {
    async executeSql(text: string, values?: unknown[]): Promise<{ rows: unknown[] }> {
      const r = await client.query(rewrite(text), values as unknown[] | undefined);
      return { rows: (r as { rows?: unknown[] }).rows ?? [] };
    },
  };
}
