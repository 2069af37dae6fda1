/**
 * The chaos scenarios (a)–(h). Each starts its own processes on a fresh database, starts the
 * producer, injects its fault while turns are in flight, and returns; the harness then waits for
 * quiescence and checks the invariants. `verify` adds scenario-specific checks.
 */
import { DELIVERY_LIVE } from '../../src/db/schema.ts';
import { sleep, waitFor } from '../helpers/wait.ts';
import type { ChildHandle } from './cluster.ts';
import { rng } from './plan.ts';
import type { Scenario, ScenarioContext, ScenarioResult } from './runner.ts';

/** Polls `check` until truthy (errors count as "not yet"); `what` names the step in a timeout. */
const waitUntil = <T>(what: string, check: () => Promise<T | undefined | null | false>, timeoutMs: number, intervalMs = 100): Promise<T> =>
  waitFor(check, { what: `chaos: ${what}`, timeoutMs, intervalMs });

const WORKERS = ['w1', 'w2', 'w3'];

async function daemonWithWorkers(ctx: ScenarioContext, ids = WORKERS, opts: { duplicate?: string[]; capacity?: number } = {}) {
  const c = ctx.cluster;
  // Start everything at once (node start-up dominates on a small machine); workers reconnect
  // until the daemon binds.
  const d = await c.startDaemon('daemon', undefined, { wait: false });
  const workers = new Map<string, ChildHandle>();
  for (const id of ids) {
    workers.set(
      id,
      await c.startWorker({ id, capacity: opts.capacity ?? 4, duplicateResults: opts.duplicate?.includes(id) ?? false }, d.endpoint),
    );
  }
  await c.waitDaemonRunning(d);
  await Promise.all(ids.map((id) => c.waitWorkerReady(d, id)));
  ctx.log(`daemon ${d.pid} on ${d.endpoint}; workers ${ids.join(', ')}`);
  return { d, workers };
}

/** Two daemons on one database (A, B), each with two workers (a1, a2 / b1, b2), all ready. */
async function twoDaemonsWithWorkers(ctx: ScenarioContext): Promise<{ dA: ChildHandle; dB: ChildHandle }> {
  const { cluster: c } = ctx;
  const dA = await c.startDaemon('daemonA', undefined, { wait: false });
  const dB = await c.startDaemon('daemonB', undefined, { wait: false });
  const pairs: [string, ChildHandle][] = [
    ['a1', dA],
    ['a2', dA],
    ['b1', dB],
    ['b2', dB],
  ];
  for (const [id, d] of pairs) await c.startWorker({ id, capacity: 4 }, d.endpoint);
  await Promise.all([c.waitDaemonRunning(dA), c.waitDaemonRunning(dB)]);
  await Promise.all(pairs.map(([id, d]) => c.waitWorkerReady(d, id)));
  return { dA, dB };
}

type Accepted = { deliveryId: string; eventId: string; actorEpoch: number }[];

/**
 * Waits until `workerId` is mid-turn (has an accepted delivery); returns those deliveries. With
 * `orKillIdle`, a worker that gets no turn in time (dispatch went elsewhere, or the work ran out
 * on a slow machine) is reported as idle (empty list) instead of failing the scenario: it is
 * killed anyway, and the invariants are checked all the same.
 */
async function midTurn(ctx: ScenarioContext, workerId: string, min = 1, timeoutMs = 20_000, orKillIdle = false): Promise<Accepted> {
  if (orKillIdle) {
    return midTurn(ctx, workerId, min, timeoutMs).catch(() => {
      ctx.log(`${workerId} had no accepted turn within ${timeoutMs} ms; killing it idle`);
      return [];
    });
  }
  return waitUntil(
    `${workerId} mid-turn (${min}+ accepted deliveries)`,
    async () => {
      const acc = await ctx.db.acceptedBy(workerId);
      return acc.length >= min ? acc : undefined;
    },
    timeoutMs,
    20,
  );
}

