/**
 * Crash test of runtime pruning (src/db/operations/runtime-pruning.ts, P1–P3) on real processes:
 * `corral daemon --workers 2` with `CORRAL_RUNTIME_RETENTION_S=1`, over a seeded history of
 * 105,000 finished turns (activations, deliveries and turns two days old), while 300 events are
 * sent to 30 actors through the client. The daemon and its workers are killed -9 twice while a
 * retention pass deletes and turns are in flight: first amid the deliveries, then (the restarted
 * daemon's pass) amid the activations. A third daemon finishes. Checked from the database:
 *  - every event has exactly one succeeded turn and a completed job; each actor's transcript is
 *    exactly its events' user and assistant messages, in enqueue order;
 *  - never a `started` turn without its delivery, never an actor without its latest activation
 *    (sampled during the whole run, and at the end); a started turn whose delivery finished long
 *    ago, written while a pass runs, keeps its delivery and activation through that pass;
 *  - every row due when the last daemon starts (the rest of the history, and the rows of the turns
 *    run so far once a second old) is gone after its pass; of the history, only each actor's
 *    latest activation is left; the transcript is untouched.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { connect, type Corral } from '../../src/index.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { descendants, freePort, isAlive, killAll, safeKill, spawnCorral, stopGracefully, type Proc, exitOf } from '../helpers/processes.ts';
import { sleep, waitFor } from '../helpers/wait.ts';

/** The seeded history: actors × epochs, one activation, delivery and turn each. */
const HISTORY_ACTORS = 700;
const HISTORY_EPOCHS = 150;
const HISTORY = HISTORY_ACTORS * HISTORY_EPOCHS;
/** The actors the test sends to; each has a few seeded epochs of history too. */
const ACTORS = 30;
const ACTOR_HISTORY_EPOCHS = 5;
const ROUNDS = 10;
const EVENTS = ACTORS * ROUNDS;
const WINDOW_S = 1;
/** The daemon's pruning batch (src/queue/retention.ts). */
const BATCH = 5_000;
const ROUND_GAP_MS = 1_000;
const GATED_ROUND = 7;
const POLL_MS = 100;
/** Marks of the seeded rows. */
const HISTORY_OWNER = 'history-daemon';
const HISTORY_WORKER = 'history-worker';

const actorName = (i: number) => `a${String(i).padStart(2, '0')}`;
const eventData = (actor: number, round: number) => ({
  text: `${actorName(actor)}-e${round}`,
  // long enough that turns are nearly always in flight while the rounds come (a second apart)
  delayMs: 400 + ((actor * 37 + round * 11) % 300),
});

/**
 * `due`: what the rules of docs/data-model.md let a pass delete, with the window's cutoff at the
 * database's clock now: the finished deliveries older than it whose turn is not started (P1), then
 * the ended activations older than it, not their actor's latest, whose deliveries are all among
 * those (P2: a pass deletes deliveries first).
 */
const DUE = `
  create table public.due as
    select 'delivery' as kind, d.delivery_id as id, coalesce(d.worker_id = '${HISTORY_WORKER}', false) as seeded
      from corral.deliveries d
     where d.state in ('completed', 'failed', 'send_failed', 'superseded') and d.updated_at < now() - interval '${WINDOW_S} seconds'
       and not exists (select 1 from corral.turns t where t.delivery_id = d.delivery_id and t.status = 'started');
  create unique index on public.due (id);
  insert into public.due
    select 'activation', a.activation_uid, a.owner_id = '${HISTORY_OWNER}'
      from corral.activations a
     where a.status in ('stopped', 'failed') and a.ended_at < now() - interval '${WINDOW_S} seconds'
       and not exists (select 1 from corral.deliveries d where d.activation_uid = a.activation_uid
                        and not exists (select 1 from public.due x where x.id = d.delivery_id))
       and exists (select 1 from corral.activations n
                    where n.agent_uid = a.agent_uid and n.session_id = a.session_id and n.actor_epoch > a.actor_epoch);
  analyze public.due`;
/** The rows of `due` still there, by kind and origin. */
const DUE_LEFT = `
  select x.kind, x.seeded, count(*)::int as n from public.due x join corral.deliveries d on d.delivery_id = x.id group by 1, 2
  union all
  select x.kind, x.seeded, count(*)::int from public.due x join corral.activations a on a.activation_uid = x.id group by 1, 2
  order by 1, 2`;

