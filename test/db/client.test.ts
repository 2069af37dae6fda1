/**
 * The daemon's pool: every connection plans corral's named statements once (a generic plan),
 * as they are written for; a session setting, so it also works behind a connection pooler. On
 * the embedded server, connections go through its Unix-domain socket.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { openDatabase, type Database } from '../../src/db/client.ts';
import { useTestDatabase } from '../helpers/db.ts';

describe('database pool', () => {
  const tdb = useTestDatabase();
  let d: Database | undefined;

  afterEach(async () => {
    await d?.close();
  });

  it('gives named statements a generic plan on every connection', async () => {
    d = openDatabase(tdb.url, { max: 3 });
    const clients = await Promise.all([d.pool.connect(), d.pool.connect(), d.pool.connect()]);
    try {
      for (const c of clients) {
        expect((await c.query<{ plan_cache_mode: string }>('show plan_cache_mode')).rows[0]!.plan_cache_mode).toBe('force_generic_plan');
      }
    } finally {
      for (const c of clients) c.release();
    }
  });

  it.skipIf(process.env.DATABASE_URL !== undefined)('reaches the embedded server through its Unix-domain socket', async () => {
    expect(decodeURIComponent(new URL(tdb.url).hostname)).toMatch(/^\/.*\/run$/);
    d = openDatabase(tdb.url);
    const r = await d.pool.query<{ addr: string | null; dirs: string }>(
      `select inet_client_addr() as addr, current_setting('unix_socket_directories') as dirs`,
    );
    expect(r.rows[0]).toEqual({ addr: null, dirs: decodeURIComponent(new URL(tdb.url).hostname) });
  });
});