/** (a) kill -9 workers mid-turn: one restarted after a pause, one never, one restarted at once. */
export const workerKill: Scenario = {
  id: 'a-worker-kill',
  title: 'kill -9 workers mid-turn (restart later / never / at once)',
  async run(ctx) {
    const { cluster: c } = ctx;
    const { d, workers } = await daemonWithWorkers(ctx);
    void ctx.startProducer();
    await ctx.waitSettled(0.15);
    let acc = await midTurn(ctx, 'w1');
    c.kill9(workers.get('w1')!);
    ctx.log(`kill -9 w1 with ${acc.length} accepted turn(s); restarting it in 1 s`);
    await sleep(1_000);
    await c.startWorker({ id: 'w1', capacity: 4 }, d.endpoint, d);
    await ctx.waitSettled(0.4);
    acc = await midTurn(ctx, 'w2', 1, 20_000, true);
    c.kill9(workers.get('w2')!);
    ctx.log(`kill -9 w2 with ${acc.length} accepted turn(s); not restarted`);
    await ctx.waitSettled(0.6);
    acc = await midTurn(ctx, 'w3', 1, 20_000, true);
    await c.kill9AndWait(workers.get('w3')!);
    ctx.log(`kill -9 w3 with ${acc.length} accepted turn(s); restarting it at once (same id)`);
    await c.startWorker({ id: 'w3', capacity: 4 }, d.endpoint, d);
  },
};

/** (b) SIGSTOP a worker past its lease, then SIGCONT: its late results must be rejected. */
export const workerStop: Scenario = {
  id: 'b-worker-sigstop',
  title: 'SIGSTOP a worker past its lease, then SIGCONT (and a short stop under the lease)',
  // Longer turns, so the stop surely lands while handlers are running.
  plan: { delayMs: [200, 1500], slowFraction: 0.6 },
  async run(ctx) {
    const { cluster: c, timings } = ctx;
    const { workers } = await daemonWithWorkers(ctx);
    void ctx.startProducer();
    await ctx.waitSettled(0.1);
    const w1 = workers.get('w1')!;
    // Turns w1 is certainly in the middle of (≥ 400 ms of their delay left): it cannot have sent
    // their results before the stop.
    const busy = await waitUntil(
      'w1 in the middle of a long turn',
      async () => {
        const b = await ctx.db.busyOn('w1', 400);
        return b.length > 0 ? b : undefined;
      },
      30_000,
      20,
    );
    const stopAt = Date.now();
    c.pause(w1);
    const stopMs = timings.leaseMs * 2 + 1_000;
    ctx.log(`SIGSTOP w1 in the middle of ${busy.length} turn(s) for ${stopMs} ms (lease ${timings.leaseMs} ms)`);
    await sleep(stopMs);
    c.resume(w1);
    const contAt = Date.now();
    ctx.log('SIGCONT w1');
    Object.assign(ctx.state, { stopAt, contAt, busy });
    // A stop longer than the stale threshold but shorter than the lease: accepted turns may finish.
    await ctx.waitSettled(0.5);
    const w2 = workers.get('w2')!;
    const acc2 = await midTurn(ctx, 'w2');
    const shortMs = Math.round((timings.workerStaleMs + timings.leaseMs) / 2);
    c.pause(w2);
    ctx.log(`SIGSTOP w2 with ${acc2.length} accepted turn(s) for ${shortMs} ms (stale ${timings.workerStaleMs} ms < stop < lease)`);
    await sleep(shortMs);
    c.resume(w2);
  },
  async verify(ctx, result) {
    const { stopAt, contAt, busy } = ctx.state as { stopAt: number; contAt: number; busy: { deliveryId: string; eventId: string }[] };
    const { rows } = await ctx.db.pool.query<{
      delivery_id: string;
      event_id: string;
      state: string;
      state_reason: string | null;
      turn_status: string | null;
      finished_at: Date | null;
      committed_by: string | null;
    }>(
      `select d.delivery_id, d.event_id, d.state, d.state_reason, t.status as turn_status, t.finished_at,
              (select s.delivery_id from corral.turns s where s.event_id = d.event_id and s.status = 'succeeded') as committed_by
         from corral.deliveries d left join corral.turns t on t.delivery_id = d.delivery_id
        where d.delivery_id = any($1::uuid[])`,
      [busy.map((s) => s.deliveryId)],
    );
    ctx.expect(
      rows.length === busy.length,
      'frozen_delivery_missing',
      `${busy.length - rows.length} delivery row(s) of the frozen worker are gone`,
    );
    // The worker was frozen before these turns finished and stayed frozen past their lease: none
    // of them may commit (its late results are rejected by the fence, which the rows prove: the
    // delivery ended without completing, its turn did not succeed, and the event committed, if at
    // all, under another delivery).
    for (const r of rows) {
      const where = `delivery ${r.delivery_id} (event ${r.event_id}) of the frozen worker`;
      ctx.expect(
        r.state !== 'completed' && r.turn_status !== 'succeeded',
        'frozen_turn_committed',
        `${where} committed at ${r.finished_at?.toISOString()} although it was mid-turn when frozen at ${new Date(stopAt).toISOString()} and its lease ran out before ${new Date(contAt).toISOString()}`,
        r,
      );
      ctx.expect(
        !(DELIVERY_LIVE as readonly string[]).includes(r.state),
        'frozen_delivery_live',
        `${where} is still ${r.state} after quiescence`,
        r,
      );
      ctx.expect(r.committed_by !== r.delivery_id, 'late_result_accepted', `${where} is the one its event committed under`, r);
    }
    result.notes.push(
      `frozen w1 was mid-turn on ${busy.length} turn(s) for ${contAt - stopAt} ms: deliveries now ${rows.map((r) => `${r.state}${r.state_reason ? `(${r.state_reason})` : ''}`).join(', ')}; ` +
        `committed later under another delivery: ${rows.filter((r) => r.committed_by && r.committed_by !== r.delivery_id).length}`,
    );
  },
};