/** What must hold at every instant, whatever the daemon is doing; one row per violation. */
const INVARIANTS = `
  select 'a started turn without its delivery' as what, t.id::text as id, t.delivery_id::text as detail
    from corral.turns t
   where t.status = 'started' and not exists (select 1 from corral.deliveries d where d.delivery_id = t.delivery_id)
  union all
  select 'an actor without its latest activation', a.agent_uid || '/' || a.session_id, 'epoch ' || a.epoch_counter
    from corral.actors a
   where a.epoch_counter > 0 and not exists (
     select 1 from corral.activations v
      where v.agent_uid = a.agent_uid and v.session_id = a.session_id and v.actor_epoch = a.epoch_counter)`;

/** `wait`, failing with what `detail` says of the state then. */
async function explained<T>(wait: Promise<T>, detail: () => Promise<string>): Promise<T> {
  try {
    return await wait;
  } catch (e) {
    throw new Error(`${e instanceof Error ? e.message : String(e)}; ${await detail()}`);
  }
}

/** The daemon's failed retention passes, from its log. */
const sweepFailures = (p: Proc) =>
  p
    .log()
    .split('\n')
    .filter((l) => l.includes('retention sweep pass failed'))
    .map((l) => {
      try {
        const err = (JSON.parse(l) as { err?: string | { message?: string } }).err;
        return typeof err === 'string' ? err : (err?.message ?? l);
      } catch {
        return l;
      }
    });

/** kill -9 of a daemon and its worker processes, at once; returns how many workers it had. */
async function killHard(p: Proc): Promise<number> {
  const pids = [p.child.pid!, ...descendants(p.child.pid!)];
  for (const pid of pids) safeKill(pid, 'SIGKILL');
  await exitOf(p);
  await waitFor(() => pids.every((pid) => !isAlive(pid)), { timeoutMs: 10_000, what: 'the killed processes gone' });
  return pids.length - 1;
}

interface Orphan {
  tag: string;
  turnId: string;
  deliveryId: string;
  activationUid: string;
}

