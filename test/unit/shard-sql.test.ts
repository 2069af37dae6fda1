/** Q1–Q3 of src/db/shards/shard-sql.ts: which names a shard's statements get. */
import { describe, expect, it } from 'vitest';
import { shardSqlRewrite } from '../../src/db/shards/shard-sql.ts';

describe("a shard's SQL", () => {
  const s2 = shardSqlRewrite(2, 'pgboss');

  it('puts in the shard schemas for every way a statement names them', () => {
    expect(s2('select 1 from corral.turns t join "corral"."messages" m on true')).toBe(
      'select 1 from corral_s2.turns t join "corral_s2"."messages" m on true',
    );
    expect(s2('CREATE SCHEMA "corral";')).toBe('CREATE SCHEMA "corral_s2";');
    expect(s2('GRANT USAGE ON SCHEMA corral TO corral_producer')).toBe('GRANT USAGE ON SCHEMA corral_s2 TO corral_producer');
    expect(s2("where n.nspname = 'corral'")).toBe("where n.nspname = 'corral_s2'");
    expect(s2("insert into pgboss.job select corral.tune_boss_job_tables('pgboss')")).toBe(
      "insert into pgboss_s2.job select corral_s2.tune_boss_job_tables('pgboss_s2')",
    );
  });

  it('leaves alone what only contains the word', () => {
    for (const text of [
      'select 1 from drizzle.corral_migrations',
      "has_schema_privilege('corral_producer', x, 'USAGE')",
      'select my_corral.x, t.corral_id, "corral_x".y, xpgboss.job',
      "select 'corral is a runtime'",
    ]) {
      expect(s2(text)).toBe(text);
    }
  });

  it('is the identity on shard 0, and the same text twice is one rewrite', () => {
    const s0 = shardSqlRewrite(0, 'pgboss');
    const text = 'select * from corral.turns, pgboss.job';
    expect(s0(text)).toBe(text);
    expect(s2(text)).toBe(s2(text));
    expect(s2(text)).toBe('select * from corral_s2.turns, pgboss_s2.job');
  });
});
