/**
 * Idempotency keys live at least as long as their event's job: the retention sweep deletes a key
 * only once its event's job is gone (completed and swept), never while the job waits, runs, or
 * stays as a dead letter. A short-lived API token is deleted once it expired longer ago than the
 * retention.
 */
import type { PgBoss } from 'pg-boss';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULTS } from '../../src/config.ts';
import { makeLastAttempt } from '../../src/db/boss/jobs.ts';
import { keyHeadFetch, queueTable } from '../../src/db/boss/fetch.ts';
import { sendEvents } from '../../src/db/enqueue/send-event.ts';
import { createToken } from '../../src/ops/api-tokens.ts';
import { createBoss, queuesOf } from '../../src/queue/boss.ts';
import { sweepIdempotencyKeys, sweepRetention } from '../../src/queue/retention.ts';
import { useTestDatabase } from '../helpers/db.ts';

const q = queuesOf(DEFAULTS);
const DAY = 86_400;
const tdb = useTestDatabase();
let boss: PgBoss;

beforeAll(async () => {
  boss = createBoss(tdb.url, DEFAULTS, { max: 2 });
  await boss.start();
});

afterAll(async () => {
  await boss?.stop({ graceful: false, close: true });
});

const keys = async () =>
  (await tdb.client.query<{ key: string }>('select key from corral.idempotency_keys order by key')).rows.map((r) => r.key);

describe('idempotency key retention', () => {
  it('keeps a key while its job waits or is a dead letter, deletes it once the job is swept', async () => {
    const [done, waiting, dead, young] = await sendEvents(tdb.client, [
      { agentUid: 'ret', sessionId: 'done', data: 1, idempotencyKey: 'done' },
      { agentUid: 'ret', sessionId: 'waiting', data: 2, idempotencyKey: 'waiting' },
      { agentUid: 'ret', sessionId: 'dead', data: 3, idempotencyKey: 'dead' },
      { agentUid: 'ret', sessionId: 'young', data: 4, idempotencyKey: 'young' },
    ]);
    // run and settle: `done` and `young` complete; `dead` fails for good, its original deleted (mode continue)
    const claimed = await keyHeadFetch(tdb.client, q, await queueTable(tdb.client, q))(10);
    const attempt = (id: string) => ({ id, retryCount: claimed.find((j) => j.id === id)!.retryCount });
    await boss.complete(q.events, [attempt(done!.eventId), attempt(young!.eventId)]);
    await makeLastAttempt(tdb.database.db, q.schema, q.events, dead!.eventId, 0);
    await boss.fail(q.events, attempt(dead!.eventId), { error: 'for good' });
    await boss.deleteJob(q.events, dead!.eventId);
    await boss.fail(q.events, attempt(waiting!.eventId), { error: 'retry later' });
    // everything but `young` is two days old
    await tdb.client.query(`update corral.idempotency_keys set created_at = now() - interval '2 days' where key <> 'young'`);
    await tdb.client.query(`update pgboss.job set completed_on = now() - interval '2 days' where name = $1 and id = $2`, [
      q.events,
      done!.eventId,
    ]);
    await tdb.client.query(`update pgboss.job set completed_on = now() - interval '2 days' where name = $1 and id = $2`, [
      q.events,
      young!.eventId,
    ]);

    // the job of `done` is still there: no key goes
    expect(await sweepIdempotencyKeys({ db: tdb.database.db, bossSchema: q.schema, queueName: q.events, retentionSeconds: DAY })).toBe(0);
    // the retention sweep deletes the old completed jobs, then the key whose job is gone and which is old itself
    expect(await sweepRetention({ boss, db: tdb.database.db, bossSchema: q.schema, queueName: q.events, retentionSeconds: DAY })).toEqual({
      runtimeRows: 0,
      transcriptRows: 0,
      jobs: 2,
      idempotencyKeys: 1,
      outboxMessages: 0,
      expiredTokens: 0,
      streamChunks: 0,
    });
    expect(await keys()).toEqual(['dead', 'waiting', 'young']);
    // retention 0 keeps completed jobs, and so the keys, forever
    expect(await sweepIdempotencyKeys({ db: tdb.database.db, bossSchema: q.schema, queueName: q.events, retentionSeconds: 0 })).toBe(0);
    // once the dead letter is discarded, its key may go too
    await tdb.client.query(`delete from pgboss.job where name = $1 and source_id = $2`, [q.deadLetter, dead!.eventId]);
    expect(await sweepIdempotencyKeys({ db: tdb.database.db, bossSchema: q.schema, queueName: q.events, retentionSeconds: DAY })).toBe(1);
    expect(await keys()).toEqual(['waiting', 'young']);
    // a key whose event is gone is free: sending again enqueues anew
    const again = await sendEvents(tdb.client, [{ agentUid: 'ret', sessionId: 'done', data: 1, idempotencyKey: 'done' }]);
    expect(again[0]).toMatchObject({ duplicate: false });
    expect(again[0]!.eventId).not.toBe(done!.eventId);
  });

  it('deletes a token once it expired longer ago than the retention, keeps the others and those that never expire', async () => {
    await createToken(tdb.database.db, 'long-gone', ['read'], { ttlMs: 60_000 });
    await createToken(tdb.database.db, 'just-expired', ['read'], { ttlMs: 60_000 });
    await createToken(tdb.database.db, 'live', ['read'], { ttlMs: 60_000 });
    await createToken(tdb.database.db, 'forever', ['read']);
    await tdb.client.query(`update corral.api_tokens set expires_at = now() - interval '2 days' where name = 'long-gone'`);
    await tdb.client.query(`update corral.api_tokens set expires_at = now() - interval '1 hour' where name = 'just-expired'`);
    const swept = await sweepRetention({ boss, db: tdb.database.db, bossSchema: q.schema, queueName: q.events, retentionSeconds: DAY });
    expect(swept.expiredTokens).toBe(1);
    const names = await tdb.client.query<{ name: string }>('select name from corral.api_tokens order by name');
    expect(names.rows.map((r) => r.name)).toEqual(['forever', 'just-expired', 'live']);
  });
});