describe('kill -9 of the daemon while it prunes runtime rows', () => {
  const tdb = useTestDatabase();
  let sampler: pg.Client | undefined;
  let corral: Corral | undefined;
  let daemon: Proc | undefined;
  let home: string | undefined;
  /** The test's loops (sampler, sender) end once this is false. */
  let running = true;
  let openGate = () => {};
  const loops: Promise<unknown>[] = [];
  /** A loop of the test: awaited by the test, and by the cleanup when the test failed first. */
  const loop = <T>(p: Promise<T>): Promise<T> => {
    p.catch(() => undefined);
    loops.push(p);
    return p;
  };

  afterAll(async () => {
    running = false;
    openGate();
    await Promise.allSettled(loops);
    // a daemon still running here is one the test gave up on: gone at once, with its workers
    if (daemon && daemon.child.exitCode === null && daemon.child.signalCode === null) await killHard(daemon);
    await corral?.close();
    await sampler?.end().catch(() => undefined);
    await stopGracefully(daemon);
    killAll();
    if (home) rmSync(home, { recursive: true, force: true });
  });

  it('loses and doubles no event, keeps what must stay, and prunes the history', { timeout: 150_000 }, async () => {
    const t0 = Date.now();
    const phases: string[] = [];
    const phase = (what: string) => phases.push(`${((Date.now() - t0) / 1000).toFixed(1)}s ${what}`);
    const c = tdb.client;
    const count = async (q: string, values: unknown[] = []) => (await c.query<{ n: number }>(q, values)).rows[0]!.n;

    // 1. the history: finished turns of stopped (or failed) activations, two days old, each
    // actor's epochs one second apart; the test's actors have a few epochs of it too
    await c.query(`
      insert into corral.actors (agent_uid, session_id, epoch_counter)
        select 'hist', 'h' || g, ${HISTORY_EPOCHS} from generate_series(1, ${HISTORY_ACTORS}) g
        union all
        select 'crash', 'a' || lpad(g::text, 2, '0'), ${ACTOR_HISTORY_EPOCHS} from generate_series(0, ${ACTORS - 1}) g;
      insert into corral.conversations (id, agent_uid, session_id) select gen_random_uuid(), agent_uid, session_id from corral.actors;
      insert into corral.activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at, owner_id,
                                      status, end_reason, created_at, updated_at, ended_at)
        select gen_random_uuid(), ac.agent_uid, ac.session_id, e, gen_random_uuid(), x.t, '${HISTORY_OWNER}',
               case when e % 10 = 0 then 'failed' else 'stopped' end, case when e % 10 = 0 then 'lease_expired' else 'idle' end,
               x.t, x.t, x.t
          from corral.actors ac, generate_series(1, ac.epoch_counter) e,
               lateral (select now() - interval '2 days' + e * interval '1 second') x(t);
      insert into corral.deliveries (delivery_id, activation_uid, agent_uid, session_id, actor_epoch, event_id, revision, job_retry_count,
                                     worker_id, state, created_at, updated_at)
        select gen_random_uuid(), a.activation_uid, a.agent_uid, a.session_id, a.actor_epoch, gen_random_uuid(), 0, 0, '${HISTORY_WORKER}',
               case when a.status = 'failed' then 'superseded' when a.actor_epoch % 7 = 0 then 'failed' else 'completed' end,
               a.created_at, a.ended_at
          from corral.activations a;
      insert into corral.turns (id, conversation_id, event_id, delivery_id, status, activation_uid, actor_epoch, revision, attempt,
                                worker_id, started_at, finished_at)
        select gen_random_uuid(), cv.id, d.event_id, d.delivery_id, case when d.state = 'completed' then 'succeeded' else 'failed' end,
               d.activation_uid, d.actor_epoch, 0, 1, d.worker_id, d.created_at, d.updated_at
          from corral.deliveries d join corral.conversations cv on cv.agent_uid = d.agent_uid and cv.session_id = d.session_id;
    `);
    // as autovacuum would leave them: statistics, and the visibility map for index-only counts
    for (const table of ['actors', 'conversations', 'activations', 'deliveries', 'turns']) await c.query(`vacuum analyze corral.${table}`);
    const seededDeliveries = HISTORY + ACTORS * ACTOR_HISTORY_EPOCHS;
    expect(await count(`select count(*)::int as n from corral.deliveries where worker_id = $1`, [HISTORY_WORKER])).toBe(seededDeliveries);
    phase('history seeded');

    /**
     * A turn left `started` whose delivery failed long ago (the daemon that ran it died; recovery
     * has not repaired it yet), on an actor with a newer activation: its delivery must stay (P1),
     * and so must its activation, which still has a delivery (P2). Written while a pass runs, with
     * timestamps older than any other row, so the pass's next batch meets it first. The next
     * daemon's recovery (at its start) fails the turn; its rows are then pruned like any other.
     */
    const orphans: Orphan[] = [];
    const writeOrphan = async (tag: string): Promise<Orphan> => {
      const session = `orphan-${tag}`;
      const r = await c.query<{ turn_id: string; delivery_id: string; activation_uid: string }>(
        `with ac as (
           insert into corral.actors (agent_uid, session_id, epoch_counter) values ('hist', $1, 2)
         ), cv as (
           insert into corral.conversations (id, agent_uid, session_id) values (gen_random_uuid(), 'hist', $1) returning id
         ), a as (
           insert into corral.activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at, owner_id,
                                           status, end_reason, created_at, updated_at, ended_at)
           values (gen_random_uuid(), 'hist', $1, 1, gen_random_uuid(), now() - interval '3 days', '${HISTORY_OWNER}', 'failed',
                   'lease_expired', now() - interval '3 days', now() - interval '3 days', now() - interval '3 days')
           returning activation_uid
         ), newer as (
           insert into corral.activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at, owner_id,
                                           status, end_reason, created_at, updated_at, ended_at)
           values (gen_random_uuid(), 'hist', $1, 2, gen_random_uuid(), now() - interval '3 days', '${HISTORY_OWNER}', 'stopped',
                   'idle', now() - interval '3 days', now() - interval '3 days', now() - interval '3 days')
         ), d as (
           insert into corral.deliveries (delivery_id, activation_uid, agent_uid, session_id, actor_epoch, event_id, revision,
                                          job_retry_count, worker_id, state, created_at, updated_at)
           select gen_random_uuid(), a.activation_uid, 'hist', $1, 1, gen_random_uuid(), 0, 0, '${HISTORY_WORKER}', 'failed',
                  now() - interval '3 days', now() - interval '3 days' from a
           returning delivery_id, activation_uid, event_id
         ), t as (
           insert into corral.turns (id, conversation_id, event_id, delivery_id, status, activation_uid, actor_epoch, revision, attempt,
                                     started_at)
           select gen_random_uuid(), cv.id, d.event_id, d.delivery_id, 'started', d.activation_uid, 1, 0, 1, now() - interval '3 days'
             from d, cv
           returning id
         )
         select t.id as turn_id, d.delivery_id, d.activation_uid from t, d`,
        [session],
      );
      const row = r.rows[0]!;
      const orphan = { tag, turnId: row.turn_id, deliveryId: row.delivery_id, activationUid: row.activation_uid };
      orphans.push(orphan);
      return orphan;
    };
    /** The orphan's turn is still started and its delivery and activation are there. */
    const expectOrphanKept = async (o: Orphan, when: string) => {
      const r = await c.query(
        `select t.status, (select count(*)::int from corral.deliveries where delivery_id = $2) as deliveries,
                (select count(*)::int from corral.activations where activation_uid = $3) as activations
           from corral.turns t where t.id = $1`,
        [o.turnId, o.deliveryId, o.activationUid],
      );
      expect(r.rows[0], `${when}: the started turn of orphan-${o.tag}, its delivery (P1) and its activation (P2)`).toEqual({
        status: 'started',
        deliveries: 1,
        activations: 1,
      });
    };

    // 2. the daemon: short leases and idle timeout (each actor's activations end and new ones
    // start during the run, so its ended ones are pruned too); recovery only at start, so a
    // started turn written mid-pass stays started through that pass
    const port = await freePort();
    home = mkdtempSync(join(tmpdir(), 'corral-prune-crash-'));
    const env = {
      DATABASE_URL: tdb.url,
      CORRAL_HOME: home,
      CORRAL_ENDPOINT: `tcp://127.0.0.1:${port}`,
      CORRAL_RUNTIME_RETENTION_S: String(WINDOW_S),
      CORRAL_LEASE_MS: '3000',
      CORRAL_PROGRESS_INTERVAL_MS: '500',
      CORRAL_IDLE_TIMEOUT_MS: '300',
      CORRAL_WATCHDOG_INTERVAL_MS: '200',
      CORRAL_RECOVERY_INTERVAL_MS: '600000',
      CORRAL_WORKER_HEARTBEAT_MS: '200',
      CORRAL_WORKER_STALE_MS: '1500',
      CORRAL_RETRY_DELAY_S: '1',
      CORRAL_RETRY_DELAY_MAX_S: '2',
      CORRAL_RETRY_LIMIT: '10',
      // a job fetched by a killed daemon before it wrote the turn's rows is retried once its heartbeat lapses
      CORRAL_JOB_HEARTBEAT_S: '10',
      CORRAL_POLL_INTERVAL_MS: '100',
      CORRAL_DRAIN_MS: '2000',
      CORRAL_LOG_LEVEL: 'info',
    };
    const logs: string[] = [];
    const startDaemon = (name: string) => {
      const p = spawnCorral(['daemon', '--workers', '2', '--worker-capacity', '16'], env, name);
      logs.push(p.logPath);
      return p;
    };

    // the invariants, sampled on a connection of their own for the whole run
    sampler = new pg.Client({ connectionString: tdb.url });
    await sampler.connect();
    const s = sampler;
    const violations = new Map<string, string>();
    let samples = 0;
    let sampling = true;
    const sampling$ = loop(
      (async () => {
        while (sampling && running) {
          for (const v of (await s.query<{ what: string; id: string; detail: string }>(INVARIANTS)).rows) {
            const key = `${v.what}: ${v.id}`;
            if (!violations.has(key))
              violations.set(key, `${v.detail} (first in sample ${samples}, at ${((Date.now() - t0) / 1000).toFixed(1)}s)`);
          }
          samples++;
          await sleep(50);
        }
      })(),
    );

    /** The history left (rows a day old and more; the latest activations of its actors stay), turns in flight, turns committed. */
    const progress = async () =>
      (
        await c.query<{ deliveries: number; activations: number; live: number; committed: number }>(
          `select (select count(*)::int from corral.deliveries
                    where state in ('completed', 'failed', 'send_failed', 'superseded') and updated_at < now() - interval '1 day') as deliveries,
                  (select count(*)::int from corral.activations
                    where status in ('stopped', 'failed') and ended_at < now() - interval '1 day') as activations,
                  (select count(*)::int from corral.deliveries where state in ('created', 'sent', 'accepted')) as live,
                  (select count(*)::int from corral.turns
                    where conversation_id in (select id from corral.conversations where agent_uid = 'crash')
                      and started_at > now() - interval '1 day' and status = 'succeeded') as committed`,
        )
      ).rows[0]!;
    const history = (p: { deliveries: number; activations: number }) => p.deliveries + p.activations;

    // the events, round by round (each round one statement over every actor) while the daemons run;
    // the first round is queued before the daemon starts, so its first pass meets turns at once
    corral = await connect({ databaseUrl: tdb.url, maxConnections: 2 });
    const sent: string[][] = Array.from({ length: ACTORS }, () => []);
    const sender = corral;
    // the last rounds wait for the second pass to reach the activations, so turns are in flight then
    const gate = new Promise<void>((r) => (openGate = r));
    let firstRound = () => undefined as void;
    const firstSent = new Promise<void>((r) => (firstRound = r));
    const sending$ = loop(
      (async () => {
        for (let r = 0; r < ROUNDS && running; r++) {
          if (r === GATED_ROUND) await gate;
          const round = Array.from({ length: ACTORS }, (_, a) => ({ actor: `crash/${actorName(a)}`, data: eventData(a, r) }));
          (await sender.sendMany(round)).forEach((res, a) => sent[a]!.push(res.eventId));
          if (r === 0) firstRound();
          await sleep(ROUND_GAP_MS);
        }
      })(),
    );

    await firstSent;
    daemon = startDaemon('daemon-1');

    /** The killed daemon's database sessions have ended (a statement it had sent runs to its end first). */
    const sessionsGone = () =>
      waitFor(
        async () =>
          (await count(
            `select count(*)::int as n from pg_stat_activity where datname = current_database() and application_name in ('corral', 'corral-boss')`,
          )) === 0,
        { timeoutMs: 20_000, intervalMs: 50, what: "the killed daemon's database sessions gone" },
      );
    /** How a pass stands, for a failure's message. */
    const standing = async (p: Proc) =>
      `history and turns: ${JSON.stringify(await progress())}, failed passes: ${JSON.stringify(sweepFailures(p))}`;
    /** Waits until `p`'s pass deletes; then writes an orphan; then waits until the pass deleted two more batches since and `more` holds. */
    const midPass = async (p: Proc, tag: string, more: (now: Awaited<ReturnType<typeof progress>>) => boolean) => {
      const before = history(await progress());
      const deleting = waitFor(async () => history(await progress()) < before, {
        timeoutMs: 30_000,
        intervalMs: POLL_MS,
        what: `pass ${tag} deleting (log: ${p.logPath})`,
      });
      await explained(deleting, () => standing(p));
      const orphan = await writeOrphan(tag);
      const atOrphan = history(await progress());
      const underWay = waitFor(
        async () => {
          const now = await progress();
          if (history(now) <= 4 * BATCH) return { over: true as const, now };
          return history(now) <= atOrphan - 2 * BATCH && more(now) ? { over: false as const, now } : undefined;
        },
        { timeoutMs: 30_000, intervalMs: POLL_MS, what: `pass ${tag} under way with turns in flight (log: ${p.logPath})` },
      );
      const seen = await explained(underWay, () => standing(p));
      if (seen.over) throw new Error(`pass ${tag} was over before it was seen under way: ${JSON.stringify(seen.now)}`);
      const at = seen.now;
      await expectOrphanKept(orphan, `during pass ${tag}`);
      return { orphan, at };
    };

    // 3. first kill: the pass has deleted some of the history, not all; turns committed and in flight
    const pass1 = await midPass(daemon, '1', (now) => now.live > 0 && now.committed > 0);
    expect(await killHard(daemon), 'the daemon had its two workers').toBe(2);
    await sessionsGone();
    const after1 = await progress();
    phase(`kill 1 at ${JSON.stringify(pass1.at)}, after ${JSON.stringify(after1)}`);
    expect(after1.deliveries, 'the first kill came before the pass was over').toBeGreaterThan(0);
    await expectOrphanKept(pass1.orphan, 'after the first kill');

    // second kill: the restarted daemon's pass has deleted the rest of the deliveries and some of
    // the activations, and turns commit under it. On a loaded machine the pass may be over before
    // that moment is seen: the daemon is then killed after its pass (still a crash with turns
    // running), and the checks below hold all the same.
    daemon = startDaemon('daemon-2');
    const pass2 = await midPass(daemon, '2', (now) => {
      if (now.activations < after1.activations) openGate();
      return now.activations < after1.activations - 2 * BATCH && now.live > 0 && now.committed >= after1.committed + 10;
    }).catch((e: unknown) => {
      phase(`pass 2 was not caught mid-way (${(e as Error).message.slice(0, 200)}); killing the daemon after it`);
      return undefined;
    });
    openGate();
    expect(await killHard(daemon), 'the daemon had its two workers').toBe(2);
    await sessionsGone();
    const after2 = await progress();
    phase(`kill 2 at ${JSON.stringify(pass2?.at)}, after ${JSON.stringify(after2)}`);
    if (pass2) {
      expect(history(after2), 'the second kill came before the pass was over').toBeGreaterThan(2 * BATCH);
      await expectOrphanKept(pass2.orphan, 'after the second kill');
    }

    // 4. what the last daemon's pass has to delete (no daemon runs now): the rest of the history,
    // and the rows of the turns run so far that are past the window
    await c.query(DUE);
    const due = (await c.query<{ kind: string; seeded: boolean; n: number }>(DUE_LEFT)).rows;
    const dueOf = (kind: string, seeded: boolean) => due.find((r) => r.kind === kind && r.seeded === seeded)?.n ?? 0;
    phase(`due: ${JSON.stringify(due)}`);
    expect(dueOf('delivery', false), 'deliveries of the turns run so far are due').toBeGreaterThan(0);
    const dueLeft = async () => (await c.query<{ n: number }>(DUE_LEFT)).rows.reduce((n, r) => n + r.n, 0);
    const last = (daemon = startDaemon('daemon-3'));
    const deleting = waitFor(async () => history(await progress()) < history(after2), {
      timeoutMs: 30_000,
      intervalMs: POLL_MS,
      what: `pass 3 deleting (log: ${last.logPath})`,
    });
    await explained(deleting, () => standing(last));
    const orphan3 = await writeOrphan('3');
    await sending$;
    phase('all sent');
    const eventIds = sent.flat();
    expect(eventIds).toHaveLength(EVENTS);
    const settled = waitFor(
      async () =>
        (await count(`select count(*)::int as n from corral.turns where event_id = any($1::uuid[]) and status = 'succeeded'`, [
          eventIds,
        ])) === EVENTS,
      { timeoutMs: 60_000, intervalMs: 200, what: `every event committed (logs: ${logs.join(', ')})` },
    );
    await explained(settled, async () => {
      const jobs = await c.query(`select state, count(*)::int as n from pgboss.job where id = any($1::uuid[]) group by state`, [eventIds]);
      return `the events' jobs: ${JSON.stringify(jobs.rows)}`;
    });
    phase('all committed');
    const passOver = waitFor(async () => (await dueLeft()) === 0, {
      timeoutMs: 30_000,
      intervalMs: 500,
      what: `the last pass over: every row due at its start deleted (log: ${last.logPath})`,
    });
    await explained(passOver, async () => `left of them: ${JSON.stringify((await c.query(DUE_LEFT)).rows)}, ${await standing(last)}`);
    phase('pass over');
    sampling = false;
    await sampling$;

    // 5. nothing lost, nothing doubled
    const perEvent = await c.query<{ event_id: string; succeeded: number; attempts: number }>(
      `select e.id::text as event_id, count(t.id) filter (where t.status = 'succeeded')::int as succeeded, count(t.id)::int as attempts
         from unnest($1::uuid[]) e(id) left join corral.turns t on t.event_id = e.id group by e.id`,
      [eventIds],
    );
    const wrong = perEvent.rows.filter((r) => r.succeeded !== 1);
    expect(wrong, 'events without exactly one succeeded turn').toEqual([]);
    const jobs = await c.query<{ state: string; n: number }>(
      `select state, count(*)::int as n from pgboss.job where id = any($1::uuid[]) group by state`,
      [eventIds],
    );
    expect(jobs.rows, 'the events’ jobs').toEqual([{ state: 'completed', n: EVENTS }]);

    // each actor's transcript: exactly its events, in enqueue order, each its user and assistant message
    for (let a = 0; a < ACTORS; a++) {
      const msgs = await c.query<{ seq: number; role: string; content: unknown; event_id: string }>(
        `select m.seq, m.role, m.content, t.event_id::text as event_id
           from corral.messages m join corral.conversations cv on cv.id = m.conversation_id join corral.turns t on t.id = m.turn_id
          where cv.agent_uid = 'crash' and cv.session_id = $1 order by m.seq`,
        [actorName(a)],
      );
      const expected = Array.from({ length: ROUNDS }, (_, r) => {
        const data = eventData(a, r);
        return [
          { seq: 2 * r + 1, role: 'user', content: data, event_id: sent[a]![r] },
          {
            seq: 2 * r + 2,
            role: 'assistant',
            content: { text: `echo: ${data.text}`, ...(r > 0 ? { seen: 2 * r } : {}) },
            event_id: sent[a]![r],
          },
        ];
      }).flat();
      expect(msgs.rows, `the transcript of crash/${actorName(a)}`).toEqual(expected);
    }

    // never a started turn without its delivery, never an actor without its latest activation
    expect([...violations], `invariants broken during the run (${samples} samples)`).toEqual([]);
    expect(samples, 'the invariants were sampled').toBeGreaterThan(50);
    expect((await c.query(INVARIANTS)).rows, 'invariants at the end').toEqual([]);
    await expectOrphanKept(orphan3, 'after the last pass');

    // the history is gone but for what must stay: the orphan written during the last pass, and
    // each history actor's latest activation (the test's actors have newer ones)
    const left = await c.query<{ what: string; n: number }>(
      `select 'deliveries' as what, count(*)::int as n from corral.deliveries where worker_id = $1 and delivery_id <> $3
       union all
       select 'activations, not the latest of their actor', count(*)::int from corral.activations a where owner_id = $2 and activation_uid <> $4
          and exists (select 1 from corral.activations n where n.agent_uid = a.agent_uid and n.session_id = a.session_id
                       and n.actor_epoch > a.actor_epoch)
       union all
       select 'activations, the latest of their actor', count(*)::int from corral.activations a where owner_id = $2
          and not exists (select 1 from corral.activations n where n.agent_uid = a.agent_uid and n.session_id = a.session_id
                           and n.actor_epoch > a.actor_epoch)`,
      [HISTORY_WORKER, HISTORY_OWNER, orphan3.deliveryId, orphan3.activationUid],
    );
    // a union's branches may come back in any order (a parallel append runs them side by side)
    expect(Object.fromEntries(left.rows.map((r) => [r.what, r.n])), 'the seeded history left').toEqual({
      deliveries: 0,
      'activations, not the latest of their actor': 0,
      'activations, the latest of their actor': HISTORY_ACTORS + orphans.length,
    });
    // the transcript is never pruned
    expect(await count(`select count(*)::int as n from corral.turns where worker_id = $1`, [HISTORY_WORKER])).toBe(seededDeliveries);
    expect(await count(`select count(*)::int as n from corral.turns where id = any($1::uuid[])`, [orphans.map((o) => o.turnId)])).toBe(3);
    phase('checked');
    if (process.env.CORRAL_TEST_LOG) console.log(`pruning crash test: ${phases.join('; ')}`);

    daemon.child.kill('SIGTERM');
    expect(await Promise.race([daemon.exited, sleep(15_000).then(() => 'timeout')])).toBe(0);
  });
});
