/**
 * Storage settings of pg-boss's job tables (drizzle/0002_boss_job_autovacuum.sql defines the
 * function): pg-boss creates its tables after corral's migrations ran, so the daemon applies them
 * once its queues exist.
 */

/** What runs a statement for pg-boss: `boss.getDb()`, or a `db` given to pg-boss. */
export interface BossSqlExecutor {
  executeSql(text: string, values?: unknown[]): Promise<unknown>;
}

/** Applies corral's autovacuum and analyze settings to the job tables of `bossSchema`. */
export async function tuneBossJobTables(db: BossSqlExecutor, bossSchema: string): Promise<void> {
  await db.executeSql('select corral.tune_boss_job_tables($1)', [bossSchema]);
}
