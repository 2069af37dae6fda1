/**
 * `watch` and `waitForTurn`: turn events as they commit, from the daemon's notifications (no
 * polling), across a lost connection; every way a wait ends.
 */
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CorralError, type Corral, type WatchEvent, type WatchGap } from '../../src/client/index.ts';
import { jobsOf, kinds, read, startClientSetup, type ClientSetup } from './helpers.ts';
import { waitFor } from '../helpers/wait.ts';

let s: ClientSetup;
/** Sends events: the watching client's own calls stay the watch's. */
let sender: Corral;

beforeAll(async () => {
  s = await startClientSetup({ retryLimit: 1, retryDelaySeconds: 1, retryDelayMaxSeconds: 1 }, { capacity: 8 });
  sender = await s.connect();
});

afterAll(async () => {
  await s?.stop();
});

const errorOf = async (p: Promise<unknown>): Promise<CorralError> => {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(CorralError);
    return e as CorralError;
  }
  throw new Error('expected a rejection');
};

describe('watch', () => {
  it('yields started and committed of each turn, in order, without a database call while it waits', async () => {
    const watcher = await s.connect();
    const watch = await watcher.watchTurns('w/one');
    const before = watcher.diagnostics();
    expect(before.listening).toBe(1);
    const a = await sender.send('w/one', { text: 'a' });
    const b = await sender.send('w/one', { text: 'b' });
    await sender.send('w/other', { text: 'not watched' });
    let callsWhileWaiting = -1;
    const seen: WatchEvent[] = [];
    for await (const e of watch) {
      seen.push(e);
      if (seen.filter((x) => x.kind === 'committed').length === 2) {
        callsWhileWaiting = watcher.diagnostics().databaseCalls;
        break;
      }
    }
    expect(seen.map((e) => (e.kind === 'gap' ? e.kind : [e.kind, e.eventId]))).toEqual([
      ['started', a.eventId],
      ['committed', a.eventId],
      ['started', b.eventId],
      ['committed', b.eventId],
    ]);
    const first = seen[0]!;
    expect(first).toMatchObject({ actor: { agentUid: 'w', sessionId: 'one' }, attempt: 1 });
    expect(first.kind !== 'gap' && first.epoch).toBeGreaterThan(0);
    // heard, not polled: the watching client made no database call meanwhile
    expect(callsWhileWaiting).toBe(before.databaseCalls);
    expect(watcher.diagnostics().watches).toBe(0); // the `break` closed it
  });

  it('yields failed and dead_lettered, and a wait for that event rejects dead_lettered', async () => {
    const watch = await s.corral.watchTurns('w/fails');
    const sent = await sender.send('w/fails', { fail: true });
    const waited = errorOf(s.corral.waitForTurn(sent.eventId));
    const seen = await read(watch, (x) => x.some((e) => e.kind === 'dead_lettered'));
    expect(kinds(seen)).toEqual(['started#1', 'failed#1', 'started#2', 'dead_lettered#2']);
    const e = await waited;
    expect(e.code).toBe('dead_lettered');
    expect(e.details).toMatchObject({ eventId: sent.eventId });
    // after the fact, read from the database
    expect((await errorOf(s.corral.waitForTurn(sent.eventId))).code).toBe('dead_lettered');
    await watch.close();
  });

  it('ends when its signal aborts, and several watches of one channel each get theirs', async () => {
    const ctl = new AbortController();
    const w1 = await s.corral.watchTurns('w/abort', { signal: ctl.signal });
    const w2 = await s.corral.watchTurns('w/abort');
    const sent = await sender.send('w/abort', { text: 'x' });
    const both = await read(w2, (x) => x.some((e) => e.kind === 'committed'));
    expect(both.map((e) => e.kind)).toEqual(['started', 'committed']);
    ctl.abort();
    expect(await w1.next()).toEqual({ value: undefined, done: true });
    expect((await s.corral.waitForTurn(sent.eventId)).eventId).toBe(sent.eventId);
    expect(s.corral.diagnostics().watches).toBe(1);
    await w2.close();
    expect(await w2.next()).toEqual({ value: undefined, done: true });
    expect(s.corral.diagnostics()).toMatchObject({ watches: 0 });
    const aborted = new AbortController();
    aborted.abort();
    const w3 = await s.corral.watchTurns('w/abort', { signal: aborted.signal });
    expect(await w3.next()).toEqual({ value: undefined, done: true });
    // a watch ended before it began holds nothing
    expect(s.corral.diagnostics().watches).toBe(0);
  });

  it('after its connection is lost, says so with a gap and goes on hearing turns', async () => {
    const watcher = await s.connect({ applicationName: 'watch-reconnect' });
    const watch = await watcher.watchTurns('w/reconnect');
    const killed = await s.pg.query<{ n: number }>(
      `select count(pg_terminate_backend(pid))::int as n from pg_stat_activity
        where application_name = 'watch-reconnect-listen' and datname = current_database()`,
    );
    expect(killed.rows[0]!.n).toBe(1);
    const gap = await read(watch, (x) => x.some((e) => e.kind === 'gap'));
    const g = gap.find((e): e is WatchGap => e.kind === 'gap')!;
    expect(g).toMatchObject({ kind: 'gap', reason: 'reconnected' });
    expect(g.until.getTime()).toBeGreaterThanOrEqual(g.since.getTime());
    const sent = await sender.send('w/reconnect', { text: 'after' });
    const after = await read(watch, (x) => x.some((e) => e.kind === 'committed'));
    expect(after.flatMap((e) => (e.kind === 'gap' ? [] : [[e.kind, e.eventId]]))).toEqual([
      ['started', sent.eventId],
      ['committed', sent.eventId],
    ]);
    expect(watcher.diagnostics().reconnects).toBe(1);
  });

  it('drops what a consumer that falls behind did not read, for one overflow gap', async () => {
    const watch = await s.corral.watchTurns('w/slow', { maxBuffered: 2 });
    const sent = await sender.sendMany(Array.from({ length: 3 }, (_, i) => ({ actor: 'w/slow', data: { text: `s${i}` } })));
    await Promise.all(sent.map((e) => s.corral.waitForTurn(e.eventId)));
    // their 6 events arrived unread (on the connection the waits share): the buffer held at most 2
    const seen = await read(watch, (x) => x.some((e) => e.kind === 'committed' && e.eventId === sent[2]!.eventId), 5_000);
    expect(seen[0]).toMatchObject({ kind: 'gap', reason: 'overflow' });
    expect(seen.length).toBeLessThanOrEqual(3);
    await watch.close();
  });
});