/** (c) kill -9 the daemon mid-run and start it again (twice: after a pause, then at once). */
export const daemonKill: Scenario = {
  id: 'c-daemon-kill',
  title: 'kill -9 the daemon mid-run, restart it (twice)',
  async run(ctx) {
    const { cluster: c } = ctx;
    const { d } = await daemonWithWorkers(ctx);
    void ctx.startProducer();
    await ctx.waitSettled(0.2);
    await waitUntil('a turn in flight', async () => (await ctx.db.acceptedCount()) > 0, 20_000, 20);
    await c.kill9AndWait(d);
    ctx.log('kill -9 daemon; restarting it in 1 s on the same endpoint');
    await sleep(1_000);
    const d2 = await c.startDaemon('daemon', d.endpoint);
    await Promise.all(WORKERS.map((id) => c.waitWorkerReady(d2, id, d2.startedAt)));
    ctx.log('daemon restarted, workers registered again');
    // Generous: jobs the killed daemon fetched but never began hold their actors until pg-boss
    // fails them (job heartbeat + its supervise interval).
    await ctx.waitSettled(0.55, 120_000);
    await waitUntil('a turn in flight', async () => (await ctx.db.acceptedCount()) > 0, 20_000, 20);
    await c.kill9AndWait(d2);
    ctx.log('kill -9 daemon again; restarting it at once');
    const d3 = await c.startDaemon('daemon', d.endpoint);
    await Promise.all(WORKERS.map((id) => c.waitWorkerReady(d3, id, d3.startedAt)));
  },
};

/**
 * After a fault the daemon should still run; if it died, that is recorded (an unexpected exit is
 * a violation) and it is started again, as a service manager would, so the rest can be checked.
 */
