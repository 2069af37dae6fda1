/**
 * Outbox retention: the sweep deletes the messages delivered or discarded longer ago than the
 * completed-event retention, in batches, and never a pending or dead one, however old.
 */
import { expect, it } from 'vitest';
import { sweepOutbox } from '../../src/queue/retention.ts';
import { useTestDatabase } from '../helpers/db.ts';

const DAY = 86_400;
const tdb = useTestDatabase();

it('deletes old delivered and discarded messages, keeps young ones and every pending or dead one', async () => {
  await tdb.client.query(
    `insert into corral.sinks (name, url, secret) values ('s', 'http://127.0.0.1:9/', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw')`,
  );
  const add = (id: string, state: string, ageDays: number) =>
    tdb.client.query(
      `insert into corral.outbox (sink, webhook_id, agent_uid, session_id, turn_id, event_id, position, body, state, updated_at)
       values ('s', $1, 'a', 's', gen_random_uuid(), gen_random_uuid(), 0, '{}', $2, now() - make_interval(days => $3))`,
      [id, state, ageDays],
    );
  for (let i = 0; i < 25; i++) await add(`old-delivered-${i}`, 'delivered', 3);
  await add('old-discarded', 'discarded', 3);
  await add('young-delivered', 'delivered', 0);
  await add('old-pending', 'pending', 30);
  await add('old-dead', 'dead', 30);
  // batches of 10: the sweep drains what is due, whatever the batch
  expect(await sweepOutbox({ db: tdb.database.db, retentionSeconds: 2 * DAY, batchSize: 10, duty: 1 })).toBe(26);
  const left = await tdb.client.query<{ webhook_id: string }>(`select webhook_id from corral.outbox order by webhook_id`);
  expect(left.rows.map((r) => r.webhook_id)).toEqual(['old-dead', 'old-pending', 'young-delivered']);
  // retention 0 keeps everything
  await add('older-delivered', 'delivered', 300);
  expect(await sweepOutbox({ db: tdb.database.db, retentionSeconds: 0 })).toBe(0);
});
