/**
 * Transcript retention (src/db/operations/transcript-retention.ts, R1–R6): the finished turns of an agent
 * with a policy that finished longer ago than its window go, with their messages, oldest first
 * and in bounded batches; recent turns, `started` turns and every agent without a policy stay;
 * the conversation stays and records how far it was pruned; an event whose turn was pruned reads
 * as `unknown`, not as cancelled.
 */
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { DEFAULTS } from '../../src/config.ts';
import { eventStatus } from '../../src/db/turns/event-status.ts';
import {
  clearTranscriptRetention,
  listTranscriptRetention,
  pruneAgentTranscripts,
  pruneTranscripts,
  setTranscriptRetention,
  transcriptRetentionDue,
} from '../../src/db/operations/transcript-retention.ts';
import { queuesOf } from '../../src/queue/names.ts';
import { pruneTranscriptRows } from '../../src/queue/retention.ts';
import { useTestDatabase } from '../helpers/db.ts';

const DAY = 86_400;
const tdb = useTestDatabase();

type Status = 'started' | 'succeeded' | 'failed' | 'cancelled';

/** A conversation of `agent`/`session` (created on first use). */
async function conversation(agent: string, session: string): Promise<string> {
  const r = await tdb.client.query<{ id: string }>(
    `insert into corral.conversations (id, agent_uid, session_id) values (gen_random_uuid(), $1, $2)
     on conflict (agent_uid, session_id) do update set updated_at = now() returning id`,
    [agent, session],
  );
  return r.rows[0]!.id;
}

/**
 * A turn of `agent`/`session` that finished `agedDays` ago (a `started` one has no finish, unless
 * `finishedDaysAgo` forces one), with `messages` messages numbered at the end of its conversation,
 * as a commit writes them. Returns the turn id and its event id.
 */
async function turn(
  agent: string,
  session: string,
  opts: { status?: Status; agedDays: number; messages?: number; finishedDaysAgo?: number },
): Promise<{ id: string; eventId: string }> {
  const conv = await conversation(agent, session);
  const status = opts.status ?? 'succeeded';
  const finished = opts.finishedDaysAgo ?? (status === 'started' ? null : opts.agedDays);
  const id = randomUUID();
  const eventId = randomUUID();
  await tdb.client.query(
    `insert into corral.turns (id, conversation_id, event_id, delivery_id, status, activation_uid, actor_epoch, revision, attempt,
                               input, started_at, finished_at)
     values ($1, $2, $3, gen_random_uuid(), $4, gen_random_uuid(), 1, 0, 1, '{"text":"hi"}',
             now() - $5 * interval '1 day', now() - $6 * interval '1 day')`,
    [id, conv, eventId, status, opts.agedDays, finished],
  );
  const n = opts.messages ?? (status === 'succeeded' ? 2 : status === 'cancelled' ? 1 : 0);
  if (n > 0) {
    await tdb.client.query(
      `with cv as (
         update corral.conversations set next_seq = next_seq + $3 where id = $1 returning next_seq - $3 as first
       )
       insert into corral.messages (conversation_id, turn_id, seq, role, content)
       select $1, $2, cv.first + g - 1, case when g = 1 then 'user' else 'assistant' end, jsonb_build_object('n', g)
         from cv, generate_series(1, $3::int) g`,
      [conv, id, n],
    );
  }
  return { id, eventId };
}

const count = async (q: string, params: unknown[] = []) =>
  (await tdb.client.query<{ n: number }>(`select count(*)::int as n from ${q}`, params)).rows[0]!.n;
const turnExists = async (id: string) => (await count('corral.turns where id = $1', [id])) === 1;
const messagesOf = async (id: string) => count('corral.messages where turn_id = $1', [id]);
const seqsOf = async (agent: string, session: string) =>
  (
    await tdb.client.query<{ seq: number }>(
      `select m.seq from corral.messages m join corral.conversations cv on cv.id = m.conversation_id
        where cv.agent_uid = $1 and cv.session_id = $2 order by m.seq`,
      [agent, session],
    )
  ).rows.map((r) => r.seq);