async function reviveIfDead(ctx: ScenarioContext, d: ChildHandle, workers: string[], timeoutMs = 60_000): Promise<ChildHandle> {
  // After the fault the daemon either dies or goes on settling events: wait for one of the two
  // (a failing progress query, while the server comes back, counts as "not yet").
  const before = await waitUntil('progress readable', () => ctx.db.progress(), timeoutMs);
  await waitUntil(
    `${d.name} settling events again (or dead)`,
    async () => {
      if (d.exited) return true;
      const p = await ctx.db.progress();
      return p.settled > before.settled || p.settled >= ctx.events.length;
    },
    timeoutMs,
  );
  if (!d.exited) return d;
  ctx.log(`${d.name} died (see its log); restarting it on ${d.endpoint}`);
  const next = await ctx.cluster.startDaemon('daemon', d.endpoint);
  await Promise.all(workers.map((id) => ctx.cluster.waitWorkerReady(next, id, next.startedAt)));
  return next;
}

/** (d) restart PostgreSQL mid-run (embedded server only). */
export const pgRestart: Scenario = {
  id: 'd-pg-restart',
  title: 'restart PostgreSQL mid-run (twice)',
  needsServerControl: true,
  async run(ctx) {
    let { d } = await daemonWithWorkers(ctx);
    // Everything is enqueued before the server goes away (the producer does not retry).
    await ctx.startProducer();
    await ctx.waitSettled(0.2);
    await waitUntil('a turn in flight', async () => (await ctx.db.acceptedCount()) > 0, 20_000, 20);
    ctx.log('stopping PostgreSQL for 2 s');
    await ctx.env.restartServer!(2_000);
    ctx.log('PostgreSQL is back');
    d = await reviveIfDead(ctx, d, WORKERS);
    await ctx.waitSettled(0.6, 90_000);
    await waitUntil('a turn in flight', async () => (await ctx.db.acceptedCount()) > 0, 20_000, 20);
    ctx.log('restarting PostgreSQL at once');
    await ctx.env.restartServer!(0);
    ctx.log('PostgreSQL is back');
    await reviveIfDead(ctx, d, WORKERS);
  },
};

/** (e) workers that send every result twice. */
export const duplicateResults: Scenario = {
  id: 'e-duplicate-results',
  title: 'workers send every result twice (--duplicate-results)',
  async run(ctx) {
    await daemonWithWorkers(ctx, WORKERS, { duplicate: ['w1', 'w2'] });
    void ctx.startProducer();
  },
  verify(ctx, result) {
    const s = result.stats;
    const answered = (s?.duplicates ?? 0) + (s?.rejected.already_committed ?? 0);
    ctx.expect(answered > 0, 'no_duplicates_seen', 'the daemon logged no duplicate result although two workers send every result twice', s);
    result.notes.push(
      `duplicate results answered with the committed outcome: ${s?.duplicates ?? 0}; rejected as already_committed: ${s?.rejected.already_committed ?? 0}`,
    );
  },
};

/** (f) two daemons on one database, each with its own workers; one is killed -9 mid-run. */
export const twoDaemons: Scenario = {
  id: 'f-two-daemons',
  title: 'two daemons on one database, one killed -9 mid-run',
  async run(ctx) {
    const { cluster: c } = ctx;
    const { dA, dB } = await twoDaemonsWithWorkers(ctx);
    ctx.log(`daemonA ${dA.endpoint} (a1, a2), daemonB ${dB.endpoint} (b1, b2)`);
    void ctx.startProducer();
    await ctx.waitSettled(0.25);
    await waitUntil(
      'daemonA mid-turn',
      async () => (await ctx.db.acceptedBy('a1')).length + (await ctx.db.acceptedBy('a2')).length > 0,
      20_000,
      20,
    );
    await c.kill9AndWait(dA);
    ctx.log('kill -9 daemonA (not restarted; its workers keep trying to reconnect)');
    Object.assign(ctx.state, { killedAt: Date.now() });
  },
  verify(_ctx, result) {
    result.notes.push(`commits logged: ${result.stats?.committed ?? 0} (both daemons)`);
  },
};

/**
 * (h) a daemon frozen (SIGSTOP) past its leases while another daemon runs on the same database,
 * then resumed: the other daemon's watchdog fails the frozen one's turns, and whatever the
 * frozen daemon does after waking (its in-memory turns are stale) must be fenced off. Then the
 * other way round.
 */
