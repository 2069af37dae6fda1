/**
 * A scenario's database as the harness sees it: the producer (enqueues the plan the way producers
 * do), progress and quiescence, what a worker is in the middle of, and the invariant checks.
 */
import type pg from 'pg';
import type { PgBoss } from 'pg-boss';
import { openDatabase, type Database } from '../../src/db/client.ts';
import { DELIVERY_LIVE } from '../../src/db/schema.ts';
import { migrateDatabase } from '../../src/db/migrate.ts';
import { setInputPolicy, type InputPolicy, type InputPolicyOptions } from '../../src/db/enqueue/input-policies.ts';
import { createBoss, ensureQueues } from '../../src/queue/boss.ts';
import { sendEventsInBatches } from '../../src/db/enqueue/send.ts';
import { sleep, waitFor } from '../helpers/wait.ts';
import { QUEUE, queueConfig, type ChaosDatabase, type ChaosTimings } from './environment.ts';
import { checkInvariants, type CheckResult } from './invariants.ts';
import type { PlannedEvent } from './plan.ts';

export interface Progress {
  committed: number;
  deadLettered: number;
  settled: number;
  /** Jobs of the actor queue still created / retry / active. */
  pending: number;
  enqueued: number;
}

export class ScenarioDb {
  readonly url: string;
  readonly database: Database;
  readonly pool: pg.Pool;
  private boss: PgBoss | undefined;
  readonly plan: PlannedEvent[] = [];

  private constructor(url: string) {
    this.url = url;
    this.database = openDatabase(url, { max: 4, applicationName: 'corral-chaos', onError: () => undefined });
    this.pool = this.database.pool;
  }

  /** Migrates (unless done), creates the queues with the chaos retry policy, opens the producer. */
  static async open(db: ChaosDatabase, timings: ChaosTimings): Promise<ScenarioDb> {
    if (!db.migrated) await migrateDatabase(db.url);
    const s = new ScenarioDb(db.url);
    s.boss = createBoss(db.url, queueConfig(timings), { max: 4, onError: () => undefined });
    await s.boss.start();
    // Jobs copy the retry policy at insert time: the queue must carry the short delays before
    // the first event is enqueued (the daemon would only update it when it starts).
    await ensureQueues(s.boss, queueConfig(timings));
    return s;
  }

  async close(): Promise<void> {
    await this.boss?.stop({ graceful: false, close: true }).catch(() => undefined);
    await this.database.close().catch(() => undefined);
  }

  /** Enqueues `events` in one batch (one statement, array order), recording their ids. */
  async enqueue(events: PlannedEvent[]): Promise<void> {
    if (events.length === 0) return;
    const res = await sendEventsInBatches(
      this.database.db,
      events.map((e) => ({ agentUid: e.actor.agentUid, sessionId: e.actor.sessionId, data: e.payload })),
    );
    res.forEach((r, i) => {
      events[i]!.id = r.eventId;
    });
    this.plan.push(...events);
  }

  /** Enqueues `events` in chunks, pausing between them (a producer that keeps running). */
  async produce(events: PlannedEvent[], chunk = 20, pauseMs = 100): Promise<void> {
    for (let i = 0; i < events.length; i += chunk) {
      await this.enqueue(events.slice(i, i + chunk));
      if (i + chunk < events.length) await sleep(pauseMs);
    }
  }

  private ids(): string[] {
    return this.plan.map((e) => e.id!).filter(Boolean);
  }

  async progress(): Promise<Progress> {
    const ids = this.ids();
    const { rows } = await this.pool.query<{ committed: number; dead_lettered: number; settled: number; pending: number }>(
      `with ev as (select unnest($1::uuid[]) as id),
            s as (select event_id, coalesced from corral.turns where status = 'succeeded'),
            -- committed: the head of a succeeded turn, or a member of its batch (input policy coalesce)
            c as (select event_id as id from s where event_id = any($1::uuid[])
                  union
                  select (m->>'event_id')::uuid from s, jsonb_array_elements(s.coalesced) as m
                   where s.coalesced is not null and (m->>'event_id')::uuid = any($1::uuid[])),
            d as (select distinct source_id as id from pgboss.job where name = $2 and source_id = any($1::uuid[]))
       select (select count(*) from c)::int as committed,
              (select count(*) from d)::int as dead_lettered,
              (select count(*) from ev where id in (select id from c union select id from d))::int as settled,
              (select count(*) from pgboss.job where name = $3 and state in ('created', 'retry', 'active'))::int as pending`,
      [ids, QUEUE.deadLetter, QUEUE.events],
    );
    const r = rows[0]!;
    return { committed: r.committed, deadLettered: r.dead_lettered, settled: r.settled, pending: r.pending, enqueued: ids.length };
  }