const conversationOf = async (agent: string, session: string) =>
  (
    await tdb.client.query<{ next_seq: number; pruned_through: number }>(
      'select next_seq, pruned_through from corral.conversations where agent_uid = $1 and session_id = $2',
      [agent, session],
    )
  ).rows[0];

describe('transcript retention policies', () => {
  it('set, replace, list and clear; the table refuses what the statements could not take', async () => {
    expect(await setTranscriptRetention(tdb.database.db, 'pol-a', 90 * DAY)).toMatchObject({
      agentUid: 'pol-a',
      keepSeconds: 90 * DAY,
      previousKeepSeconds: null,
    });
    expect(await setTranscriptRetention(tdb.database.db, 'pol-a', 12 * 3600)).toMatchObject({
      keepSeconds: 12 * 3600,
      previousKeepSeconds: 90 * DAY,
    });
    await setTranscriptRetention(tdb.database.db, 'pol-b', 60);
    const list = await listTranscriptRetention(tdb.database.db);
    expect(list.filter((p) => p.agentUid.startsWith('pol-')).map((p) => [p.agentUid, p.keepSeconds])).toEqual([
      ['pol-a', 12 * 3600],
      ['pol-b', 60],
    ]);
    expect(list[0]!.updatedAt).toBeInstanceOf(Date);
    expect(await clearTranscriptRetention(tdb.database.db, 'pol-b')).toBe(60);
    expect(await clearTranscriptRetention(tdb.database.db, 'pol-b')).toBeNull();

    await expect(setTranscriptRetention(tdb.database.db, "it's", 60)).rejects.toThrow(/an agent uid/);
    await expect(setTranscriptRetention(tdb.database.db, 'pol-c', 0)).rejects.toThrow(/whole seconds/);
    await expect(setTranscriptRetention(tdb.database.db, 'pol-c', 1.5)).rejects.toThrow(/whole seconds/);
    // by hand too: the pruning writes agent_uid into its statement as a literal
    await expect(tdb.client.query(`insert into corral.transcript_retention (agent_uid, keep_seconds) values ('a''b', 60)`)).rejects.toThrow(
      /transcript_retention_agent_uid/,
    );
    await expect(tdb.client.query(`insert into corral.transcript_retention (agent_uid, keep_seconds) values ('ok', 0)`)).rejects.toThrow(
      /transcript_retention_keep_positive/,
    );
    await clearTranscriptRetention(tdb.database.db, 'pol-a');
  });
});

