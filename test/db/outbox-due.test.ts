/**
 * When the delivery loop must claim next without a wake-up (`nextOutboxDueMs`, src/db/outbox/messages.ts):
 * the next retry that falls due or claim that lapses. Never "now" for an empty outbox, for a
 * message that waits behind an earlier one of its actor and sink (O2), or for one due already
 * (the claim just before took what it could; the rest waits for a send to end, which wakes the
 * loop), so an idle sender, or one whose receiver is slow, sleeps instead of claiming in a loop.
 */
import { beforeEach, describe, expect, it } from 'vitest';
import { nextOutboxDueMs } from '../../src/db/outbox/messages.ts';
import { useTestDatabase } from '../helpers/db.ts';

const tdb = useTestDatabase();

beforeEach(async () => {
  await tdb.client.query(`delete from corral.outbox`);
  await tdb.client.query(`delete from corral.sinks`);
  await tdb.client.query(`insert into corral.sinks (name, url, secret) values ('s', 'http://127.0.0.1:9/', 'whsec_dGVzdGluZyB0ZXN0aW5n')`);
});

/** A pending message of actor `a/<session>` on sink `s`, due or claimed as given (SQL intervals from now). */
async function message(session: string, opts: { dueIn?: string; claimedFor?: string } = {}): Promise<void> {
  await tdb.client.query(
    `insert into corral.outbox (sink, webhook_id, agent_uid, session_id, turn_id, event_id, position, body, next_attempt_at, claimed_until)
     values ('s', gen_random_uuid()::text, 'a', $1, gen_random_uuid(), gen_random_uuid(), 0, '{}',
             now() + coalesce($2::interval, '0'), now() + $3::interval)`,
    [session, opts.dueIn ?? null, opts.claimedFor ?? null],
  );
}

describe('nextOutboxDueMs', () => {
  it('is null for an empty outbox, and for messages that are not pending or whose sink is disabled', async () => {
    expect(await nextOutboxDueMs(tdb.database.db)).toBeNull();
    await message('x');
    await tdb.client.query(`update corral.outbox set state = 'delivered'`);
    expect(await nextOutboxDueMs(tdb.database.db)).toBeNull();
    await message('y');
    await tdb.client.query(`update corral.sinks set disabled_at = now()`);
    expect(await nextOutboxDueMs(tdb.database.db)).toBeNull();
  });

  it('is the time to the nearest retry; a message due already does not count', async () => {
    await message('y');
    expect(await nextOutboxDueMs(tdb.database.db)).toBeNull();
    await message('x', { dueIn: '3 seconds' });
    const ms = await nextOutboxDueMs(tdb.database.db);
    expect(ms).toBeGreaterThan(2_000);
    expect(ms).toBeLessThanOrEqual(3_000);
    await message('z', { dueIn: '1 second' });
    expect(await nextOutboxDueMs(tdb.database.db)).toBeLessThanOrEqual(1_000);
  });

  it('does not count a message behind a claimed one of its actor: that one’s claim is the next time', async () => {
    await message('x', { claimedFor: '8 seconds' });
    await message('x');
    const ms = await nextOutboxDueMs(tdb.database.db);
    expect(ms).toBeGreaterThan(7_000);
    expect(ms).toBeLessThanOrEqual(8_000);
    // a claim lapsing sooner is the next time
    await message('y', { claimedFor: '2 seconds' });
    expect(await nextOutboxDueMs(tdb.database.db)).toBeLessThanOrEqual(2_000);
  });
});