export const daemonStop: Scenario = {
  id: 'h-daemon-sigstop',
  title: 'SIGSTOP a daemon past its leases (another daemon on the database), then SIGCONT',
  plan: { delayMs: [100, 900], slowFraction: 0.6 },
  async run(ctx) {
    const { cluster: c, timings } = ctx;
    const { dA, dB } = await twoDaemonsWithWorkers(ctx);
    void ctx.startProducer(10, 300);
    const freeze = async (d: ChildHandle, ws: string[], fraction: number) => {
      await ctx.waitSettled(fraction, 90_000);
      await waitUntil(
        `${d.name}'s workers mid-turn`,
        async () => (await Promise.all(ws.map((w) => ctx.db.acceptedBy(w)))).some((x) => x.length > 0),
        20_000,
        20,
      );
      const ms = timings.leaseMs * 2 + 1_000;
      c.pause(d);
      ctx.log(`SIGSTOP ${d.name} for ${ms} ms`);
      await sleep(ms);
      c.resume(d);
      ctx.log(`SIGCONT ${d.name}`);
    };
    await freeze(dA, ['a1', 'a2'], 0.15);
    await freeze(dB, ['b1', 'b2'], 0.5);
  },
};

/**
 * (g) everything at once, driven by the seed: two daemons with two workers each (one of them
 * sending duplicate results); while a slow producer runs, every 0.7–2.5 s one of: kill -9 a
 * worker (restart at once / after 1 s), SIGSTOP a worker (under or past its lease), kill -9 a
 * daemon (restart at once / after 1 s on the same endpoint).
 */
export const mixed: Scenario = {
  id: 'g-mixed',
  title: 'random mix: worker kill/stop, daemon kill, duplicates, two daemons',
  plan: { delayMs: [100, 900], slowFraction: 0.6 },
  async run(ctx) {
    const { cluster: c, timings } = ctx;
    const rand = rng(ctx.seed ^ 0x5eed);
    const pick = <T>(xs: T[]): T => xs[Math.floor(rand() * xs.length)]!;
    const daemons = new Map<string, ChildHandle>();
    daemons.set('daemonA', await c.startDaemon('daemonA', undefined, { wait: false }));
    daemons.set('daemonB', await c.startDaemon('daemonB', undefined, { wait: false }));
    const home: Record<string, string> = { a1: 'daemonA', a2: 'daemonA', b1: 'daemonB', b2: 'daemonB' };
    const workers = new Map<string, ChildHandle>();
    for (const [id, dn] of Object.entries(home)) {
      workers.set(id, await c.startWorker({ id, capacity: 3, duplicateResults: id === 'a2' }, daemons.get(dn)!.endpoint));
    }
    for (const d of daemons.values()) await c.waitDaemonRunning(d);
    await Promise.all(Object.entries(home).map(([id, dn]) => c.waitWorkerReady(daemons.get(dn)!, id)));
    const producing = ctx.startProducer(10, 700);
    let done = false;
    void producing.finally(() => {
      done = true;
    });
    const actions: string[] = [];
    const startedAt = Date.now();
    const total = ctx.events.length;
    // Keep the chaos going while events arrive and until most are settled (at most 2 minutes).
    while (Date.now() - startedAt < 120_000) {
      const p = await ctx.db.progress().catch(() => undefined);
      if (done && p && p.settled >= total * 0.95) break;
      await sleep(700 + rand() * 1800);
      const r = rand();
      if (r < 0.4) {
        const id = pick([...workers.keys()]);
        const w = workers.get(id)!;
        const d = daemons.get(home[id]!)!;
        await c.kill9AndWait(w);
        const later = rand() < 0.5;
        if (later) await sleep(1_000);
        workers.set(id, await c.startWorker({ id, capacity: 3, duplicateResults: id === 'a2' }, d.endpoint));
        actions.push(`kill -9 ${id}${later ? ' (restart after 1 s)' : ''}`);
      } else if (r < 0.75) {
        const id = pick([...workers.keys()]);
        const w = workers.get(id)!;
        if (w.exited) continue;
        const ms = rand() < 0.5 ? Math.round(timings.workerStaleMs * 1.3) : timings.leaseMs * 2 + 500;
        c.pause(w);
        await sleep(ms);
        c.resume(w);
        actions.push(`SIGSTOP ${id} ${ms} ms`);
      } else {
        const dn = pick([...daemons.keys()]);
        const d = daemons.get(dn)!;
        await c.kill9AndWait(d);
        const later = rand() < 0.5;
        if (later) await sleep(1_000);
        // Not waiting for it: the next fault may hit it while it starts (migrations, recovery).
        const next = await c.startDaemon(dn, d.endpoint, { wait: false });
        daemons.set(dn, next);
        actions.push(`kill -9 ${dn}${later ? ' (restart after 1 s)' : ''}`);
      }
      ctx.log(`chaos: ${actions.at(-1)}`);
    }
    ctx.note(`${actions.length} faults: ${actions.join('; ')}`);
  },
};

