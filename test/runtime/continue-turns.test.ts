/**
 * A busy actor's next turn begins in its current turn's commit (N1–N4 of src/runtime/turn-commit.ts),
 * on a real daemon, PostgreSQL and ZeroMQ, with a raw worker peer: the next turn's rows are written
 * by the commit's transaction (its turn's `started_at` is the previous turn's `finished_at`: both
 * are that transaction's `now()`), every event commits once and in order, and nothing begins in a
 * commit while other actors wait in the queue, while the daemon traces, or with `continueTurns` off.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { sql } from '../../src/db/orm.ts';
import { actorKey } from '../../src/base/actor-key.ts';
import { noopMetrics } from '../../src/runtime/metrics.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { RawPeer, type Msg } from '../helpers/raw-peer.ts';
import { sendMany } from '../helpers/send.ts';

type Ref = { event_id: string; delivery_id: string };

describe('next turns begun in commits', () => {
  let t: TestDaemon | undefined;
  let worker: RawPeer | undefined;

  afterEach(async () => {
    await worker?.close();
    await t?.stop();
    worker = undefined;
    t = undefined;
  });

  async function start(opts: { continueTurns?: boolean } = {}, capacity = 4) {
    let continued = 0;
    t = await startTestDaemon({ workerInitialTurns: 64 }, { ...opts, metrics: { ...noopMetrics, continued: () => void continued++ } });
    worker = new RawPeer(t.daemon.broker.endpoint, 'raw-cont');
    await worker.register(capacity);
    return { continued: () => continued };
  }

  /** Runs every turn_start the peer gets for `ids` with an echo result, in arrival order; the refs as they came. */
  async function runAll(ids: readonly string[]): Promise<Ref[]> {
    const want = new Set(ids);
    const seen: Ref[] = [];
    while (seen.length < ids.length) {
      const start = await worker!.next('turn_start', (m: Msg) => want.has((m.turn_ref as Ref).event_id));
      const ref = start.turn_ref as Ref;
      seen.push(ref);
      const text = ((start.event as { data: { text: string } }).data ?? {}).text;
      await worker!.send({ type: 'turn_result', turn_ref: ref, messages: [{ role: 'assistant', content: { text: `echo: ${text}` } }] });
    }
    return seen;
  }

  async function turnsOf(ids: readonly string[]) {
    const r = await t!.daemon.database.db.execute<{ event_id: string; status: string; started_at: string; finished_at: string | null }>(sql`
      select event_id, status, started_at::text, finished_at::text from corral.turns
       where event_id = any(${sql.param([...ids])}::uuid[]) order by started_at, event_id`);
    return r.rows;
  }

  async function userTexts(agent: string) {
    const r = await t!.daemon.database.db.execute<{ text: string }>(sql`
      select m.content->>'text' as text from corral.messages m join corral.conversations c on c.id = m.conversation_id
       where c.agent_uid = ${agent} and m.role = 'user' order by m.seq`);
    return r.rows.map((x) => x.text);
  }

  it("begins a busy actor's next turns in its commits: once each, in order, in the commit's transaction", async () => {
    const { continued } = await start();
    const texts = ['a1', 'a2', 'a3', 'a4', 'a5'];
    const events = await sendMany(
      t!.daemon.database.db,
      texts.map((text) => ({ key: actorKey('busy', 's'), event: { text } })),
    );
    const ids = events.map((e) => e.eventId);
    const order = await runAll(ids);
    expect(
      order.map((r) => r.event_id),
      'one turn at a time, in order',
    ).toEqual(ids);
    await expect.poll(async () => (await turnsOf(ids)).filter((x) => x.status === 'succeeded').length, { timeout: 10_000 }).toBe(5);
    const turns = await turnsOf(ids);
    expect(turns.map((x) => x.event_id)).toEqual(ids);
    // each next turn's rows were written by its predecessor's commit transaction
    for (let i = 1; i < turns.length; i++)
      expect(turns[i]!.started_at, `turn ${i + 1} begun in commit ${i}`).toBe(turns[i - 1]!.finished_at);
    expect(continued()).toBe(4);
    expect(await userTexts('busy')).toEqual(texts);
    const jobs = await t!.daemon.database.db.execute<{ state: string }>(
      sql`select state::text from pgboss.job where id = any(${sql.param(ids)}::uuid[])`,
    );
    expect(jobs.rows.map((j) => j.state)).toEqual(ids.map(() => 'completed'));
    // an idle actor: the slot is free again, nothing is held for it
    expect(t!.daemon.runtime.fetchCapacity()).toBe(4);
  });

  it('gives a freed slot to the queue while other actors wait there (N4), and begins nothing in commits when turned off', async () => {
    // one slot, three actors with two events each: every fetch takes what it asks for
    const { continued } = await start({}, 1);
    const events = await sendMany(
      t!.daemon.database.db,
      ['x', 'y', 'z'].flatMap((a) => [1, 2].map((n) => ({ key: actorKey(`q-${a}`, 's'), event: { text: `${a}${n}` } }))),
    );
    const ids = events.map((e) => e.eventId);
    await runAll(ids);
    await expect.poll(async () => (await turnsOf(ids)).filter((x) => x.status === 'succeeded').length, { timeout: 10_000 }).toBe(6);
    // while others waited, no next turn began in a commit; the last actor's may (nothing else was queued)
    expect(continued()).toBeLessThanOrEqual(1);
    for (const a of ['x', 'y', 'z']) expect(await userTexts(`q-${a}`)).toEqual([`${a}1`, `${a}2`]);
    await worker!.close();
    await t!.stop();

    const off = await start({ continueTurns: false });
    const more = await sendMany(
      t!.daemon.database.db,
      ['b1', 'b2', 'b3'].map((text) => ({ key: actorKey('off', 's'), event: { text } })),
    );
    await runAll(more.map((e) => e.eventId));
    await expect
      .poll(async () => (await turnsOf(more.map((e) => e.eventId))).filter((x) => x.status === 'succeeded').length, { timeout: 10_000 })
      .toBe(3);
    const turns = await turnsOf(more.map((e) => e.eventId));
    expect(off.continued()).toBe(0);
    for (let i = 1; i < turns.length; i++) expect(turns[i]!.started_at).not.toBe(turns[i - 1]!.finished_at);
    expect(await userTexts('off')).toEqual(['b1', 'b2', 'b3']);
  });
});
