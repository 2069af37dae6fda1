/**
 * Dead-letter operations in mode `continue` (the failed original is deleted when dead-lettered),
 * in-process against dead letters made by the real runtime: filters and paging, show, replay
 * (order, original ids, idempotence, racing replays), discard and the action record.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from '../../src/db/orm.ts';
import type { PgBoss } from 'pg-boss';
import { actorKey } from '../../src/base/actor-key.ts';
import { DEFAULTS } from '../../src/config.ts';
import {
  discardDeadLetters,
  listDeadLetters,
  replayDeadLetters,
  showDeadLetter,
  type DeadLetter,
  type OpsDeps,
} from '../../src/ops/dead-letters.ts';
import { queuesOf } from '../../src/queue/boss.ts';
import { createBoss } from '../../src/queue/boss.ts';
import { CorralError } from '../../src/base/errors.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { waitFor } from '../helpers/wait.ts';
import { deadLetterCount, makeDeadLetters, startFailingRuntime } from './helpers.ts';

const A = actorKey('ops-a', 's1');
const B = actorKey('ops-b', 's1');
const C = actorKey('ops-c', 's1');
const q = queuesOf(DEFAULTS);

describe('dead-letter operations (mode continue)', () => {
  const tdb = useTestDatabase({ connections: 4 });
  let boss: PgBoss;
  let deps: OpsDeps;
  let a: string[];
  let b: string;
  let c: string;
  let all: DeadLetter[];
  const db = () => tdb.database.db;
  const idOf = (eventId: string) => all.find((d) => d.eventId === eventId)!.id;
  const jobsOf = async (ids: string[]) =>
    (
      await db().execute<{ id: string; state: string }>(
        sql`select id, state::text as state from pgboss.job where name = 'actor-events' and id = any(${sql.param(ids)}::uuid[])
            order by created_on, id`,
      )
    ).rows;

  beforeAll(async () => {
    const ids = await makeDeadLetters(tdb, [
      { key: A, payload: { fail: true, n: 1 } },
      { key: A, payload: { fail: true, n: 2 } },
      { key: A, payload: { fail: true, n: 3 } },
      { key: B, payload: { fail: true, failCode: 'Boom_Special' } },
      { key: C, payload: { fail: true, n: 'c' } },
    ]);
    [a, b, c] = [ids.slice(0, 3), ids[3]!, ids[4]!];
    boss = createBoss(tdb.url, DEFAULTS, { max: 4 });
    await boss.start();
    deps = { db: tdb.database.db, boss, queues: q };
    all = await listDeadLetters(db(), q, {});
  });

  afterAll(async () => {
    await boss?.stop({ graceful: false, close: true });
  });

  it('lists every dead letter with its event, actor, attempts and last error; the originals are gone', async () => {
    expect(all.map((d) => d.eventId).sort()).toEqual([...a, b, c].sort());
    const d = all.find((x) => x.eventId === b)!;
    expect(d).toMatchObject({ actor: 'ops-b/s1', agentUid: 'ops-b', sessionId: 's1', attempts: 1 });
    expect(d.payload).toEqual({ fail: true, failCode: 'Boom_Special' });
    expect(d.lastError).toMatchObject({ error: { code: 'Boom_Special', message: 'example worker asked to fail' } });
    expect(d.failedAt.getTime()).toBeGreaterThanOrEqual(d.enqueuedAt!.getTime());
    expect(await jobsOf([...a, b, c])).toEqual([]);
  });

  it('filters by actor, error text (any case) and age, and pages with limit/after', async () => {
    expect((await listDeadLetters(db(), q, { actor: A })).map((d) => d.eventId)).toEqual(a);
    expect((await listDeadLetters(db(), q, { error: 'boom_SPECIAL' })).map((d) => d.eventId)).toEqual([b]);
    expect(await listDeadLetters(db(), q, { error: 'no such error' })).toEqual([]);
    expect(await listDeadLetters(db(), q, { sinceMs: 3_600_000 })).toHaveLength(5);
    expect(await listDeadLetters(db(), q, { sinceMs: 1 })).toEqual([]);
    const page1 = await listDeadLetters(db(), q, {}, { limit: 2 });
    const page2 = await listDeadLetters(db(), q, {}, { limit: 2, after: page1[1]!.id });
    const page3 = await listDeadLetters(db(), q, {}, { limit: 2, after: page2[1]!.id });
    expect([...page1, ...page2, ...page3].map((d) => d.id)).toEqual(all.map((d) => d.id));
    await expect(listDeadLetters(db(), q, {}, { after: '00000000-0000-4000-8000-000000000000' })).rejects.toMatchObject({
      code: 'not_found',
    });
  });

  it("shows the payload, each attempt's error and the actor's state", async () => {
    const s = await showDeadLetter(db(), q, idOf(a[1]!));
    expect(s.deadLetter.payload).toEqual({ fail: true, n: 2 });
    expect(s.attempts).toEqual([
      expect.objectContaining({ attempt: 1, status: 'failed', error: { code: 'handler_error', message: 'example worker asked to fail' } }),
    ]);
    expect(s.actor).toMatchObject({ actor: 'ops-a/s1', blockedByEventId: null, pendingEvents: [] });
    expect(s.actor.deadLetters).toHaveLength(3);
    await expect(showDeadLetter(db(), q, 'nope')).rejects.toMatchObject({ code: 'invalid_argument' });
    await expect(showDeadLetter(db(), q, '00000000-0000-4000-8000-000000000000')).rejects.toBeInstanceOf(CorralError);
  });

  it('replays one actor in original order under the original ids, and records it', async () => {
    const progress: number[] = [];
    const results = await replayDeadLetters(deps, [...a].reverse().map(idOf), { onProgress: (d) => progress.push(d) });
    expect(results.map((r) => [r.status, r.outcome, r.eventId])).toEqual([...a].reverse().map((e) => ['replayed', 'reinserted', e]));
    expect(progress.at(-1)).toBe(3);
    // One transaction, so one created_on; pg-boss then orders the key by id = enqueue order.
    expect(await jobsOf(a)).toEqual(a.map((id) => ({ id, state: 'created' })));
    const created = await db().execute<{ n: number }>(
      sql`select count(distinct created_on)::int as n from pgboss.job where name = 'actor-events' and id = any(${sql.param(a)}::uuid[])`,
    );
    expect(created.rows[0]!.n).toBe(1);
    expect(await deadLetterCount(db(), a)).toBe(0);
    const rec = await db().execute<{ action: string; outcome: string; replayed: boolean; payload: unknown }>(
      sql`select action, outcome, replayed, payload from corral.dead_letter_actions where event_id = ${a[2]!}`,
    );
    expect(rec.rows).toEqual([{ action: 'replay', outcome: 'reinserted', replayed: true, payload: { fail: true, n: 3 } }]);
  });

  it('is idempotent: a second replay (even a racing one) enqueues nothing more', async () => {
    const again = await replayDeadLetters(deps, [idOf(a[0]!), '00000000-0000-4000-8000-000000000000']);
    expect(again.map((r) => r.status)).toEqual(['already_replayed', 'not_found']);
    expect(await jobsOf(a)).toHaveLength(3);

    const race = await Promise.all([replayDeadLetters(deps, [idOf(b)]), replayDeadLetters(deps, [idOf(b)])]);
    expect(race.map((r) => r[0]!.status).sort()).toEqual(['already_replayed', 'replayed']);
    expect(await jobsOf([b])).toHaveLength(1);
    const rec = await db().execute<{ n: number }>(sql`select count(*)::int as n from corral.dead_letter_actions where event_id = ${b}`);
    expect(rec.rows[0]!.n).toBe(1);
  });

  it('discards, keeping the payload on record', async () => {
    const [r] = await discardDeadLetters(deps, [idOf(c)]);
    expect(r).toMatchObject({ status: 'discarded', outcome: 'discarded', eventId: c, actor: 'ops-c/s1' });
    expect(await deadLetterCount(db(), [c])).toBe(0);
    expect(await jobsOf([c])).toEqual([]);
    const rec = await db().execute<{ action: string; payload: unknown; replayed: boolean }>(
      sql`select action, payload, replayed from corral.dead_letter_actions where event_id = ${c}`,
    );
    expect(rec.rows).toEqual([{ action: 'discard', payload: { fail: true, n: 'c' }, replayed: false }]);
    expect((await discardDeadLetters(deps, [idOf(c)]))[0]!.status).toBe('already_discarded');
    expect((await replayDeadLetters(deps, [idOf(c)]))[0]!.status).toBe('already_discarded');
  });

  it('the replayed events run again, in their original order', async () => {
    // Their payload fails again: each gets a second turn, and those start in enqueue order.
    const r = await startFailingRuntime(tdb, {}, 'ops-w2');
    try {
      const second = await waitFor(
        async () => {
          const rows = await db().execute<{ event_id: string }>(
            sql`select event_id from corral.turns where event_id = any(${sql.param(a)}::uuid[]) order by started_at`,
          );
          return rows.rows.length === 6 ? rows.rows.slice(3).map((x) => x.event_id) : undefined;
        },
        { what: 'second attempts', timeoutMs: 30_000 },
      );
      expect(second).toEqual(a);
      await waitFor(async () => (await deadLetterCount(db(), a)) === 3, { what: 'dead-lettered again' });
    } finally {
      await r.stop();
    }
  });
});