/** The load of the coalesce scenarios: bursts per actor, and turns long enough for more to queue behind them. */
const BATCH_LOAD: Scenario['plan'] = { delayMs: [150, 900], slowFraction: 0.6, burst: [2, 6] };

/**
 * Waits until a batch is mid-turn (an accepted delivery that took more than its own event), on
 * one of `workerIds` if given. With `orIdle`, none in time is reported (empty list) instead of
 * failing the scenario: the fault is injected anyway.
 */
async function midBatch(ctx: ScenarioContext, workerIds: string[] | undefined, timeoutMs = 20_000, orIdle = false) {
  const what = `a batch mid-turn${workerIds ? ` on ${workerIds.join('/')}` : ''}`;
  return waitUntil(
    what,
    async () => {
      const b = await ctx.db.acceptedBatches(workerIds);
      return b.length > 0 ? b : undefined;
    },
    timeoutMs,
    20,
  ).catch((e: unknown) => {
    if (!orIdle) throw e;
    ctx.log(`no ${what} within ${timeoutMs} ms; injecting the fault anyway`);
    return [];
  });
}

/** Batches must have happened (else the scenario tested nothing of coalesce); notes what they were. */
function verifyBatches(ctx: ScenarioContext, result: ScenarioResult) {
  const b = result.summary?.batches;
  ctx.expect(
    (b?.committed ?? 0) > 0,
    'no_batches',
    'no succeeded turn took a batch (turns.coalesced) although the input policy is coalesce and events came in bursts',
    b,
  );
  const hit = (ctx.state.batchesHit as number[] | undefined) ?? [];
  result.notes.push(
    `batches: ${b?.committed ?? 0} committed (${b?.committedMembers ?? 0} events as members, largest ${b?.largest ?? 0}), ` +
      `${b?.retriedThenCommitted ?? 0} retried then committed, ${b?.deadLettered ?? 0} dead-lettered whole; ` +
      `faults hit ${hit.filter((n) => n > 0).length}/${hit.length} times with a batch mid-turn`,
  );
}

/**
 * (i) input policy coalesce (CORRAL_INPUT_POLICY of the daemon), events in bursts: kill -9 workers
 * while they run batches (restart after 1 s / at once) and kill -9 the daemon while batches run
 * (restart after 1 s / at once). Every batch's events commit once, together, in order.
 */