  /** Deliveries currently accepted by `workerId` (a worker that is mid-turn). */
  async acceptedBy(workerId: string): Promise<{ deliveryId: string; eventId: string; actorEpoch: number }[]> {
    const { rows } = await this.pool.query<{ delivery_id: string; event_id: string; actor_epoch: string }>(
      `select delivery_id, event_id, actor_epoch from corral.deliveries where worker_id = $1 and state = 'accepted'`,
      [workerId],
    );
    return rows.map((r) => ({ deliveryId: r.delivery_id, eventId: r.event_id, actorEpoch: Number(r.actor_epoch) }));
  }

  /**
   * Deliveries `workerId` accepted whose handler still has at least `minRemainingMs` of its
   * `delayMs` to go (judged from the accept time): the worker is certainly mid-turn on them.
   */
  async busyOn(workerId: string, minRemainingMs: number): Promise<{ deliveryId: string; eventId: string; remainingMs: number }[]> {
    const { rows } = await this.pool.query<{ delivery_id: string; event_id: string; remaining: number }>(
      `select d.delivery_id, d.event_id,
              (greatest(coalesce((t.input->>'delayMs')::int, 0),
                        coalesce((select max((m->'data'->>'delayMs')::int) from jsonb_array_elements(t.coalesced) as m), 0))
               - extract(epoch from (now() - d.updated_at)) * 1000)::int as remaining
         from corral.deliveries d join corral.turns t on t.delivery_id = d.delivery_id
        where d.worker_id = $1 and d.state = 'accepted'`,
      [workerId],
    );
    return rows
      .filter((r) => r.remaining >= minRemainingMs)
      .map((r) => ({ deliveryId: r.delivery_id, eventId: r.event_id, remainingMs: r.remaining }));
  }

  /**
   * Accepted deliveries that carry a batch (input policy coalesce: the turn took more than its
   * own event), of `workerIds` if given: a batch is mid-turn.
   */
  async acceptedBatches(workerIds?: string[]): Promise<{ deliveryId: string; eventId: string; workerId: string; members: number }[]> {
    const { rows } = await this.pool.query<{ delivery_id: string; event_id: string; worker_id: string; members: number }>(
      `select delivery_id, event_id, worker_id, cardinality(coalesced) as members from corral.deliveries
        where state = 'accepted' and coalesced is not null and ($1::text[] is null or worker_id = any($1::text[]))`,
      [workerIds ?? null],
    );
    return rows.map((r) => ({ deliveryId: r.delivery_id, eventId: r.event_id, workerId: r.worker_id, members: r.members }));
  }

  /** Sets an input policy (src/db/enqueue/input-policies.ts) for an agent (`sessionId` null) or one actor. */
  async setInputPolicy(agentUid: string, sessionId: string | null, policy: InputPolicy, options: InputPolicyOptions = {}): Promise<void> {
    await setInputPolicy(this.database.db, agentUid, sessionId, policy, options);
  }

  /** Deliveries in a live state (created, sent, accepted): turns not yet ended. */
  async liveDeliveries(): Promise<number> {
    const { rows } = await this.pool.query<{ n: number }>(
      `select count(*)::int as n from corral.deliveries where state = any($1::text[])`,
      [DELIVERY_LIVE],
    );
    return rows[0]!.n;
  }

  async acceptedCount(): Promise<number> {
    const { rows } = await this.pool.query<{ n: number }>(`select count(*)::int as n from corral.deliveries where state = 'accepted'`);
    return rows[0]!.n;
  }

