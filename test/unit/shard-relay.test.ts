/** The relay's pure parts (src/runtime/shard-relay.ts): R1's choice of rows, R3's backoff. */
import { describe, expect, it } from 'vitest';
import { backoffDelayMs, rowsToDeliver } from '../../src/runtime/shard-relay.ts';
import type { PendingShardEmit } from '../../src/db/shards/shard-emits.ts';

let id = 0;
const row = (targetShard: number, sessionId: string): PendingShardEmit => ({
  id: ++id,
  targetShard,
  eventId: `e-${id}`,
  agentUid: 'a',
  sessionId,
  data: {},
  attempts: 0,
});

describe('rowsToDeliver (R1)', () => {
  it('takes each actor’s first row only, per target, in commit order', () => {
    const rows = [row(1, 'x'), row(1, 'y'), row(1, 'x'), row(2, 'z'), row(2, 'z'), row(1, 'y')];
    const out = rowsToDeliver(rows, new Set());
    expect([...out.keys()]).toEqual([1, 2]);
    expect(out.get(1)!.map((r) => [r.sessionId, r.id])).toEqual([
      ['x', rows[0]!.id],
      ['y', rows[1]!.id],
    ]);
    expect(out.get(2)!.map((r) => r.id)).toEqual([rows[3]!.id]);
  });

  it('leaves out a backed-off target, and never takes a later row of an actor before its first', () => {
    const rows = [row(3, 'x'), row(1, 'y'), row(3, 'x')];
    const out = rowsToDeliver(rows, new Set([3]));
    expect([...out.keys()]).toEqual([1]);
    expect(out.get(1)!.map((r) => r.sessionId)).toEqual(['y']);
  });

  it('delivers nothing of nothing', () => {
    expect(rowsToDeliver([], new Set()).size).toBe(0);
  });
});

describe('backoffDelayMs (R3)', () => {
  it('doubles from 1 s to at most 60 s', () => {
    expect([1, 2, 3, 4, 5, 6, 7, 8, 20].map(backoffDelayMs)).toEqual([1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000, 60000]);
    expect(backoffDelayMs(0)).toBe(1000);
  });
});
