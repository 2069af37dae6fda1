/**
 * Input policies through the client, on a real daemon, worker and PostgreSQL: `reject` refuses a
 * send while the actor's turn runs or its events wait (`actor_busy`, nothing enqueued) and takes
 * one again once it is idle; `queue` (the default) takes every event as a turn of its own; an
 * actor's own policy wins over its agent's; two sends racing to an idle `reject` actor cannot both
 * be taken. The CLI's side is test/cli/policy.test.ts.
 */
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CorralError } from '../../src/client/index.ts';
import { startClientSetup, jobsOf, replies, type ClientSetup } from './helpers.ts';
import { waitFor } from '../helpers/wait.ts';

let s: ClientSetup;

beforeAll(async () => {
  s = await startClientSetup({}, { workers: 1, capacity: 4 });
});

afterAll(async () => {
  await s?.stop();
});

async function refusal(p: Promise<unknown>): Promise<CorralError> {
  const e = await p.then(
    () => undefined,
    (err: unknown) => err,
  );
  expect(e, 'refused').toBeInstanceOf(CorralError);
  return e as CorralError;
}

/** Waits until the actor's first job is active (its turn runs). */
const running = (actor: string) =>
  waitFor(async () => (await jobsOf(s.pg, actor))[0]?.state === 'active', { what: `${actor}'s turn running`, timeoutMs: 10_000 });

