/**
 * The one enqueue and the two ways an event comes in that are not sends (src/db/enqueue/send.ts),
 * on a real daemon, worker and PostgreSQL. Each choice pinned:
 *  - a send (`corral.send`, the SQL function, `corral send`) runs the send-time rules: an actor
 *    whose input policy is `reject` refuses it while busy;
 *  - a turn's `emit` is written by the turn's commit and skips them: the emitted event reaches the
 *    same busy `reject` actor, where a send is refused at that moment;
 *  - a dead letter's replay resumes the same event (its id, its payload), and skips them too.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CorralError } from '../../src/client/index.ts';
import { replayDeadLetters } from '../../src/ops/dead-letters.ts';
import { startClientSetup, jobsOf, type ClientSetup } from './helpers.ts';
import { waitFor } from '../helpers/wait.ts';

let s: ClientSetup;

beforeAll(async () => {
  s = await startClientSetup({ retryLimit: 0 }, { workers: 1, capacity: 4 });
});

afterAll(async () => {
  await s?.stop();
});

const running = (actor: string) =>
  waitFor(async () => (await jobsOf(s.pg, actor))[0]?.state === 'active', { what: `${actor}'s turn running`, timeoutMs: 10_000 });

async function codeOf(p: Promise<unknown>): Promise<string | undefined> {
  return p.then(
    () => undefined,
    (e: unknown) => (e instanceof CorralError ? e.code : String(e)),
  );
}

describe('the ways an event comes in', { timeout: 60_000 }, () => {
  it('a send to a busy reject actor is refused; an emit to it in the same moment is enqueued', async () => {
    await s.corral.setInputPolicy('busy-rj', 'reject');
    await s.corral.send('busy-rj/a', { text: 'long', delayMs: 3_000 });
    await running('busy-rj/a');
    // the send-time rule holds for a send, through the client and through SQL
    expect(await codeOf(s.corral.send('busy-rj/a', { text: 'sent' }))).toBe('actor_busy');
    expect(await codeOf(s.pg.query(`select corral.send_event('busy-rj', 'a', '{"text":"sql"}'::jsonb)`))).not.toBeUndefined();
    // a turn elsewhere emits to the busy actor: its commit enqueues the event regardless
    const emitter = await s.corral.send('emitter/a', { text: 'go', emit: { actor: 'busy-rj/a', data: { text: 'emitted' } } });
    await s.corral.waitForTurn(emitter.eventId, { timeoutMs: 20_000 });
    const jobs = await jobsOf(s.pg, 'busy-rj/a');
    expect(jobs.map((j) => j.data.payload)).toEqual([{ text: 'long', delayMs: 3_000 }, { text: 'emitted' }]);
    expect(jobs[0]!.state).toBe('active');
  });

  it("a dead letter's replay resumes the same event, its id and payload, even to a busy reject actor", async () => {
    const dead = await s.corral.send('replay-rj/a', { text: 'x', fail: true, retryable: false });
    expect(await codeOf(s.corral.waitForTurn(dead.eventId, { timeoutMs: 20_000 }))).toBe('dead_lettered');
    await s.corral.setInputPolicy('replay-rj', 'reject');
    await s.corral.send('replay-rj/a', { text: 'long', delayMs: 3_000 });
    await running('replay-rj/a');
    expect(await codeOf(s.corral.send('replay-rj/a', { text: 'sent' }))).toBe('actor_busy');
    const dl = (
      await s.pg.query<{ id: string }>(
        `select id from pgboss.job where name = 'actor-events-dlq' and data->>'sessionId' = 'a' and data->>'agentUid' = 'replay-rj'`,
      )
    ).rows[0]!;
    const [result] = await replayDeadLetters({ db: s.t.daemon.database.db, boss: s.t.daemon.boss, queues: s.t.daemon.queues }, [dl.id]);
    expect(result).toMatchObject({ id: dl.id, status: 'replayed' });
    const jobs = await jobsOf(s.pg, 'replay-rj/a');
    expect(jobs.map((j) => [j.id, j.data.payload])).toContainEqual([dead.eventId, { text: 'x', fail: true, retryable: false }]);
  });
});
