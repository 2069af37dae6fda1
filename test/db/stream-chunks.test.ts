/**
 * The chunk store of live turns (src/db/live/chunks.ts, S1–S3): only a live delivery's chunks
 * are stored; a stored chunk is notified on its actor's stream channel only while watched,
 * inline when it fits and by reference when not; the sweep deletes the chunks of deliveries that
 * are not live.
 */
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import {
  MAX_NOTIFY_BYTES,
  chunkLine,
  deleteChunks,
  insertChunks,
  parseChunkNotice,
  pruneStreamChunks,
  readChunks,
  streamChannelOf,
  type ChunkRow,
} from '../../src/db/live/chunks.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { waitFor } from '../helpers/wait.ts';

const tdb = useTestDatabase();

/** A delivery of actor `s/<session>` in `state`. */
async function delivery(session: string, state: string): Promise<string> {
  const r = await tdb.client.query<{ delivery_id: string }>(
    `with a as (
       insert into corral.activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at, owner_id, status,
                                       end_reason, ended_at)
       values (gen_random_uuid(), 's', $1, (select count(*) + 1 from corral.activations), gen_random_uuid(), now(), 'daemon', 'stopped',
               'idle', now())
       returning activation_uid, actor_epoch
     )
     insert into corral.deliveries (delivery_id, activation_uid, agent_uid, session_id, actor_epoch, event_id, revision, job_retry_count, state)
     select gen_random_uuid(), a.activation_uid, 's', $1, a.actor_epoch, gen_random_uuid(), 0, 0, $2 from a returning delivery_id`,
    [session, state],
  );
  return r.rows[0]!.delivery_id;
}

const chunk = (deliveryId: string, session: string, seq: number, data: unknown): ChunkRow => ({
  deliveryId,
  seq,
  agentUid: 's',
  sessionId: session,
  epoch: 1,
  attempt: 1,
  data: JSON.stringify(data),
  channel: streamChannelOf(`s/${session}`),
});

describe('stream chunks', () => {
  it('stores the chunks of a live delivery only (S1), and reads them back in order after a seq', async () => {
    const live = await delivery('a', 'accepted');
    const ended = await delivery('a', 'superseded');
    const stored = await insertChunks(tdb.database.db, [
      chunk(live, 'a', 1, { delta: 'He' }),
      chunk(ended, 'a', 1, { delta: 'stale' }),
      chunk(live, 'a', 2, { delta: 'llo' }),
      chunk('00000000-0000-4000-8000-000000000000', 'a', 1, 'no delivery'),
    ]);
    expect(stored).toBe(2);
    expect(await readChunks(tdb.database.db, live, 0)).toEqual([
      { seq: 1, data: '{"delta": "He"}' },
      { seq: 2, data: '{"delta": "llo"}' },
    ]);
    expect(await readChunks(tdb.database.db, live, 1)).toEqual([{ seq: 2, data: '{"delta": "llo"}' }]);
    expect(await readChunks(tdb.database.db, ended, 0)).toEqual([]);
    // a chunk written twice (a retried insert) is stored once
    expect(await insertChunks(tdb.database.db, [chunk(live, 'a', 2, { delta: 'again' })])).toBe(0);
    expect(await deleteChunks(tdb.database.db, [live])).toBe(2);
  });

  it('notifies a stored chunk on its stream channel only while watched, inline or by reference (S2)', async () => {
    const d = await delivery('b', 'sent');
    const channel = streamChannelOf('s/b');
    const heard: string[] = [];
    const listener = new pg.Client({ connectionString: tdb.url });
    await listener.connect();
    try {
      listener.on('notification', (n) => n.channel === channel && heard.push(n.payload ?? ''));
      await listener.query(`listen ${channel}`);
      // not registered as watched: nothing is sent
      await insertChunks(tdb.database.db, [chunk(d, 'b', 1, 'quiet')]);
      await listener.query(`insert into corral.turn_watchers (channel, pid) values ($1, pg_backend_pid())`, [channel]);
      const big = 'x'.repeat(MAX_NOTIFY_BYTES);
      await insertChunks(tdb.database.db, [chunk(d, 'b', 2, { delta: 'hi' }), chunk(d, 'b', 3, big)]);
      await waitFor(() => heard.length === 2, { what: 'two notifications' });
      expect(heard[0]).toBe(`c s/b ${d} 2 {"delta":"hi"}`);
      expect(heard[1]).toBe(`r s/b ${d} 3`);
      expect(parseChunkNotice(heard[0]!)).toEqual({ agentUid: 's', sessionId: 'b', deliveryId: d, seq: 2, data: '{"delta":"hi"}' });
      expect(parseChunkNotice(heard[1]!)).toEqual({ agentUid: 's', sessionId: 'b', deliveryId: d, seq: 3, data: undefined });
    } finally {
      await listener.end();
    }
  });

  it('parses only well-formed notices', () => {
    const d = '0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b';
    expect(parseChunkNotice(chunkLine({ agentUid: 'a', sessionId: 's', deliveryId: d, seq: 7, data: '"line\\nbreak"' }))).toMatchObject({
      seq: 7,
      data: '"line\\nbreak"',
    });
    for (const bad of ['', 'c a/s', `x a/s ${d} 1 1`, `c a/s ${d} 1`, `r a/s ${d} 1 1`, `c a s ${d} 1 1`, `c a/s not-a-uuid 1 1`]) {
      expect(parseChunkNotice(bad), bad).toBeUndefined();
    }
  });

  it('the sweep deletes the chunks of deliveries that are no longer live (S3)', async () => {
    const d = await delivery('c', 'accepted');
    const keep = await delivery('c2', 'accepted');
    await insertChunks(tdb.database.db, [chunk(d, 'c', 1, 1), chunk(d, 'c', 2, 2), chunk(keep, 'c2', 1, 1)]);
    expect(await pruneStreamChunks(tdb.database.db)).toBe(0);
    await tdb.client.query(`update corral.deliveries set state = 'completed' where delivery_id = $1`, [d]);
    expect(await pruneStreamChunks(tdb.database.db)).toBe(2);
    expect(await readChunks(tdb.database.db, keep, 0)).toHaveLength(1);
  });
});