describe('pruning transcripts', () => {
  it('deletes the old finished turns of an agent with a policy, with their messages; keeps the rest', async () => {
    // agent "forget": 1 day; session s1 has three old turns (succeeded, failed, cancelled), then recent ones
    const old1 = await turn('forget', 's1', { agedDays: 5 });
    const oldFailed = await turn('forget', 's1', { status: 'failed', agedDays: 4 });
    const oldCancelled = await turn('forget', 's1', { status: 'cancelled', agedDays: 3 });
    const recent = await turn('forget', 's1', { agedDays: 0 });
    // a started turn that began long ago: live (or recovery's), never deleted, even with a finish time
    const live = await turn('forget', 's1', { status: 'started', agedDays: 9 });
    const stuck = await turn('forget', 's2', { status: 'started', agedDays: 9, finishedDaysAgo: 9 });
    const old2 = await turn('forget', 's2', { agedDays: 2, messages: 3 });
    // an agent without a policy, and one with a longer window: their old turns stay
    const kept = await turn('keep', 's1', { agedDays: 400 });
    const longer = await turn('long', 's1', { agedDays: 5 });
    await setTranscriptRetention(tdb.database.db, 'forget', DAY);
    await setTranscriptRetention(tdb.database.db, 'long', 30 * DAY);
    const conversations = await count('corral.conversations');

    // turns: old1, oldFailed, oldCancelled, old2 (4); messages: 2 + 0 + 1 + 3 (6)
    expect(await pruneTranscripts(tdb.database.db, { batchSize: 100 })).toBe(10);

    for (const gone of [old1, oldFailed, oldCancelled, old2]) {
      expect(await turnExists(gone.id)).toBe(false);
      expect(await messagesOf(gone.id)).toBe(0);
    }
    for (const stays of [recent, live, stuck, kept, longer]) expect(await turnExists(stays.id)).toBe(true);
    expect(await messagesOf(recent.id)).toBe(2);
    expect(await messagesOf(kept.id)).toBe(2);
    expect(await messagesOf(longer.id)).toBe(2);
    // what stays of s1 is its end, without gaps; the conversation keeps its numbering and records the cut
    expect(await seqsOf('forget', 's1')).toEqual([4, 5]);
    expect(await conversationOf('forget', 's1')).toEqual({ next_seq: 6, pruned_through: 3 });
    expect(await conversationOf('forget', 's2')).toEqual({ next_seq: 4, pruned_through: 3 });
    expect(await conversationOf('keep', 's1')).toEqual({ next_seq: 3, pruned_through: 0 });
    expect(await count('corral.conversations')).toBe(conversations);

    // nothing left to do; an agent whose policy is gone or changed since it was read is left alone
    expect(await pruneTranscripts(tdb.database.db)).toBe(0);
    const older = await turn('forget', 's3', { agedDays: 5 });
    expect(await pruneAgentTranscripts(tdb.database.db, 'forget', 2 * DAY, 100)).toEqual({ turns: 0, messages: 0 });
    expect(await pruneAgentTranscripts(tdb.database.db, 'keep', DAY, 100)).toEqual({ turns: 0, messages: 0 });
    await clearTranscriptRetention(tdb.database.db, 'forget');
    expect(await pruneTranscripts(tdb.database.db)).toBe(0);
    expect(await turnExists(older.id)).toBe(true);
    await clearTranscriptRetention(tdb.database.db, 'long');
  });

  it('bounds each batch and each pass, and takes every conversation oldest first', async () => {
    const s1 = [];
    for (let i = 0; i < 5; i++) s1.push(await turn('batch', 's1', { agedDays: 10 - i }));
    const s2 = [];
    for (let i = 0; i < 2; i++) s2.push(await turn('batch', 's2', { agedDays: 10 - i }));
    await setTranscriptRetention(tdb.database.db, 'batch', DAY);

    // one batch: at most 2 turns, a conversation's oldest
    expect(await pruneAgentTranscripts(tdb.database.db, 'batch', DAY, 2)).toEqual({ turns: 2, messages: 4 });
    const left = async (ts: { id: string }[]) => {
      const out: boolean[] = [];
      for (const t of ts) out.push(await turnExists(t.id));
      return out;
    };
    const afterOne = [...(await left(s1)), ...(await left(s2))];
    expect(afterOne.filter((x) => !x)).toHaveLength(2);
    // within each conversation, what is gone is its start
    for (const ts of [await left(s1), await left(s2)]) expect(ts).toEqual([...ts].sort((a, b) => Number(a) - Number(b)));

    // a pass of at most 2 batches of 2: 4 more turns, one left for the next pass
    expect(await pruneTranscripts(tdb.database.db, { batchSize: 2, maxBatches: 2 })).toBe(12);
    expect([...(await left(s1)), ...(await left(s2))].filter((x) => x)).toHaveLength(1);
    expect(await pruneTranscripts(tdb.database.db, { batchSize: 2, maxBatches: 2 })).toBe(3);
    expect(await count(`corral.turns t join corral.conversations cv on cv.id = t.conversation_id where cv.agent_uid = 'batch'`)).toBe(0);
    expect(await conversationOf('batch', 's1')).toEqual({ next_seq: 11, pruned_through: 10 });
    await clearTranscriptRetention(tdb.database.db, 'batch');
  });

  it('skips turns another transaction holds, and gets them on the next pass', async () => {
    const held = await turn('held', 's1', { agedDays: 3 });
    await setTranscriptRetention(tdb.database.db, 'held', DAY);
    const other = new pg.Client({ connectionString: tdb.url });
    await other.connect();
    try {
      await other.query('begin');
      await other.query('select 1 from corral.turns where id = $1 for update', [held.id]);
      expect(await pruneTranscripts(tdb.database.db)).toBe(0);
      await other.query('commit');
      expect(await pruneTranscripts(tdb.database.db)).toBe(3);
    } finally {
      await other.end();
      await clearTranscriptRetention(tdb.database.db, 'held');
    }
  });

  it("an event whose turn was pruned while its job is kept is unknown, a cancelled one's stays cancelled", async () => {
    const q = queuesOf(DEFAULTS);
    const committed = await turn('jobs', 's1', { agedDays: 3 });
    const cancelled = await turn('jobs', 's1', { status: 'cancelled', agedDays: 3 });
    for (const [t, output] of [
      [committed, null],
      [cancelled, { cancelled: true, reason: 'stop' }],
    ] as const) {
      await tdb.client.query(
        `insert into pgboss.job (id, name, data, state, policy, singleton_key, output, completed_on, created_on)
         values ($1, $2, '{}'::jsonb, 'completed', 'key_strict_fifo', 'jobs/s1', $3, now() - interval '3 days', now() - interval '3 days')`,
        [t.eventId, q.events, output === null ? null : JSON.stringify(output)],
      );
    }
    expect((await eventStatus(tdb.database.db, q, committed.eventId)).state).toBe('committed');
    expect((await eventStatus(tdb.database.db, q, cancelled.eventId)).state).toBe('cancelled');
    await setTranscriptRetention(tdb.database.db, 'jobs', DAY);
    expect(await pruneTranscripts(tdb.database.db)).toBe(5);
    expect((await eventStatus(tdb.database.db, q, committed.eventId)).state).toBe('unknown');
    expect((await eventStatus(tdb.database.db, q, cancelled.eventId)).state).toBe('cancelled');
    await clearTranscriptRetention(tdb.database.db, 'jobs');
  });
});