export const coalesceKill: Scenario = {
  id: 'i-coalesce-kill',
  title: 'coalesce: kill -9 workers and the daemon while batches run, restart them',
  plan: BATCH_LOAD,
  daemonEnv: { CORRAL_INPUT_POLICY: 'coalesce' },
  async run(ctx) {
    const { cluster: c } = ctx;
    let { d, workers } = await daemonWithWorkers(ctx);
    const hit: number[] = [];
    ctx.state.batchesHit = hit;
    void ctx.startProducer(10, 250);
    await ctx.waitSettled(0.1);
    let b = await midBatch(ctx, ['w1'], 20_000, true);
    hit.push(b.length);
    c.kill9(workers.get('w1')!);
    ctx.log(`kill -9 w1 with ${b.length} batch(es) mid-turn; restarting it in 1 s`);
    await sleep(1_000);
    workers.set('w1', await c.startWorker({ id: 'w1', capacity: 4 }, d.endpoint, d));
    b = await midBatch(ctx, undefined, 20_000, true);
    hit.push(b.length);
    await c.kill9AndWait(d);
    ctx.log(`kill -9 daemon with ${b.length} batch(es) mid-turn; restarting it in 1 s`);
    await sleep(1_000);
    d = await c.startDaemon('daemon', d.endpoint);
    await Promise.all(WORKERS.map((id) => c.waitWorkerReady(d, id, d.startedAt)));
    // Generous: jobs the killed daemon fetched but never began hold their actors until pg-boss
    // fails them (job heartbeat + its supervise interval).
    await ctx.waitSettled(0.45, 120_000);
    b = await midBatch(ctx, ['w2'], 20_000, true);
    hit.push(b.length);
    await c.kill9AndWait(workers.get('w2')!);
    ctx.log(`kill -9 w2 with ${b.length} batch(es) mid-turn; restarting it at once`);
    workers.set('w2', await c.startWorker({ id: 'w2', capacity: 4 }, d.endpoint, d));
    b = await midBatch(ctx, undefined, 20_000, true);
    hit.push(b.length);
    await c.kill9AndWait(d);
    ctx.log(`kill -9 daemon with ${b.length} batch(es) mid-turn; restarting it at once`);
    d = await c.startDaemon('daemon', d.endpoint);
    await Promise.all(WORKERS.map((id) => c.waitWorkerReady(d, id, d.startedAt)));
  },
  verify: verifyBatches,
};

/**
 * (j) coalesce as a stored policy (`corral.input_policies`: every agent, at most 4 events a turn;
 * one actor's own row says queue, and wins), two daemons on one database, one killed -9 while
 * its workers run batches (not restarted): the other one retries them as they were.
 */
export const coalesceTwoDaemons: Scenario = {
  id: 'j-coalesce-two-daemons',
  title: 'coalesce (policy rows, max 4 events): two daemons, one killed -9 while batches run',
  plan: BATCH_LOAD,
  async run(ctx) {
    const { cluster: c } = ctx;
    const agents = [...new Set(ctx.events.map((e) => e.actor.agentUid))];
    for (const a of agents) await ctx.db.setInputPolicy(a, null, 'coalesce', { maxEvents: 4 });
    const own = ctx.events[0]!.actor;
    await ctx.db.setInputPolicy(own.agentUid, own.sessionId, 'queue');
    ctx.log(`policy coalesce (max 4 events) for ${agents.length} agents; queue for ${own.agentUid}/${own.sessionId}`);
    const { dA, dB } = await twoDaemonsWithWorkers(ctx);
    ctx.log(`daemonA ${dA.endpoint} (a1, a2), daemonB ${dB.endpoint} (b1, b2)`);
    void ctx.startProducer(10, 250);
    await ctx.waitSettled(0.2);
    const b = await midBatch(ctx, ['a1', 'a2'], 20_000, true);
    ctx.state.batchesHit = [b.length];
    await c.kill9AndWait(dA);
    ctx.log(`kill -9 daemonA with ${b.length} batch(es) mid-turn (not restarted)`);
  },
  verify: verifyBatches,
};

export const SCENARIOS: Scenario[] = [
  workerKill,
  workerStop,
  daemonKill,
  pgRestart,
  duplicateResults,
  twoDaemons,
  mixed,
  daemonStop,
  coalesceKill,
  coalesceTwoDaemons,
];

export function findScenario(id: string): Scenario | undefined {
  const x = id.toLowerCase();
  return SCENARIOS.find((s) => s.id === x || s.id.startsWith(`${x}-`) || s.id.slice(2) === x);
}
