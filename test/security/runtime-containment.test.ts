/**
 * An insider (a worker the daemon admits) against the dispatch side of the runtime, on real
 * sockets and PostgreSQL: a worker that hands back every turn is offered few of them while an
 * honest peer works; a turn whose turn_start went to a connection the worker then left is sent
 * again at once; a worker's RPC beyond its budget is answered `busy` and counted.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { sql } from '../../src/db/orm.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { RawPeer, type Msg } from '../helpers/raw-peer.ts';
import { waitFor } from '../helpers/wait.ts';
import { sendEvent, sendMany } from '../helpers/send.ts';

let t: TestDaemon | undefined;
const peers: RawPeer[] = [];
const loops: Promise<void>[] = [];
let stopping = false;

afterEach(async () => {
  stopping = true;
  for (const p of peers.splice(0)) await p.close();
  await Promise.allSettled(loops.splice(0));
  await t?.stop();
  t = undefined;
  stopping = false;
});

async function peer(id: string, capacity: number, extra: Record<string, unknown> = {}): Promise<RawPeer> {
  const p = new RawPeer(t!.daemon.broker.endpoint, `${id}-${peers.length}`, undefined, id);
  peers.push(p);
  await p.register(capacity, extra);
  return p;
}

/** Answers every turn_start `p` gets with `reply(start)` until the test ends. */
function serve(p: RawPeer, reply: (start: Msg) => Record<string, unknown>): void {
  loops.push(
    (async () => {
      while (!stopping) {
        const start = await p.next('turn_start', () => true, 500).catch(() => undefined);
        if (start) await p.send(reply(start));
      }
    })(),
  );
}

const commitIt = (start: Msg) => ({
  type: 'turn_result',
  turn_ref: start.turn_ref,
  messages: [{ role: 'assistant', content: { text: 'ok' } }],
});
const handBack = (start: Msg) => ({
  type: 'turn_error',
  turn_ref: start.turn_ref,
  error: { code: 'over_capacity', message: 'no room', retryable: true },
});

describe('a worker that hands back every turn', () => {
  it('gets at most a quarter of the first offers against one honest worker, and every turn commits on the honest one', async () => {
    t = await startTestDaemon({ fetchBatchSize: 50 });
    const db = t.daemon.database.db;
    // a large registered capacity buys it nothing: it is given a few turns until it shows it takes them
    const bad = await peer('bad', 64);
    const good = await peer('good', 4);
    serve(bad, handBack);
    serve(good, commitIt);
    const events = Array.from({ length: 100 }, (_, i) => ({ key: actorKey(`handback-${i}`, 's'), event: { i } }));
    const enqueued = await sendMany(db, events);
    const committed = async () =>
      Number(
        (await db.execute<{ n: string }>(sql`select count(*) as n from corral.turns where status = 'succeeded' and worker_id = 'good'`))
          .rows[0]!.n,
      );
    await waitFor(async () => (await committed()) === enqueued.length, {
      timeoutMs: 60_000,
      intervalMs: 100,
      what: 'every turn to commit',
    });
    // the first delivery with a worker, of each event: who was offered it first
    const first = await db.execute<{ worker_id: string; n: string }>(sql`
      select worker_id, count(*) as n from (
        select distinct on (event_id) event_id, worker_id from corral.deliveries
         where worker_id is not null order by event_id, created_at, delivery_id) f
      group by worker_id`);
    const offers = Object.fromEntries(first.rows.map((r) => [r.worker_id, Number(r.n)]));
    expect((offers.good ?? 0) + (offers.bad ?? 0)).toBe(100);
    expect(offers.bad ?? 0, JSON.stringify(offers)).toBeLessThanOrEqual(25);
    // nothing was spent on the hand-backs: every event committed on its first attempt
    const attempts = await db.execute<{ max: number }>(sql`select max(attempt)::int as max from corral.turns`);
    expect(attempts.rows[0]!.max).toBe(1);
  }, 90_000);
});

describe('a turn caught in a move', () => {
  it('is sent again at once to the connection the worker registered from, when the worker had not accepted it', async () => {
    t = await startTestDaemon({ leaseMs: 600_000 });
    const first = await peer('mover', 1, { instance: 'run-1' });
    const { eventId } = await sendEvent(t.daemon.database.db, actorKey('move', 's'), { text: 'x' });
    const lost = await first.next('turn_start');
    // the same run registers again from a new connection (a reconnect): the first one got the
    // turn_start, the new one did not
    const second = await peer('mover', 1, { instance: 'run-1' });
    const again = await second.next('turn_start', (m) => (m.turn_ref as { event_id: string }).event_id === eventId, 5_000);
    expect(again.turn_ref).toEqual(lost.turn_ref);
    await second.send(commitIt(again));
    await second.next('turn_committed');
  }, 30_000);

  it('is not sent again once accepted (the worker has it)', async () => {
    t = await startTestDaemon({ leaseMs: 600_000 });
    const first = await peer('keeper', 1, { instance: 'run-1' });
    await sendEvent(t.daemon.database.db, actorKey('keep', 's'), { text: 'x' });
    const start = await first.next('turn_start');
    await first.send({ type: 'turn_accepted', turn_ref: start.turn_ref });
    await waitFor(
      () => t!.daemon.runtime.dispatcher.turnOf((start.turn_ref as { event_id: string }).event_id)?.dispatch.kind === 'accepted',
      {
        what: 'the accept',
      },
    );
    const second = await peer('keeper', 1, { instance: 'run-1' });
    // a heartbeat round trip later, nothing was re-sent
    await second.send({ type: 'worker_heartbeat', worker_id: 'keeper', in_flight: 1 });
    await waitFor(() => t!.daemon.runtime.workers.isReady('keeper'), { what: 'the worker ready' });
    await second.send(commitIt(start));
    await second.next('turn_committed');
    expect(second.ofType('turn_start')).toEqual([]);
  }, 30_000);
});

describe('worker RPC budget', () => {
  it('answers busy beyond the per-second budget, and serves again once it refilled', async () => {
    t = await startTestDaemon({ rpcPerSecond: 5, rpcConcurrency: 50 });
    const p = await peer('rpc', 1);
    await sendEvent(t.daemon.database.db, actorKey('rpc', 's'), { text: 'x' });
    const start = await p.next('turn_start');
    for (let i = 0; i < 20; i++) {
      await p.send({ type: 'rpc_request', id: `r${i}`, method: 'actor.status', turn_ref: start.turn_ref });
    }
    const answers = await p.waitFor('rpc_response', 20, 10_000);
    const busy = answers.filter((a) => 'error' in a && a.error?.code === 'busy');
    const served = answers.filter((a) => 'result' in a);
    // one second's worth in a burst, the rest refused (a few more may refill while they arrive)
    expect(served.length).toBeGreaterThanOrEqual(5);
    expect(served.length).toBeLessThanOrEqual(8);
    expect(busy.length).toBe(20 - served.length);
    expect(busy[0]).toMatchObject({ error: { message: 'at most 5 requests per second per worker' } });
    await waitFor(
      async () => {
        await p.send({ type: 'rpc_request', id: 'later', method: 'actor.status', turn_ref: start.turn_ref });
        return p.ofType('rpc_response').find((a) => a.id === 'later' && 'result' in a);
      },
      { timeoutMs: 5_000, intervalMs: 300, what: 'the budget to refill' },
    );
  }, 30_000);
});