describe('the pass skips an agent until something may be due (R7)', () => {
  it('records when the oldest turn left passes the window, leaves the agent out until then, and a new policy clears it', async () => {
    const agent = 'due-agent';
    await turn(agent, 's1', { agedDays: 3 });
    await turn(agent, 's2', { agedDays: 1 });
    await setTranscriptRetention(tdb.database.db, agent, 2 * DAY);
    const dueOf = async () =>
      (
        await tdb.client.query<{ due: number | null }>(
          `select extract(epoch from due_at - now())::float8 / 86400 as due from corral.transcript_retention where agent_uid = $1`,
          [agent],
        )
      ).rows[0]!.due;
    expect(await dueOf(), 'not known before a pass').toBeNull();
    expect((await transcriptRetentionDue(tdb.database.db)).map((p) => p.agentUid)).toContain(agent);

    const pass = () => pruneTranscriptRows({ db: tdb.database.db, duty: 1 });
    expect(await pass(), 'the 3-day-old turn and its two messages').toBe(3);
    // the oldest left finished a day ago: due in a day
    expect(await dueOf()).toBeCloseTo(1, 2);
    expect((await transcriptRetentionDue(tdb.database.db)).map((p) => p.agentUid)).not.toContain(agent);
    expect(await pass(), 'nothing due: the agent is left out').toBe(0);

    // a shorter window takes effect at the next pass
    await setTranscriptRetention(tdb.database.db, agent, DAY / 2);
    expect(await dueOf()).toBeNull();
    expect(await pass(), 'the 1-day-old turn is past half a day').toBe(3);
    // nothing left: due a window after now
    expect(await dueOf()).toBeCloseTo(0.5, 2);
  });
});
