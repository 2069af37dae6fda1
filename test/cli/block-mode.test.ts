/**
 * Dead-letter mode `block`, through the CLI with the daemon running: the failed original holds its
 * actor (`corral status` / `corral actor` show it), `dlq replay` retries it at the head of the
 * actor's queue (the later event still waits), `dlq discard` removes it and the actor proceeds.
 * Each test starts from its own database with a freshly blocked actor (no test depends on
 * another's outcome or order).
 */
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { sql } from '../../src/db/orm.ts';
import { actorKey } from '../../src/base/actor-key.ts';
import { readTranscript } from '../../src/db/turns/transcript.ts';
import { useTestDatabases, type TestDatabase } from '../helpers/db.ts';
import { waitFor } from '../helpers/wait.ts';
import { deadLetterCount, enqueueAndWait, startFailingRuntime, type Running } from '../ops/helpers.ts';
import { corral, json } from './helpers.ts';

const K = actorKey('blk-a', 's1');

// Several CLI processes per test: generous timeouts for loaded 2-core CI machines.
describe('dead-letter mode block (CLI, daemon running)', { timeout: 180_000 }, () => {
  const databases = useTestDatabases();
  let tdb: TestDatabase;
  let r: Running;
  let a1: string;
  let a2: string;
  const env = { CORRAL_DEAD_LETTER_MODE: 'block' };
  const cli = (...args: string[]) => corral(args, tdb.url, env);
  const db = () => r.t.daemon.database.db;
  const blockedBy = async () =>
    (
      await db().execute<{ b: string | null }>(
        sql`select blocked_by_event_id as b from corral.actors where agent_uid = 'blk-a' and session_id = 's1'`,
      )
    ).rows[0]?.b;
  const turnsOf = async (eventId: string) =>
    (await db().execute<{ n: number }>(sql`select count(*)::int as n from corral.turns where event_id = ${eventId}`)).rows[0]!.n;
  const dlqIdOf = async (eventId: string) =>
    (
      await db().execute<{ id: string }>(
        sql`select id from pgboss.job where name = 'actor-events-dlq' and source_id = ${eventId} order by created_on desc limit 1`,
      )
    ).rows[0]?.id;

  beforeEach(async () => {
    tdb = await databases.fresh();
    r = await startFailingRuntime(tdb, { deadLetterMode: 'block' }, 'blk-w1');
    const ids = await enqueueAndWait(
      r,
      [
        { key: K, payload: { fail: true } },
        { key: K, payload: { text: 'after' } },
      ],
      1,
    );
    a1 = ids[0]!;
    a2 = ids[1]!;
    await waitFor(async () => (await blockedBy()) === a1, { what: 'actor blocked' });
  });

  afterEach(async () => {
    await r?.stop();
  });

  it('status and actor show the held actor', async () => {
    const [status, statusTable, actor, unknown] = await Promise.all([
      cli('status', '--json'),
      cli('status'),
      cli('actor', 'blk-a/s1'),
      cli('actor', 'nobody/none'),
    ]);
    expect(status.code, status.stderr).toBe(0);
    const s = json<{ queue: Record<string, unknown>; blockedActors: number; workers: { workerId: string; status: string }[] }>(status);
    expect(s.queue).toMatchObject({ failedHeld: 1, deadLettered: 1, ready: 1, active: 0, oldestWaitingEventId: a2 });
    expect(s.blockedActors).toBe(1);
    expect(s.workers).toEqual([expect.objectContaining({ workerId: 'blk-w1', status: 'ready' })]);
    expect(statusTable.stdout).toMatch(/READY\s+DEFERRED\s+RETRYING\s+ACTIVE\s+FAILED-HELD\s+DEAD-LETTERED\n1\s+0\s+0\s+0\s+1\s+1\n/);
    expect(statusTable.stdout).toMatch(/blk-w1\s+ready\s+1\s+0\s/);

    expect(actor.code, actor.stderr).toBe(0);
    expect(actor.stdout).toContain(`blocked: yes, by dead-lettered event ${a1}\n`);
    // pending events in queue order: the held failed original first, then the one waiting behind it
    expect(actor.stdout).toMatch(
      new RegExp(`pending events: 2\\n.*\\n${a1}\\s+failed\\s+1\\s.*\\n${a2}\\s+created\\s+1\\s.*"text":"after"`),
    );
    expect(actor.stdout).toMatch(/activation: \S+ epoch 1, failed, revision 0, ended \(turn_error\)/);
    expect(unknown.code).toBe(3);
    expect(unknown.stderr).toContain('actor nobody/none is unknown');
  });

  it('replay retries the held event at the head: it runs (and fails) again before the later event', async () => {
    const first = (await dlqIdOf(a1))!;
    const res = await cli('dlq', 'replay', first);
    expect(res.code, res.stderr).toBe(0);
    expect(res.stdout).toContain(`replayed          ${first} event ${a1} of blk-a/s1 (retried, actor unblocked)\n`);
    // Its payload fails again: a new dead letter, the actor blocked again, the later event untouched.
    await waitFor(async () => (await turnsOf(a1)) === 2 && (await dlqIdOf(a1)) !== first && (await blockedBy()) === a1, {
      what: 'second failure',
      timeoutMs: 30_000,
    });
    expect(await turnsOf(a2)).toBe(0);
    expect(await deadLetterCount(db(), [a1])).toBe(1);
  });

  it('discard removes the held original too: the actor proceeds', async () => {
    const res = await cli('dlq', 'discard', '--all', '--actor', 'blk-a/s1', '--yes');
    expect(res.code, res.stderr).toBe(0);
    expect(res.stdout).toContain(`(discarded_with_original, actor unblocked)`);
    const transcript = await waitFor(
      async () => {
        const t = await readTranscript(db(), K);
        return t.length === 1 ? t : undefined;
      },
      { what: 'the later event committed', timeoutMs: 30_000 },
    );
    expect(transcript[0]!.eventId).toBe(a2);
    expect(await blockedBy()).toBeNull();
    const original = await db().execute<{ n: number }>(
      sql`select count(*)::int as n from pgboss.job where name = 'actor-events' and id = ${a1}`,
    );
    expect(original.rows[0]!.n).toBe(0);
    const actions = await db().execute<{ action: string; outcome: string }>(
      sql`select action, outcome from corral.dead_letter_actions where event_id = ${a1} order by id`,
    );
    expect(actions.rows).toEqual([{ action: 'discard', outcome: 'discarded_with_original' }]);
  });
});
