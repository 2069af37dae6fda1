import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from '../../src/db/orm.ts';
import { actorKey, formatActorKey } from '../../src/base/actor-key.ts';
import { readTranscript } from '../../src/db/turns/transcript.ts';
import { runExampleWorker } from '../../src/worker/example.ts';
import type { Worker } from '../../src/worker/sdk.ts';
import { checkInvariants } from '../chaos/invariants.ts';
import { startTestDaemon, testLogger, type TestDaemon } from '../helpers/daemon.ts';
import { waitFor } from '../helpers/wait.ts';
import { sendEvent, sendMany } from '../helpers/send.ts';

describe('the durable actor loop, end to end', () => {
  let t: TestDaemon;
  const workers: Worker[] = [];

  beforeAll(async () => {
    t = await startTestDaemon();
    for (const id of ['w1', 'w2']) {
      workers.push(await runExampleWorker({ endpoint: t.daemon.broker.endpoint, workerId: id, capacity: 2, logger: testLogger }));
    }
    await waitFor(() => t.daemon.runtime.workers.freeSlots() === 4, { what: 'workers registered' });
  });

  afterAll(async () => {
    for (const w of workers) await w.stop();
    await t?.stop();
  });

  it('commits each event of three actors once, in per-actor enqueue order', async () => {
    const { daemon } = t;
    const db = daemon.database.db;
    const actors = [actorKey('agent-a', 's1'), actorKey('agent-b', 's1'), actorKey('agent-a', 's2')];
    const expected = new Map<string, string[]>();
    const ids = new Map<string, string[]>();
    // Some events go in one transaction, interleaved across actors: order must still hold.
    await db.transaction(async (tx) => {
      for (let i = 0; i < 4; i++) {
        for (const a of actors) {
          const text = `${formatActorKey(a)}#${i}`;
          const ev = await sendEvent(tx, a, { text });
          expected.set(formatActorKey(a), [...(expected.get(formatActorKey(a)) ?? []), `echo: ${text}`]);
          ids.set(formatActorKey(a), [...(ids.get(formatActorKey(a)) ?? []), ev.eventId]);
        }
      }
    });
    // A batch insert, and single sends outside any transaction.
    const batch = await sendMany(
      db,
      actors.map((a) => ({ key: a, event: { text: `${formatActorKey(a)}#4` } })),
    );
    for (const [i, a] of actors.entries()) {
      expected.get(formatActorKey(a))!.push(`echo: ${formatActorKey(a)}#4`);
      ids.get(formatActorKey(a))!.push(batch[i]!.eventId);
      const text = `${formatActorKey(a)}#5`;
      const ev = await sendEvent(db, a, { text });
      expected.get(formatActorKey(a))!.push(`echo: ${text}`);
      ids.get(formatActorKey(a))!.push(ev.eventId);
    }

    for (const a of actors) {
      const want = expected.get(formatActorKey(a))!;
      const transcript = await waitFor(
        async () => {
          const tr = await readTranscript(db, a);
          return tr.length >= want.length ? tr : undefined;
        },
        { what: `transcript of ${formatActorKey(a)}` },
      );
      expect(transcript.map((t) => t.eventId)).toEqual(ids.get(formatActorKey(a)));
      expect(transcript.map((t) => (t.messages[1]?.content as { text: string }).text)).toEqual(want);
      expect(transcript.every((t) => t.messages[0]?.role === 'user' && t.messages[1]?.role === 'assistant')).toBe(true);
      // message order within the conversation is gapless
      const seqs = transcript.flatMap((t) => t.messages.map((m) => m.seq));
      expect(seqs).toEqual(seqs.map((_, i) => i + 1));
    }

    // exactly once: one succeeded turn per event, every job completed
    const succeeded = await db.execute<{ n: number; distinct_events: number }>(
      sql`select count(*)::int as n, count(distinct event_id)::int as distinct_events from corral.turns where status = 'succeeded'`,
    );
    expect(succeeded.rows[0]).toEqual({ n: 18, distinct_events: 18 });
    const jobs = await db.execute<{ state: string; n: number }>(
      sql`select state, count(*)::int as n from pgboss.job where name = ${daemon.queues.events} group by state`,
    );
    expect(jobs.rows).toEqual([{ state: 'completed', n: 18 }]);

    // and the crash tests' invariant checks (I1–I4, from the database) hold too
    const events = actors.flatMap((a) =>
      ids.get(formatActorKey(a))!.map((id, ordinal) => ({ id, actor: a, ordinal, payload: { text: `${formatActorKey(a)}#${ordinal}` } })),
    );
    const check = await checkInvariants(db, events, { queues: daemon.queues });
    expect(check.violations).toEqual([]);
    expect(check.summary).toMatchObject({ events: 18, committed: 18, deadLettered: 0 });
  });
});
