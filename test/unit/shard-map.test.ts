/**
 * The actor key → shard map (S1 of src/base/shard-map.ts): fixed vectors (as docs/scaling.md
 * lists them, for implementations in other languages), the same numbers from Python's hashlib,
 * an even spread, and the schema names of S3.
 */
import { spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { MAX_SHARDS, checkShardCount, servedShards, shardOf, shardSchemas } from '../../src/base/shard-map.ts';

/** agent_uid, session_id, uint32 of the digest's first 4 bytes, shard of 2, 4, 16, 1024. */
const VECTORS: Array<[string, string, number, number[]]> = [
  ['agent', 's-1', 3885751688, [0, 0, 8, 392]],
  ['support-bot', 'user-42', 3017092082, [0, 2, 2, 1010]],
  ['a', 'b', 3243040192, [0, 0, 0, 448]],
  ['tenant.a:x@y', 'Z_9-1', 1447093070, [0, 2, 14, 846]],
];

describe('shard map', () => {
  it('gives the documented shards', () => {
    for (const [agent, session, word, shards] of VECTORS) {
      expect([2, 4, 16, 1024].map((n) => shardOf(actorKey(agent, session), n))).toEqual(shards);
      expect(shardOf(actorKey(agent, session), 1)).toBe(0);
      expect(word % 4).toBe(shards[1]);
    }
  });

  it('is what another language computes from the rule alone (Python hashlib)', () => {
    const keys = Array.from({ length: 50 }, (_, i) => actorKey(`agent-${i % 7}`, `session-${i * 7919}`));
    const script = [
      'import hashlib, json, sys',
      'keys = json.load(sys.stdin)',
      'print(json.dumps([int.from_bytes(hashlib.sha256((a + "/" + s).encode()).digest()[:4], "big") % 13 for a, s in keys]))',
    ].join('\n');
    const r = spawnSync('python3', ['-c', script], { input: JSON.stringify(keys.map((k) => [k.agentUid, k.sessionId])), encoding: 'utf8' });
    expect(r.status, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout)).toEqual(keys.map((k) => shardOf(k, 13)));
  });

  it('spreads keys evenly', () => {
    const counts = new Array<number>(8).fill(0);
    for (let i = 0; i < 40_000; i++) counts[shardOf(actorKey('agent', `s${i}`), 8)]! += 1;
    for (const n of counts) expect(Math.abs(n - 5_000)).toBeLessThan(400);
  });

  it('names shard 0 as today and shard k with a suffix; refuses bad numbers', () => {
    expect(shardSchemas(0, 'pgboss')).toEqual({ corral: 'corral', boss: 'pgboss' });
    expect(shardSchemas(3, 'pgboss')).toEqual({ corral: 'corral_s3', boss: 'pgboss_s3' });
    expect(shardSchemas(1023, 'jobs')).toEqual({ corral: 'corral_s1023', boss: 'jobs_s1023' });
    for (const bad of [-1, 1.5, MAX_SHARDS, Number.NaN]) expect(() => shardSchemas(bad, 'pgboss')).toThrow(/invalid shard/);
    for (const bad of [0, -2, 1025, 2.5]) expect(() => checkShardCount(bad)).toThrow(/invalid shard count/);
    expect(() => shardOf(actorKey('a', 'b'), 0)).toThrow(/invalid shard count/);
  });
});

describe('servedShards (corral daemon --shards)', () => {
  it('reads all, or a list, ascending', () => {
    expect(servedShards('all', 4)).toEqual([0, 1, 2, 3]);
    expect(servedShards('all', 1)).toEqual([0]);
    expect(servedShards('3,0', 4)).toEqual([0, 3]);
    expect(servedShards('0', 1)).toEqual([0]);
  });

  it('refuses a shard past the count, one named twice, and anything else', () => {
    expect(() => servedShards('4', 4)).toThrow(/no shard 4: the deployment has 4 shards \(0 to 3\)/);
    expect(() => servedShards('1', 1)).toThrow(/no shard 1: the deployment has 1 shard \(0 to 0\)/);
    expect(() => servedShards('1,1', 4)).toThrow(/names a shard twice/);
    for (const bad of ['', ' all', '1,', ',1', '-1', '1;2', 'ALL', '12345', '1, 2'])
      expect(() => servedShards(bad, 4), bad).toThrow(expect.objectContaining({ code: 'invalid_config' }));
  });
});
