-- Keep the planner's statistics of pg-boss's job table fresh for the actor queue.
--
-- The key_strict_fifo fetch (pg-boss's strict_fifo_heads CTE: DISTINCT ON (singleton_key) over
-- every queued job) is planned from the job table's statistics. On stale ones (a table analyzed
-- while small, or never analyzed) PostgreSQL can pick a nested-loop semi join over the heads CTE,
-- quadratic in the backlog: 9.9 s per fetch at 10,000 queued events against 25 ms after ANALYZE
-- (bench/fetch-plan.ts, docs/benchmarks.md). PostgreSQL's defaults re-analyze a table after 10 %
-- of it changed; a long-lived job table of millions of retained rows then plans a burst on old
-- statistics for a long time. These per-table settings re-analyze after 1 % + 500 rows and vacuum
-- (visibility map, for job_i10's index-only scan) after 2 % + 500 rows.
--
-- pg-boss's schema is created after corral's migrations (src/daemon.ts: migrations, then
-- pg-boss), and the queue's table is known only once the queue exists. So this migration creates
-- a function that tunes whatever exists, calls it now (a database where pg-boss is installed
-- already), and src/queue/boss.ts ensureQueues() calls it again after creating the queues. A
-- missing schema or table is skipped: safe in either order, and idempotent.
CREATE OR REPLACE FUNCTION "corral"."tune_boss_job_tables"(boss_schema text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
  opts constant text[] := ARRAY[
    'autovacuum_analyze_scale_factor=0.01',
    'autovacuum_analyze_threshold=500',
    'autovacuum_vacuum_scale_factor=0.02',
    'autovacuum_vacuum_insert_scale_factor=0.02',
    'autovacuum_vacuum_threshold=500',
    'autovacuum_vacuum_insert_threshold=500'
  ];
  t text;
  rel regclass;
  tuned integer := 0;
BEGIN
  IF to_regclass(format('%I.queue', boss_schema)) IS NULL THEN
    RETURN 0;
  END IF;
  FOR t IN EXECUTE format('SELECT DISTINCT table_name FROM %I.queue WHERE policy = %L', boss_schema, 'key_strict_fifo')
  LOOP
    rel := to_regclass(format('%I.%I', boss_schema, t));
    CONTINUE WHEN rel IS NULL;
    -- ALTER TABLE … SET takes a SHARE UPDATE EXCLUSIVE lock: skip it when nothing would change.
    CONTINUE WHEN (SELECT coalesce(reloptions, '{}') @> opts FROM pg_class WHERE oid = rel);
    EXECUTE format('ALTER TABLE %s SET (%s)', rel, array_to_string(opts, ', '));
    tuned := tuned + 1;
  END LOOP;
  RETURN tuned;
END
$$;
--> statement-breakpoint
SELECT "corral"."tune_boss_job_tables"('pgboss');
