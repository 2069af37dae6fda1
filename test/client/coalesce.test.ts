/**
 * Input policy `coalesce` on a real daemon, worker and PostgreSQL: events sent while a turn runs
 * become ONE next turn, every event's user message in the transcript in order and every job
 * completed by that turn's commit; `max-events` bounds a batch; a debounce makes events sent close
 * together one turn, and `max-wait` bounds a steady trickle. The crash side is
 * test/runtime/coalesce-crash.test.ts.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startClientSetup, jobsOf, replies, type ClientSetup } from './helpers.ts';
import { sleep, waitFor } from '../helpers/wait.ts';

let s: ClientSetup;

beforeAll(async () => {
  s = await startClientSetup({}, { workers: 1, capacity: 4 });
});

afterAll(async () => {
  await s?.stop();
});

const running = (actor: string) =>
  waitFor(async () => (await jobsOf(s.pg, actor))[0]?.state === 'active', { what: `${actor}'s turn running`, timeoutMs: 10_000 });

/** Each committed turn of `actor` as the texts of its user messages, and its reply. */
async function turnsOf(actor: string): Promise<{ users: unknown[]; reply: string }[]> {
  return (await s.corral.transcript(actor)).map((t) => ({
    users: t.messages.filter((m) => m.role === 'user').map((m) => (m.content as { text?: unknown }).text),
    reply: (t.messages.find((m) => m.role === 'assistant')?.content as { text: string }).text,
  }));
}

/** The states of `ids`' jobs, in order. */
async function jobStates(ids: string[]): Promise<string[]> {
  const r = await s.pg.query<{ id: string; state: string }>(
    `select id, state::text as state from pgboss.job where name = 'actor-events' and id = any($1::uuid[])`,
    [ids],
  );
  const by = new Map(r.rows.map((x) => [x.id, x.state]));
  return ids.map((id) => by.get(id) ?? 'gone');
}