describe('waitForTurn', () => {
  it('returns a turn committed before the wait began, read from the database', async () => {
    const sent = await sender.send('wt/before', { text: 'early' });
    await waitFor(async () => (await sender.transcript('wt/before')).length === 1, { what: 'the commit' });
    const turn = await s.corral.waitForTurn(sent.eventId);
    expect(turn.messages[1]!.content).toEqual({ text: 'echo: early' });
    expect(turn).toMatchObject({ eventId: sent.eventId, attempt: 1, workerId: 'cw-0' });
  });

  it('rejects timeout, aborted, not_found, invalid_argument and cancelled', async () => {
    const slow = await sender.send('wt/slow', { text: 'slow', delayMs: 3_000 });
    const t0 = Date.now();
    expect((await errorOf(s.corral.waitForTurn(slow.eventId, { timeoutMs: 200 }))).code).toBe('timeout');
    expect(Date.now() - t0).toBeLessThan(2_500);

    const ctl = new AbortController();
    const waiting = errorOf(s.corral.waitForTurn(slow.eventId, { signal: ctl.signal }));
    setTimeout(() => ctl.abort(new Error('no longer needed')), 50);
    expect((await waiting).code).toBe('aborted');
    expect((await errorOf(s.corral.waitForTurn(slow.eventId, { signal: AbortSignal.abort() }))).code).toBe('aborted');

    expect((await errorOf(s.corral.waitForTurn('01234567-89ab-7def-8123-456789abcdef'))).code).toBe('not_found');
    expect((await errorOf(s.corral.waitForTurn('not-a-uuid'))).code).toBe('invalid_argument');
    expect((await errorOf(s.corral.waitForTurn(slow.eventId, { timeoutMs: 0 }))).code).toBe('invalid_argument');

    const cancelled = errorOf(s.corral.waitForTurn(slow.eventId, { timeoutMs: 20_000 }));
    await waitFor(async () => (await sender.actor('wt/slow')).activation?.currentEventId === slow.eventId, { what: 'the turn running' });
    const c = await sender.cancel('wt/slow', 'changed my mind');
    expect(c.eventId).toBe(slow.eventId);
    expect((await cancelled).code).toBe('cancelled');
    expect((await errorOf(s.corral.waitForTurn(slow.eventId))).code).toBe('cancelled');
    expect((await errorOf(sender.cancel('wt/slow'))).code).toBe('not_found');
    expect(s.corral.diagnostics().waits).toBe(0);
  });

  it('at its deadline reads the event once more: a job dead-lettered without a turn event rejects dead_lettered', async () => {
    // an event deferred for an hour: no daemon holds it, so nothing of corral's sees it fail
    const actor = { agentUid: 'w', sessionId: 'unannounced' };
    const id = await s.t.daemon.boss.send(
      'actor-events',
      { ...actor, payload: { text: 'later' }, enqueuedAt: new Date().toISOString() },
      { singletonKey: 'w/unannounced', startAfter: 3_600 },
    );
    const waiter = await s.connect({ watchLingerMs: 0 });
    const waited = errorOf(waiter.waitForTurn(id!, { timeoutMs: 2_000 }));
    // once it listens (and its read after the LISTEN is done), the job fails unannounced
    await waitFor(() => waiter.diagnostics().listening === 1, { what: 'the wait listening' });
    await new Promise((r) => setTimeout(r, 300));
    // what pg-boss does to a job on its last retry: failed and copied to the dead-letter queue
    await s.pg.query('update pgboss.job set retry_count = retry_limit where id = $1', [id]);
    await s.t.daemon.boss.fail('actor-events', id!, { error: { message: 'failed outside corral (test)' } });
    expect((await jobsOf(s.pg, 'w/unannounced')).map((j) => j.state)).toEqual(['failed']);
    expect((await waited).code).toBe('dead_lettered');
    await waiter.close();
  });

  it('hears a commit after its connection was lost, and a closed client rejects it closed', async () => {
    const waiter = await s.connect({ applicationName: 'wait-reconnect' });
    const sent = await sender.send('wt/reconnect', { text: 'later', delayMs: 800 });
    const waiting = waiter.waitForTurn(sent.eventId, { timeoutMs: 20_000 });
    await waitFor(() => waiter.diagnostics().listening === 1, { what: 'the wait listening' });
    const admin = new pg.Client({ connectionString: s.t.db.url });
    await admin.connect();
    try {
      await admin.query(
        `select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'wait-reconnect-listen' and datname = current_database()`,
      );
    } finally {
      await admin.end();
    }
    expect((await waiting).messages[1]!.content).toMatchObject({ text: 'echo: later' });

    const long = await sender.send('wt/reconnect', { text: 'long', delayMs: 2_000 });
    const pending = errorOf(waiter.waitForTurn(long.eventId));
    await waitFor(() => waiter.diagnostics().waits === 1, { what: 'the wait registered' });
    await waiter.close();
    expect((await pending).code).toBe('closed');
  });

  it('steers the live turn of an actor', async () => {
    const sent = await sender.send('wt/steer', { text: 'steer me', delayMs: 1_000 });
    // accepted: the worker has the turn, so the steer reaches its handler
    await waitFor(
      async () =>
        (await s.pg.query(`select 1 from corral.deliveries where event_id = $1 and state = 'accepted'`, [sent.eventId])).rowCount === 1,
      { what: 'the turn running on its worker' },
    );
    const steered = await sender.steer('wt/steer', { tone: 'brief' });
    expect(steered).toMatchObject({ eventId: sent.eventId, revision: 1 });
    const turn = await s.corral.waitForTurn(sent.eventId);
    expect(turn.messages[1]!.content).toMatchObject({ text: 'echo: steer me', steered: { tone: 'brief' } });
    expect((await errorOf(sender.steer('wt/steer', { x: 'y'.repeat(7000) }))).code).toBe('invalid_argument');
  });
});
