/**
 * A dead letter pg-boss makes by itself (its expiry of a job active longer than
 * CORRAL_JOB_EXPIRE_S, with no retry left), not by a turn's failure, on a real daemon process:
 * recovery settles it as corral settles its own (src/runtime/attempt-failure.ts,
 * `adoptDeadLetter`). The attempt still running for it ends (its worker's late result is refused),
 * the actor moves on (dead-letter mode `continue`) or is blocked (`block`), and `waitForTurn`,
 * `watchTurns` and `corral.watch` hear `dead_lettered` as for any other dead letter, long before
 * the turn's own end or a wait's timeout.
 */
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { connect, type Corral, type LiveEvent, type WatchEvent } from '../../src/client/index.ts';
import { useTestDatabases } from '../helpers/db.ts';
import { fastRecoveryEnv, freePort, killAll, spawnCorral, stopGracefully, type Proc } from '../helpers/processes.ts';
import { waitFor } from '../helpers/wait.ts';

/** The turn takes far longer than the job may stay active: pg-boss expires it while it runs. */
const TURN_MS = 25_000;

// registered before the afterEach below: a test's database is dropped once its daemon is gone
const databases = useTestDatabases();
let daemon: Proc | undefined;
let corral: Corral | undefined;
let client: pg.Client | undefined;

afterEach(async () => {
  await corral?.close();
  await client?.end();
  await stopGracefully(daemon, 2_000);
  killAll();
  corral = client = daemon = undefined;
});

async function start(mode: 'continue' | 'block'): Promise<void> {
  const db = await databases.fresh();
  const endpoint = `tcp://127.0.0.1:${await freePort()}`;
  daemon = spawnCorral(
    ['daemon', '--workers', '1'],
    {
      ...fastRecoveryEnv(db.url, endpoint),
      // the lease outlives the job's expiry: pg-boss, not corral's watchdog, ends the attempt
      CORRAL_LEASE_MS: '60000',
      CORRAL_JOB_EXPIRE_S: '5',
      CORRAL_JOB_HEARTBEAT_S: '10',
      CORRAL_RETRY_LIMIT: '0',
      CORRAL_DEAD_LETTER_MODE: mode,
    },
    'daemon',
  );
  await waitFor(() => daemon!.log().includes('"worker ready"'), { timeoutMs: 60_000, what: `the worker (log: ${daemon!.logPath})` });
  corral = await connect({ databaseUrl: db.url, env: {} });
  client = new pg.Client({ connectionString: db.url });
  await client.connect();
}

const adoptions = () => daemon!.log().split('the queue dead-lettered an event by itself').length - 1;

describe('a dead letter made by pg-boss itself', () => {
  it('is heard by waitForTurn, watchTurns and watch as a dead letter; its worker is told and the actor moves on', async () => {
    await start('continue');
    const actor = 'expiry/s1';
    const turns = await corral!.watchTurns(actor);
    const live = await corral!.watch(actor);
    const sentAt = Date.now();
    const { eventId } = await corral!.send(actor, { delayMs: TURN_MS, text: 'slow' });

    const waited = await corral!.waitForTurn(eventId, { timeoutMs: 60_000 }).then(
      () => 'committed',
      (e: { code?: string }) => e.code,
    );
    expect(waited).toBe('dead_lettered');
    // heard from the adoption, not from the turn's own end (25 s) or the wait's deadline
    expect(Date.now() - sentAt).toBeLessThan(TURN_MS - 5_000);

    const heard: WatchEvent[] = [];
    for await (const e of turns) {
      heard.push(e);
      if (e.kind === 'dead_lettered') break;
    }
    expect(heard.filter((e) => e.kind !== 'gap').map((e) => [e.kind, e.eventId])).toEqual([
      ['started', eventId],
      ['dead_lettered', eventId],
    ]);
    await turns.close();

    const events: LiveEvent[] = [];
    for await (const e of live) {
      events.push(e);
      if (e.type === 'turn_failed' || e.type === 'turn_committed') break;
    }
    expect(events.map((e) => e.type)).toEqual(['turn_started', 'turn_failed']);
    expect(events[1]!.data).toMatchObject({ reason: 'dead_lettered' });
    await live.close();

    // it is in the dead-letter queue once, and settled once
    const dlq = await client!.query<{ n: number }>(
      `select count(*)::int as n from pgboss.job where name = 'actor-events-dlq' and data->>'payload' is not null`,
    );
    expect(dlq.rows[0]!.n).toBe(1);
    expect(adoptions()).toBe(1);
    // the actor moves on at once (dead-letter mode continue): its next event commits
    const next = await corral!.send(actor, { text: 'after' });
    const committed = await corral!.waitForTurn(next.eventId, { timeoutMs: 30_000 });
    expect(committed.messages.map((m) => m.content)).toContainEqual({ text: 'echo: after' });
    // the expired attempt's worker is told at its next message (its turn stops there), and nothing of it commits
    await waitFor(() => daemon!.log().includes('"msg":"turn rejected by daemon"'), {
      timeoutMs: 30_000,
      what: 'the worker told that its attempt is over',
    });
    const { rows } = await client!.query<{ n: number }>(
      `select count(*)::int as n from corral.turns where event_id = $1 and status = 'succeeded'`,
      [eventId],
    );
    expect(rows[0]!.n).toBe(0);
  }, 120_000);

  it('in dead-letter mode block, blocks the actor on it as corral’s own dead letters do', async () => {
    await start('block');
    const actor = 'expiry/s2';
    const { eventId } = await corral!.send(actor, { delayMs: TURN_MS, text: 'slow' });
    const waited = await corral!.waitForTurn(eventId, { timeoutMs: 60_000 }).then(
      () => 'committed',
      (e: { code?: string }) => e.code,
    );
    expect(waited).toBe('dead_lettered');
    const { rows } = await client!.query<{ blocked: string | null }>(
      `select blocked_by_event_id as blocked from corral.actors where agent_uid = 'expiry' and session_id = 's2'`,
    );
    expect(rows[0]!.blocked).toBe(eventId);
    // a later recovery pass finds nothing more to settle
    await new Promise((r) => setTimeout(r, 1_500));
    expect(adoptions()).toBe(1);
  }, 120_000);
});