describe('input policy coalesce', { timeout: 60_000 }, () => {
  it('turns m1 (a 2 s turn) and m2, m3, m4 sent during it into exactly two turns, [m1] and [m2, m3, m4]', async () => {
    const set = await s.corral.setInputPolicy('co', 'coalesce');
    expect(set).toEqual({ target: 'co', policy: 'coalesce', options: {}, previous: null });
    const m1 = await s.corral.send('co/a', { text: 'm1', delayMs: 2_000 });
    await running('co/a');
    const rest = [];
    for (const text of ['m2', 'm3', 'm4']) rest.push(await s.corral.send('co/a', { text }));
    const last = await s.corral.waitForTurn(rest[2]!.eventId, { timeoutMs: 20_000 });
    // every event of the batch is answered by the same committed turn
    const middle = await s.corral.waitForTurn(rest[1]!.eventId, { timeoutMs: 5_000 });
    expect(middle.turnId).toBe(last.turnId);
    expect((await s.corral.waitForTurn(m1.eventId, { timeoutMs: 5_000 })).turnId).not.toBe(last.turnId);
    expect(await turnsOf('co/a')).toEqual([
      { users: ['m1'], reply: 'echo: m1' },
      { users: ['m2', 'm3', 'm4'], reply: 'echo: m2 | m3 | m4' },
    ]);
    expect(last.messages.map((m) => [m.seq, m.role])).toEqual([
      [3, 'user'],
      [4, 'user'],
      [5, 'user'],
      [6, 'assistant'],
    ]);
    expect(await jobStates([m1.eventId, ...rest.map((r) => r.eventId)])).toEqual(['completed', 'completed', 'completed', 'completed']);
    const turns = await s.pg.query<{ n: number }>(
      `select count(*)::int as n from corral.turns t join corral.conversations c on c.id = t.conversation_id
        where c.agent_uid = 'co' and c.session_id = 'a'`,
    );
    expect(turns.rows[0]!.n, 'turns run (no attempt failed)').toBe(2);
    const status = await s.corral.actor('co/a');
    expect(status.inputPolicy).toEqual({ policy: 'coalesce', options: {}, from: 'agent' });
  });

  it('takes at most max-events into one turn; the rest wait for the next, together', async () => {
    await s.corral.setInputPolicy('cm/a', 'coalesce', { maxEvents: 2 });
    await s.corral.send('cm/a', { text: 'x0', delayMs: 1_000 });
    await running('cm/a');
    const sent = [];
    for (const text of ['x1', 'x2', 'x3', 'x4', 'x5']) sent.push(await s.corral.send('cm/a', { text }));
    await s.corral.waitForTurn(sent[4]!.eventId, { timeoutMs: 20_000 });
    expect((await turnsOf('cm/a')).map((t) => t.users)).toEqual([['x0'], ['x1', 'x2'], ['x3', 'x4'], ['x5']]);
  });

  it('with a debounce of 300ms, three events 150 ms apart to an idle actor give one turn', async () => {
    await s.corral.setInputPolicy('cd', 'coalesce', { debounceMs: 300, maxWaitMs: 5_000 });
    const sent = [];
    for (const text of ['d1', 'd2', 'd3']) {
      sent.push(await s.corral.send('cd/a', { text }));
      await sleep(150);
    }
    await s.corral.waitForTurn(sent[2]!.eventId, { timeoutMs: 20_000 });
    expect(await turnsOf('cd/a')).toEqual([{ users: ['d1', 'd2', 'd3'], reply: 'echo: d1 | d2 | d3' }]);
  });

  it('max-wait bounds a steady trickle: a turn begins though events keep coming within the debounce', async () => {
    await s.corral.setInputPolicy('ct/a', 'coalesce', { debounceMs: 400, maxWaitMs: 1_000 });
    const started = Date.now();
    const sent = [];
    // one event every 150 ms for 2.4 s: the debounce alone would hold them all
    while (Date.now() - started < 2_400) {
      sent.push(await s.corral.send('ct/a', { text: `t${sent.length}` }));
      await sleep(150);
    }
    await s.corral.waitForTurn(sent.at(-1)!.eventId, { timeoutMs: 20_000 });
    const turns = await turnsOf('ct/a');
    expect(turns.length, 'more than one turn: max-wait let one begin while events kept coming').toBeGreaterThan(1);
    expect(
      turns.flatMap((t) => t.users),
      'every event once, in order',
    ).toEqual(sent.map((_, i) => `t${i}`));
    const first = await s.corral.waitForTurn(sent[0]!.eventId, { timeoutMs: 1_000 });
    expect(first.startedAt.getTime() - started, 'the first turn began within max-wait (and the poll)').toBeLessThan(2_400);
  });

  it('a change of policy releases the events a debounce holds, in order', async () => {
    await s.corral.setInputPolicy('ch/a', 'coalesce', { debounceMs: 3_600_000 });
    const e1 = await s.corral.send('ch/a', { text: 'h1' });
    const e2 = await s.corral.send('ch/a', { text: 'h2' });
    await sleep(700);
    expect(await jobStates([e1.eventId, e2.eventId]), 'held by the hour-long debounce').toEqual(['created', 'created']);
    await s.corral.setInputPolicy('ch/a', 'coalesce');
    await s.corral.waitForTurn(e2.eventId, { timeoutMs: 20_000 });
    expect(await turnsOf('ch/a')).toEqual([{ users: ['h1', 'h2'], reply: 'echo: h1 | h2' }]);
    // an agent's: a clear releases every session's
    await s.corral.setInputPolicy('cg', 'coalesce', { debounceMs: 3_600_000 });
    const g = [await s.corral.send('cg/x', { text: 'gx' }), await s.corral.send('cg/y', { text: 'gy' })];
    await sleep(500);
    expect(await jobStates(g.map((e) => e.eventId))).toEqual(['created', 'created']);
    expect(await s.corral.clearInputPolicy('cg')).toBe('coalesce');
    for (const e of g) await s.corral.waitForTurn(e.eventId, { timeoutMs: 20_000 });
  });

  it('interrupt: an event sent during a turn cancels it, and the next turn holds both events', async () => {
    expect((await s.corral.setInputPolicy('ci', 'interrupt')).policy).toBe('interrupt');
    const m1 = await s.corral.send('ci/a', { text: 'm1', delayMs: 1_500 });
    await running('ci/a');
    const sentAt = Date.now();
    const m2 = await s.corral.send('ci/a', { text: 'm2' });
    const turn = await s.corral.waitForTurn(m2.eventId, { timeoutMs: 20_000 });
    expect((await s.corral.waitForTurn(m1.eventId, { timeoutMs: 1_000 })).turnId, 'one turn answered both').toBe(turn.turnId);
    const entries = await s.corral.transcript('ci/a');
    expect(entries.map((e) => [e.status, e.eventId, e.messages.map((m) => (m.content as { text: string }).text)])).toEqual([
      ['interrupted', m1.eventId, []],
      ['succeeded', m1.eventId, ['m1', 'm2', 'echo: m1 | m2']],
    ]);
    // the interrupted turn's attempt was not spent, and the next one began at once (not after m1's 1.5 s)
    expect(turn.attempt).toBe(1);
    expect(turn.startedAt.getTime() - sentAt, 'the next turn began right after the interrupt').toBeLessThan(1_000);
    const status = await s.corral.actor('ci/a', { turns: 5 });
    expect(status.recentTurns.map((t) => t.status)).toEqual(expect.arrayContaining(['interrupted', 'succeeded']));
    expect(await jobStates([m1.eventId, m2.eventId])).toEqual(['completed', 'completed']);
  });

  it('queue is untouched: an actor of another agent still gets one turn per event', async () => {
    await s.corral.send('cq/a', { text: 'q1', delayMs: 800 });
    await running('cq/a');
    const q2 = await s.corral.send('cq/a', { text: 'q2' });
    const q3 = await s.corral.send('cq/a', { text: 'q3' });
    await s.corral.waitForTurn(q3.eventId, { timeoutMs: 20_000 });
    await s.corral.waitForTurn(q2.eventId, { timeoutMs: 1_000 });
    expect(await replies(s.corral, 'cq/a')).toEqual([
      expect.stringMatching(/^echo: q1$/),
      expect.stringMatching(/^echo: q2$/),
      expect.stringMatching(/^echo: q3$/),
    ]);
  });
});
