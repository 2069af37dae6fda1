/**
 * Connections to the shards of a deployment, by shard number, for work that reaches another shard
 * than the one a runtime serves (the relay of cross-shard emits): each shard's pool runs its
 * statements with the shard's schema names (shardClientClass), at the database the catalog's map
 * names for it (null: the catalog's own).
 *
 *  P1 A pool is opened on first use and kept (small: a relay is one statement at a time per target).
 *  P2 The map is read again when asked (`reload`): a shard moved by `corral shards set-url` is
 *     reached at its new URL by the next delivery, and its old pool is closed.
 */
import pg from 'pg';
import { shardClientOf } from './shard-sql.ts';
import { readShardLayout, readShardMap, type ShardMapEntry } from './catalog.ts';
import { shardOf } from '../../base/shard-map.ts';

export interface ShardPoolsOptions {
  catalogUrl: string;
  bossSchema: string;
  /** Connections per shard's pool. */
  max?: number;
  onError?: (err: Error) => void;
}

export class ShardPools {
  private readonly opts: ShardPoolsOptions;
  private map = new Map<number, string | null>();
  private readonly pools = new Map<number, { url: string; pool: pg.Pool }>();

  constructor(opts: ShardPoolsOptions, map: readonly ShardMapEntry[] = []) {
    this.opts = opts;
    for (const e of map) this.map.set(e.shard, e.url);
  }

  /** P2: the catalog's map, read again; pools of moved shards are closed. */
  async reload(): Promise<void> {
    const client = new pg.Client({ connectionString: this.opts.catalogUrl, application_name: 'corral-shards' });
    client.on('error', (e) => this.opts.onError?.(e));
    await client.connect();
    try {
      this.map = new Map((await readShardMap(client)).map((e) => [e.shard, e.url]));
    } finally {
      await client.end().catch(() => undefined);
    }
    for (const [shard, open] of this.pools) {
      if (this.urlOf(shard) !== open.url) {
        this.pools.delete(shard);
        void open.pool.end().catch(() => undefined);
      }
    }
  }

  /** The database URL of `shard` (the catalog's when the map names none). */
  urlOf(shard: number): string {
    return this.map.get(shard) ?? this.opts.catalogUrl;
  }

  /** P1: the pool of `shard`. */
  poolOf(shard: number): pg.Pool {
    const url = this.urlOf(shard);
    const open = this.pools.get(shard);
    if (open && open.url === url) return open.pool;
    const pool = new pg.Pool({
      connectionString: url,
      Client: shardClientOf(shard, this.opts.bossSchema),
      max: this.opts.max ?? 2,
      application_name: 'corral-shard-relay',
      connectionTimeoutMillis: 10_000,
      idleTimeoutMillis: 30_000,
      // a client checked out has no pool listener: a server that goes away mid-statement must
      // not end the process (the statement fails on its own, and the relay backs off)
      onConnect: (client) => {
        client.on('error', (e) => this.opts.onError?.(e));
      },
    });
    pool.on('error', (e) => this.opts.onError?.(e));
    this.pools.set(shard, { url, pool });
    return pool;
  }

  async close(): Promise<void> {
    const open = [...this.pools.values()];
    this.pools.clear();
    await Promise.all(open.map((o) => o.pool.end().catch(() => undefined)));
  }
}

/**
 * A connection to the shard `key` lives on, found through the catalog (`catalog`, at
 * `catalogUrl`): for a sender the catalog's enqueue refused (`wrong_shard`). Its statements name
 * the shard's schemas. The caller ends it.
 */
export async function connectShardOf(
  catalog: pg.ClientBase,
  catalogUrl: string,
  key: { agentUid: string; sessionId: string },
  bossSchema: string,
  applicationName = 'corral',
): Promise<pg.Client> {
  const layout = await readShardLayout(catalog, catalogUrl);
  const shard = shardOf(key, layout.shardCount);
  const Client = shardClientOf(shard, bossSchema);
  const client = new Client({ connectionString: layout.urlOf(shard), application_name: applicationName, connectionTimeoutMillis: 10_000 });
  // its statement fails on its own when the server goes away; the event must not end the process
  client.on('error', () => undefined);
  await client.connect();
  return client;
}
