/**
 * drizzle/0002_boss_job_autovacuum.sql: the actor queue's pg-boss job table carries per-table
 * autovacuum settings once the queues exist (migrations run before pg-boss installs its schema,
 * so ensureQueues applies them), and the tuning function is idempotent and safe without pg-boss.
 */
import { describe, expect, it } from 'vitest';
import { useTestDatabase } from '../helpers/db.ts';

describe('pg-boss job table tuning', () => {
  const tdb = useTestDatabase();

  it('sets the autovacuum settings on the actor queue table', async () => {
    const { rows } = await tdb.client.query<{ t: string; opts: string[] | null }>(
      `select q.table_name as t, cl.reloptions as opts
         from pgboss.queue q join pg_class cl on cl.oid = format('pgboss.%I', q.table_name)::regclass
        where q.name = 'actor-events'`,
    );
    expect(rows[0]?.t).toBe('job_common');
    expect(rows[0]?.opts).toEqual(
      expect.arrayContaining([
        'autovacuum_analyze_scale_factor=0.01',
        'autovacuum_analyze_threshold=500',
        'autovacuum_vacuum_insert_scale_factor=0.02',
      ]),
    );
  });

  it('changes nothing when called again, and skips a schema that does not exist', async () => {
    expect((await tdb.client.query<{ n: number }>(`select corral.tune_boss_job_tables('pgboss') as n`)).rows[0]!.n).toBe(0);
    expect((await tdb.client.query<{ n: number }>(`select corral.tune_boss_job_tables('no_such_schema') as n`)).rows[0]!.n).toBe(0);
  });
});