  async waitProgress(fraction: number, timeoutMs: number, total = this.plan.length): Promise<Progress> {
    return waitFor(
      async () => {
        const p = await this.progress();
        return p.settled >= Math.ceil(total * fraction) ? p : undefined;
      },
      { what: `chaos: ${Math.round(fraction * 100)}% of events settled`, timeoutMs, intervalMs: 150 },
    );
  }

  /**
   * Waits until every planned event is committed or dead-lettered and the actor queue holds no
   * created/retry/active job. Returns the last progress and whether it got there.
   */
  async waitQuiescent(total: number, timeoutMs: number): Promise<{ ok: boolean; progress: Progress | undefined; waitedMs: number }> {
    const start = Date.now();
    let last: Progress | undefined;
    // A failing progress query counts as "not yet": the database may be restarting.
    const ok = await waitFor(
      async () => {
        last = await this.progress();
        return last.enqueued >= total && last.settled >= total && last.pending === 0;
      },
      { what: 'quiescence', timeoutMs, intervalMs: 250 },
    ).then(
      () => true,
      () => false,
    );
    return { ok, progress: last, waitedMs: Date.now() - start };
  }

  /** Why events are not settled: their jobs, deliveries, activations (for a stuck run). */
  async diagnoseUnsettled(limit = 10): Promise<unknown[]> {
    const ids = this.ids();
    const { rows } = await this.pool.query<{ id: string }>(
      `select ev.id from unnest($1::uuid[]) as ev(id)
        where not exists (select 1 from corral.turns t where t.event_id = ev.id and t.status = 'succeeded')
          and not exists (select 1 from corral.turns t where t.status = 'succeeded' and t.coalesced @> jsonb_build_array(jsonb_build_object('event_id', ev.id)))
          and not exists (select 1 from pgboss.job j where j.name = $2 and j.source_id = ev.id)`,
      [ids, QUEUE.deadLetter],
    );
    const out: unknown[] = [];
    for (const { id } of rows.slice(0, limit)) {
      const job = await this.pool.query(
        `select id, state, retry_count, singleton_key, start_after, started_on, created_on from pgboss.job where name = $1 and id = $2`,
        [QUEUE.events, id],
      );
      const dels = await this.pool.query(
        `select delivery_id, activation_uid, actor_epoch, worker_id, state, state_reason, job_retry_count, created_at, updated_at
           from corral.deliveries where event_id = $1 order by created_at`,
        [id],
      );
      const turns = await this.pool.query(
        `select id, event_id, status, attempt, actor_epoch, worker_id, error, started_at, finished_at, jsonb_array_length(coalesced) as batched
           from corral.turns where event_id = $1 or coalesced @> jsonb_build_array(jsonb_build_object('event_id', $1::uuid)) order by started_at`,
        [id],
      );
      const acts = await this.pool.query(
        `select a.activation_uid, a.actor_epoch, a.status, a.end_reason, a.current_event_id, a.owner_id, a.lease_expires_at, a.created_at
           from corral.activations a join pgboss.job j on j.singleton_key = a.agent_uid || '/' || a.session_id
          where j.name = $1 and j.id = $2 order by a.actor_epoch desc limit 3`,
        [QUEUE.events, id],
      );
      const blockers = await this.pool.query(
        `select j2.id, j2.state, j2.retry_count, j2.start_after from pgboss.job j
           join pgboss.job j2 on j2.name = j.name and j2.singleton_key = j.singleton_key and j2.state in ('retry','active','failed')
          where j.name = $1 and j.id = $2`,
        [QUEUE.events, id],
      );
      out.push({
        eventId: id,
        job: job.rows[0] ?? null,
        blockers: blockers.rows,
        deliveries: dels.rows,
        turns: turns.rows,
        activations: acts.rows,
      });
    }
    return out;
  }

  /** The invariant checks, from the database only (plus the list of enqueued ids/payloads). */
  async checkInvariants(opts: { allowUnexpectedDeadLetters?: boolean } = {}): Promise<CheckResult> {
    return checkInvariants(this.database.db, this.plan, opts);
  }
}