describe('input policies', { timeout: 60_000 }, () => {
  it('queue (the default): events sent during a turn each get a turn of their own', async () => {
    expect((await s.corral.actor('qq/a')).inputPolicy).toEqual({ policy: 'queue', options: {}, from: 'default' });
    const first = await s.corral.send('qq/a', { text: 'm1', delayMs: 800 });
    await running('qq/a');
    const second = await s.corral.send('qq/a', { text: 'm2' });
    await s.corral.waitForTurn(second.eventId, { timeoutMs: 20_000 });
    expect(first.duplicate).toBe(false);
    expect(await replies(s.corral, 'qq/a')).toEqual([expect.stringMatching(/^echo: m1\b/), expect.stringMatching(/^echo: m2\b/)]);
  });

  it('reject: a send while the turn runs fails with actor_busy and enqueues nothing; an idle actor takes one again', async () => {
    const set = await s.corral.setInputPolicy('rj', 'reject');
    expect(set).toEqual({ target: 'rj', policy: 'reject', options: {}, previous: null });
    const first = await s.corral.send('rj/a', { text: 'm1', delayMs: 1_000 }, { idempotencyKey: 'k1' });
    await running('rj/a');
    const e = await refusal(s.corral.send('rj/a', { text: 'm2' }));
    expect(e.code).toBe('actor_busy');
    expect(e.message).toMatch(/^actor rj\/a is busy .* input policy is reject: nothing was enqueued$/);
    // the idempotent repeat of the event that made it busy still answers with that event
    expect(await s.corral.send('rj/a', { text: 'm1', delayMs: 1_000 }, { idempotencyKey: 'k1' })).toEqual({
      eventId: first.eventId,
      duplicate: true,
    });
    expect((await jobsOf(s.pg, 'rj/a')).map((j) => j.data.payload)).toEqual([{ text: 'm1', delayMs: 1_000 }]);
    expect((await s.corral.actor('rj/a')).inputPolicy).toEqual({ policy: 'reject', options: {}, from: 'agent' });
    // another actor of the agent is idle: it takes its event
    const other = await s.corral.send('rj/b', { text: 'b1' });
    await s.corral.waitForTurn(first.eventId, { timeoutMs: 20_000 });
    await s.corral.waitForTurn(other.eventId, { timeoutMs: 20_000 });
    const again = await s.corral.send('rj/a', { text: 'm3' });
    await s.corral.waitForTurn(again.eventId, { timeoutMs: 20_000 });
    expect(await replies(s.corral, 'rj/a')).toEqual([expect.stringMatching(/^echo: m1\b/), expect.stringMatching(/^echo: m3\b/)]);
  });

  it('reject counts waiting events too, those of the same call included: the whole call is refused', async () => {
    await s.corral.setInputPolicy({ agentUid: 'rw' }, 'reject');
    const e = await refusal(
      s.corral.sendMany([
        { actor: 'rw/a', data: { text: 'x1' } },
        { actor: 'rw/b', data: { text: 'y1' } },
        { actor: 'rw/a', data: { text: 'x2' } },
      ]),
    );
    expect(e.code).toBe('actor_busy');
    expect(e.message).toMatch(/^event 3: actor rw\/a is busy/);
    expect(await jobsOf(s.pg, 'rw/a')).toEqual([]);
    expect(await jobsOf(s.pg, 'rw/b')).toEqual([]);
  });

  it("an actor's own policy wins over its agent's, and clearing it brings the agent's back", async () => {
    await s.corral.setInputPolicy('ov', 'reject');
    expect(await s.corral.setInputPolicy('ov/open', 'queue')).toEqual({ target: 'ov/open', policy: 'queue', options: {}, previous: null });
    const first = await s.corral.send('ov/open', { text: 'o1', delayMs: 800 });
    await running('ov/open');
    const second = await s.corral.send('ov/open', { text: 'o2' });
    expect((await s.corral.actor('ov/open')).inputPolicy).toEqual({ policy: 'queue', options: {}, from: 'actor' });
    expect(await s.corral.clearInputPolicy('ov/open')).toBe('queue');
    expect((await refusal(s.corral.send('ov/open', { text: 'o3' }))).code).toBe('actor_busy');
    expect((await refusal(s.corral.clearInputPolicy('ov/open'))).code).toBe('nothing_matched');
    await s.corral.waitForTurn(first.eventId, { timeoutMs: 20_000 });
    await s.corral.waitForTurn(second.eventId, { timeoutMs: 20_000 });
    expect(await replies(s.corral, 'ov/open')).toEqual([expect.stringMatching(/^echo: o1\b/), expect.stringMatching(/^echo: o2\b/)]);
  });

  it('two sends racing to an idle reject actor: the second waits for the first and is refused', async () => {
    await s.corral.setInputPolicy('race/a', 'reject');
    const a = new pg.Client({ connectionString: s.t.db.url });
    const b = new pg.Client({ connectionString: s.t.db.url });
    await a.connect();
    await b.connect();
    try {
      await a.query('begin');
      await b.query('begin');
      await a.query(`select corral.send_event('race', 'a', '{"text":"r1"}'::jsonb)`);
      let settled = false;
      const second = b.query(`select corral.send_event('race', 'a', '{"text":"r2"}'::jsonb)`).then(
        () => ({ ok: true as const }),
        (err: unknown) => ({ ok: false as const, code: (err as { code?: string }).code }),
      );
      void second.then(() => (settled = true));
      await new Promise((r) => setTimeout(r, 300));
      expect(settled, 'the second send waits for the first transaction').toBe(false);
      await a.query('commit');
      expect(await second).toEqual({ ok: false, code: 'CR423' });
      await b.query('rollback');
    } finally {
      await a.end();
      await b.end();
    }
    expect((await jobsOf(s.pg, 'race/a')).map((j) => j.data.payload)).toEqual([{ text: 'r1' }]);
  });

  it('bad policies and targets are refused before the database is touched', async () => {
    expect((await refusal(s.corral.setInputPolicy('x', 'nope' as never))).message).toBe(
      'unknown input policy "nope": choose one of queue, coalesce, interrupt, reject',
    );
    expect((await refusal(s.corral.setInputPolicy('x', 'reject', { debounceMs: 300 }))).message).toMatch(/reject takes no options/);
    expect((await refusal(s.corral.setInputPolicy('x', 'coalesce', { debounceMs: '300ms' } as never))).message).toMatch(
      /debounceMs is a whole number/,
    );
    expect((await refusal(s.corral.setInputPolicy('x', 'coalesce', { wait: 1 } as never))).message).toMatch(
      /unknown input policy option "wait"/,
    );
    expect((await refusal(s.corral.setInputPolicy('x', 'coalesce', { maxEvents: 0 }))).message).toMatch(/max-events is 1 to 100/);
    expect((await refusal(s.corral.setInputPolicy('bad key', 'reject'))).code).toBe('invalid_actor_key');
    expect((await refusal(s.corral.setInputPolicy({ agentUid: 'a', sessionId: 'b/c' }, 'reject'))).code).toBe('invalid_actor_key');
  });

  it('CORRAL_INPUT_POLICY=reject: actors without a policy of their own reject while busy', async () => {
    const r = await startClientSetup({ inputPolicy: 'reject' }, { workers: 1, capacity: 4 });
    try {
      const first = await r.corral.send('dflt/a', { text: 'd1', delayMs: 600 });
      expect((await refusal(r.corral.send('dflt/a', { text: 'd2' }))).code).toBe('actor_busy');
      expect((await r.corral.actor('dflt/a')).inputPolicy).toEqual({ policy: 'reject', options: {}, from: 'default' });
      await r.corral.setInputPolicy('dflt/a', 'queue');
      const second = await r.corral.send('dflt/a', { text: 'd3' });
      await r.corral.waitForTurn(second.eventId, { timeoutMs: 20_000 });
      await r.corral.waitForTurn(first.eventId, { timeoutMs: 20_000 });
      expect(await replies(r.corral, 'dflt/a')).toEqual([expect.stringMatching(/^echo: d1\b/), expect.stringMatching(/^echo: d3\b/)]);
    } finally {
      await r.stop();
    }
  });
});
