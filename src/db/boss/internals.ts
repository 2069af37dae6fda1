/**
 * Everything corral relies on of pg-boss beyond its public API, in one place. pg-boss is pinned in
 * package.json to the releases test/queue/boss-internals.test.ts has passed on; how to move the pin
 * is docs/migrations.md, "Upgrading pg-boss".
 *
 * The surface, where it is used, and why instead of a public API:
 *
 *  S1 Plans: `pg-boss/dist/plans.js`'s `getVersion`, `getQueues` and `insertJobs` (`bossPlans`,
 *     imported here and nowhere else), and the payload its `send` builds (`sendPayload`): the SQL
 *     enqueue (S11) is pg-boss's own insert, made into a function, so that every sender (the
 *     client, the HTTP API, `corral send`, SQL producers) enqueues in one statement on its own
 *     connection. pg-boss has no public "insert on this connection without start()".
 *  S2 The schema version (`BOSS_SCHEMA_VERSION`, pg-boss's package.json `pgboss.schema`): S11 is
 *     made only on a schema at this version. A constant, not read from the installed package, so
 *     no insert is ever made for a schema of a version this module has not been checked against.
 *  S3 Tables (`BOSS_TABLE`): `<schema>.job`, partitioned by queue name (every statement names the
 *     queue first); the queue's own job table, named by `queue.table_name` (`job_common` unless the
 *     queue is partitioned: `queueTable`); `<schema>.queue`; `<schema>.version`; pg-boss's clock
 *     `<schema>.job_now()`.
 *  S4 Columns (`JOB`, `QUEUE`, with their types in `JOB_TYPES`, `QUEUE_TYPES`) and the states of
 *     `<schema>.job_state` in enum order (`JOB_STATE`, `JOB_STATE_ORDER`: `state < 'active'` is
 *     "queued", `state desc` puts a retry before created jobs), and the policy `key_strict_fifo`.
 *  S5 The actor queue's fetch (`claimStatement`, run by db/boss-fetch.ts inside the function
 *     `corral.claim_actor_events`, installed with the queues): pg-boss's
 *     `key_strict_fifo` fetch first takes the head of every key with queued jobs, a cost that
 *     follows the backlog; this claim reproduces its conditions and its update at a cost that
 *     follows the batch (`claimMirrorsFetch` lists what it copies, as pg-boss writes it). It
 *     relies on the indexes `BOSS_INDEXES` (job_i8's uniqueness makes a concurrent claim of one
 *     key fail with 23505, which pg-boss's fetch and this claim both take for an empty fetch).
 *  S6 The attempt fence in SQL (db/fence.ts `jobActiveOf`): a reply counts only while its job is
 *     `active` at the delivery's retry count (pg-boss's attempt: every claim after the first adds
 *     one), read in the statement that locks corral's own fence rows; `getJobById` would be one
 *     more round trip per reply, outside that statement.
 *  S7 `makeLastAttempt` (db/boss-jobs.ts) writes `retry_limit = retry_count`: pg-boss has no public
 *     "fail without retry" for a fetched job, and its `fail` dead-letters (state `failed`, the copy
 *     in the dead-letter queue) exactly when `retry_count >= retry_limit`.
 *  S8 Operator reads (db/boss-jobs.ts): dead letters with their provenance (`source_*` columns,
 *     which pg-boss stamps on the dead-letter copy), pg-boss's own failure output (`{ value: {
 *     message } }`, `BOSS_FAILURE_MESSAGE`), the live jobs of one actor, queue depths, and the
 *     completed jobs the retention sweep deletes (queue/retention.ts; deleted through pg-boss's
 *     `deleteJob`). pg-boss has no query by actor or error text, and its queue counts are as old as
 *     its last monitor pass.
 *  S9 The NOTIFY channel (`bossNotifyChannel`) and payload (the queue's name, `notifiesQueue`):
 *     queue/consumer.ts LISTENs itself, since corral fetches with its own claim rather than
 *     pg-boss's `work()`, whose notifier wakes only its own workers.
 *  S10 drizzle/0002_boss_job_autovacuum.sql (`corral.tune_boss_job_tables`) reads `queue.table_name`
 *     and `queue.policy` (a migration: it cannot import these names; the test checks them).
 *  S11 The SQL enqueue (db/send-event.ts: `corral.send_event`, `corral.send_events`, what the client's
 *     `send` runs too): `eventJobsInsertFunction` makes S1's insert (`insertJobs`, NOTIFY included)
 *     the body of `corral.insert_event_jobs(jobs text)`, and `sendPayloadSql` is S1's payload as a SQL
 *     expression. Generated when the queues are set up (a static migration cannot know the queue's
 *     table or pg-boss's statement), so any language enqueues the row `boss.send` writes.
 *  S12 pg-boss's maintenance claim (`QUEUE.maintain_on`, db/boss-jobs.ts `holdBossMaintenance`): once a
 *     day pg-boss walks every job of a queue (its deletion walk, then two walks for job
 *     dependencies), ~20 s at 10M jobs. On corral's queues that walk can delete nothing
 *     (`deleteAfterSeconds: 0`, queued jobs kept ten years) and there are no dependencies, so corral's
 *     retention sweep, which does their maintenance, stamps `maintain_on` on every pass: pg-boss
 *     claims a queue only when its stamp is a maintenance interval old. pg-boss has no option to
 *     leave one queue's maintenance to its owner.
 *  S13 Batches (src/db/turns/batches.ts, input policy `coalesce`): `batchMembersStatement` reads a key's
 *     queued jobs after its head in the head order (`job_i10`), and `jobQueuedStatement` whether a
 *     recorded member is still `created`. A batch's members complete from `created` through
 *     pg-boss's public `complete(…, { includeQueued })`; a dead-lettered batch's members get
 *     `makeQueuedLastAttempt` (S7 for a queued job) and pg-boss's unfenced `fail`, one at a time.
 *     pg-boss has no "the next jobs of this key" nor a batch fetch for `key_strict_fifo`.
 *  S14 Debounce (`debounceStatements`, in `corral.debounce_due`): the held jobs of a key (not due,
 *     marked `debounced` in corral's own data) get one `start_after`; the send gives a new one the
 *     same through S1's `startAfter`. pg-boss's `sendDebounced` moves a job to a time slot, not a
 *     key's waiting jobs to the end of a quiet period.
 *  S15 `requeueActiveJob` (db/boss-jobs.ts): an interrupted attempt's job back to `created` with no
 *     `started_on`, so the next claim does not count an attempt. pg-boss has no "give back unspent".
 *
 * Tests: test/queue/boss-internals.test.ts checks S1–S15 piece by piece, each failure naming its
 * piece, S11's row against `boss.send`'s column by column; test/queue/key-head-fetch.test.ts compares the claim with pg-boss's own fetch on one
 * backlog; test/queue/notify-channel.test.ts compares the channel with pg-boss's SQL expression.
 *
 * It loads neither Drizzle nor pg-boss (only `pg`; the plans on first use): short commands import it.
 */
import { createHash } from 'node:crypto';
import pg from 'pg';
import type * as Plans from 'pg-boss/dist/plans.js';
import { JOB_STATE, type JobState } from '../views.ts';

/** S2: the version of pg-boss's schema these statements were tested against (its package.json `pgboss.schema`). */
export const BOSS_SCHEMA_VERSION = 46;

/** S1: the plans corral runs, loaded on first use (the module is large; the read commands never need it). */
export type BossPlans = Pick<typeof Plans, 'getVersion' | 'getQueues' | 'insertJobs'>;

let plans: Promise<BossPlans> | undefined;
export function bossPlans(): Promise<BossPlans> {
  plans ??= import('pg-boss/dist/plans.js');
  return plans;
}

/**
 * S1: the payload pg-boss's `send` inserts for a job with only an id, data and a singleton key
 * (manager's `#toJobPayload`, with `send`'s default priority and no trace context); the fields it
 * leaves out take the queue's settings in `insertJobs`.
 */
export function sendPayload(queue: string, job: { id: string; data: unknown; singletonKey: string }): Record<string, unknown> {
  return {
    id: job.id,
    name: queue,
    data: job.data,
    priority: 0,
    singletonKey: job.singletonKey,
    singletonOffset: 0,
    groupId: null,
    groupTier: null,
    deadLetter: null,
    __traceContext: null,
  };
}

/** S3: pg-boss's tables (in its schema) and its clock function. */
export const BOSS_TABLE = { job: 'job', commonJob: 'job_common', queue: 'queue', version: 'version' } as const;
export const BOSS_NOW = 'job_now';

/** S4: the job states, by name, and in the order of the enum `<schema>.job_state`. */
export { JOB_STATE, type JobState } from '../views.ts';
export const JOB_STATE_ORDER: readonly JobState[] = ['created', 'retry', 'active', 'completed', 'cancelled', 'failed'];
/** The states pg-boss counts as live (its index job_i14): every one but completed and cancelled. */
export const LIVE_STATES: readonly JobState[] = ['created', 'retry', 'active', 'failed'];
/** The states that hold a `key_strict_fifo` key (its index job_i8): at most one job per key in them. */
export const HOLDING_STATES: readonly JobState[] = ['active', 'retry', 'failed'];
/** The states of a queued job (created or retry), before `active` in the enum. */
export const QUEUED_STATES: readonly JobState[] = ['created', 'retry'];

/** S4: the queue policy of the actor queue. */
export const KEY_STRICT_FIFO = 'key_strict_fifo';

/**
 * S4: the columns of `<schema>.job` corral reads or writes, keyed by the name corral's statements
 * give them (`jobColumns` aliases a column pg-boss renamed back to its key).
 */
export const JOB = {
  id: 'id',
  name: 'name',
  data: 'data',
  state: 'state',
  priority: 'priority',
  policy: 'policy',
  blocked: 'blocked',
  retry_count: 'retry_count',
  retry_limit: 'retry_limit',
  singleton_key: 'singleton_key',
  start_after: 'start_after',
  created_on: 'created_on',
  started_on: 'started_on',
  completed_on: 'completed_on',
  heartbeat_on: 'heartbeat_on',
  output: 'output',
  source_id: 'source_id',
  /** The first job of a dead-letter lineage (the id `send` returned), on every dead letter of it. */
  source_root_id: 'source_root_id',
  source_created_on: 'source_created_on',
  source_retry_count: 'source_retry_count',
  source_output: 'source_output',
} as const;
export type JobColumn = keyof typeof JOB;

/** Their types, as `information_schema.columns.udt_name` spells them. */
export const JOB_TYPES: Record<JobColumn, string> = {
  id: 'uuid',
  name: 'text',
  data: 'jsonb',
  state: 'job_state',
  priority: 'int4',
  policy: 'text',
  blocked: 'bool',
  retry_count: 'int4',
  retry_limit: 'int4',
  singleton_key: 'text',
  start_after: 'timestamptz',
  created_on: 'timestamptz',
  started_on: 'timestamptz',
  completed_on: 'timestamptz',
  heartbeat_on: 'timestamptz',
  output: 'jsonb',
  source_id: 'uuid',
  source_root_id: 'uuid',
  source_created_on: 'timestamptz',
  source_retry_count: 'int4',
  source_output: 'jsonb',
};

/** S4: the columns of `<schema>.queue` corral reads (here and in drizzle/0002), and `<schema>.version`'s. */
export const QUEUE = { name: 'name', table_name: 'table_name', policy: 'policy', maintain_on: 'maintain_on' } as const;
export const QUEUE_TYPES: Record<keyof typeof QUEUE, string> = {
  name: 'text',
  table_name: 'text',
  policy: 'text',
  maintain_on: 'timestamptz',
};
export const VERSION_COLUMN = { version: 'int4' } as const;

/** S8: where pg-boss's own failures (expiry, lost heartbeat) and a `fail` with non-object data put the message in a job's output. */
export const BOSS_FAILURE_MESSAGE = ['value', 'message'] as const;

/** `keys` as a select list (on `alias`, if given), each column named by its key. */
export function jobColumns(keys: readonly JobColumn[], alias?: string): string {
  const at = alias ? `${alias}.` : '';
  return keys.map((k) => (JOB[k] === k ? `${at}${k}` : `${at}${JOB[k]} as ${k}`)).join(', ');
}

/** A state as an SQL literal; `states` as a parenthesised list of them. */
export const stateLiteral = (state: JobState): string => `'${state}'`;
export const stateList = (states: readonly JobState[]): string => `(${states.map(stateLiteral).join(', ')})`;

/**
 * S5: the indexes of the queue's job table the claim and the counts rely on, as `pg_get_indexdef`
 * renders them from `USING` on, the schema left out, `UNIQUE` first for a unique one (pg-boss names
 * the index `<table>_<key>`).
 */
export const BOSS_INDEXES = {
  i8:
    "UNIQUE btree (name, singleton_key) WHERE ((state = ANY (ARRAY['active'::job_state, 'retry'::job_state, 'failed'::job_state])) " +
    "AND (policy = 'key_strict_fifo'::text))",
  i10:
    'btree (name, singleton_key, state DESC, created_on, id) INCLUDE (start_after) ' +
    "WHERE ((state < 'active'::job_state) AND (NOT blocked) AND (policy = 'key_strict_fifo'::text))",
  i11: "btree (name, priority DESC, created_on, start_after) WHERE ((state < 'active'::job_state) AND (NOT blocked))",
  i14:
    "btree (name, state, blocked, start_after) WHERE (state = ANY (ARRAY['created'::job_state, 'retry'::job_state, " +
    "'active'::job_state, 'failed'::job_state]))",
  /** The dead letters of an event, by the root of their lineage (the idempotency keys' pruning). */
  i12: 'btree (source_root_id) WHERE (source_root_id IS NOT NULL)',
} as const;

/** S3: the table pg-boss keeps the queue's jobs in (`job_common` unless the queue is partitioned). */
export async function queueTable(db: pg.Pool | pg.Client, q: { schema: string; events: string }): Promise<string> {
  const res = await db.query<{ table_name: string }>(
    `select ${QUEUE.table_name} as table_name from ${pg.escapeIdentifier(q.schema)}.${BOSS_TABLE.queue} where ${QUEUE.name} = $1`,
    [q.events],
  );
  const table = res.rows[0]?.table_name;
  if (!table) throw new Error(`pg-boss queue ${q.events} does not exist`);
  return table;
}

const J = JOB;
const S = JOB_STATE;

/** S5: a job of `a` that the claim may take: queued, not blocked, of the policy, due. */
const queuedJob = (s: string, a: string, indent: string) =>
  `${a}.${J.state} < '${S.active}' and not ${a}.${J.blocked} and ${a}.${J.policy} = '${KEY_STRICT_FIFO}'\n${indent}and ${a}.${J.start_after} <= ${s}.${BOSS_NOW}()`;

/** S5: no other job of `j`'s key is active, waiting to retry or failed (one probe of `job_i8`). */
const keyNotHeld = (t: string, queue: string, j: string) => `not exists (
           select 1 from ${t} b
            where b.${J.name} = ${queue} and b.${J.singleton_key} = ${j}.${J.singleton_key}
              and b.${J.state} in ${stateList(HOLDING_STATES)} and b.${J.policy} = '${KEY_STRICT_FIFO}' and b.${J.id} <> ${j}.${J.id}
            offset 0)`;

/** S5: the claim's update of the jobs `ids` (an array expression): pg-boss's, as its fetch writes it. */
const claimUpdate = (s: string, t: string, queue: string, ids: string) => {
  const now = `${s}.${BOSS_NOW}()`;
  return `update ${t} j
       set ${J.state} = '${S.active}', ${J.started_on} = ${now}, ${J.heartbeat_on} = ${now},
           ${J.retry_count} = case when ${J.started_on} is not null then ${J.retry_count} + 1 else ${J.retry_count} end
     where j.${J.name} = ${queue} and j.${J.id} = any(${ids})
    returning ${jobColumns(['id', 'retry_count', 'data', 'singleton_key'], 'j')}`;
};

/**
 * S5: the claim's text (see db/boss-fetch.ts for how it walks the queue): `$1` the queue's name,
 * `$2` the limit. Rows: `id`, `retry_count` (the attempt), `data`, `singleton_key`.
 */
export function claimStatement(schema: string, table: string): string {
  const s = pg.escapeIdentifier(schema);
  const t = `${s}.${pg.escapeIdentifier(table)}`;
  const queued = (a: string, indent: string) => queuedJob(s, a, indent);
  return `
    with next as (
      select j.${J.id}
        from ${t} j
       where j.${J.name} = $1 and ${queued('j', '         ')}
         and j.${J.id} = (
           select h.${J.id} from ${t} h
            where h.${J.name} = $1 and h.${J.singleton_key} = j.${J.singleton_key}
              and ${queued('h', '              ')}
            order by h.${J.state} desc, h.${J.created_on}, h.${J.id}
            limit 1)
         and ${keyNotHeld(t, '$1', 'j')}
       order by j.${J.priority} desc, j.${J.created_on}
       limit $2
       for update of j skip locked
    )
    ${claimUpdate(s, t, '$1', `array(select ${J.id} from next)`)}`;
}

/**
 * S5 for named keys (the next turn of a busy actor, claimed in its commit: src/runtime/turn-commit.ts):
 * the head of each key of `$2` (a text array), taken under the claim's conditions with its update.
 * Rows as `claimStatement`'s. One entry of `job_i10` per key, then the probe of `job_i8`.
 */
export function claimKeysStatement(schema: string, table: string): string {
  const s = pg.escapeIdentifier(schema);
  const t = `${s}.${pg.escapeIdentifier(table)}`;
  return `
    with next as (
      -- each head by its primary key (name, id): a walk of another index would read the backlog
      select j.${J.id}
        from unnest(array(
           select (select h.${J.id} from ${t} h
                    where h.${J.name} = $1 and h.${J.singleton_key} = k.key
                      and ${queuedJob(s, 'h', '                      ')}
                    order by h.${J.state} desc, h.${J.created_on}, h.${J.id}
                    limit 1)
             from unnest($2::text[]) as k(key))) as n(id)
        join ${t} j on j.${J.name} = $1 and j.${J.id} = n.id
       -- re-checked on the locked row; as \`is true\`, no partial index on queued jobs matches it
       where (${queuedJob(s, 'j', '         ')}) is true
         and ${keyNotHeld(t, '$1', 'j')}
       for update of j skip locked
    )
    ${claimUpdate(s, t, '$1', `array(select ${J.id} from next)`)}`;
}

/**
 * S5: whether the key of the claimed job `c` has another job the claim could take after it
 * (queued, not blocked, due): a hint that its actor will have a next turn (one entry of `job_i10`).
 */
export function moreQueuedExpression(schema: string, table: string, queue: string, c: string): string {
  const s = pg.escapeIdentifier(schema);
  const t = `${s}.${pg.escapeIdentifier(table)}`;
  // in the head order, as the head lookup: the only plan without a sort is job_i10's, whatever the statistics say
  return `(select true from ${t} m
             where m.${J.name} = ${queue} and m.${J.singleton_key} = ${c}.${J.singleton_key} and m.${J.id} <> ${c}.${J.id}
               and ${queuedJob(s, 'm', '               ')}
             order by m.${J.state} desc, m.${J.created_on}, m.${J.id}
             limit 1) is not null`;
}

/**
 * S13: a batch's members (src/db/turns/batches.ts): the key's queued, unblocked, due jobs after `head`,
 * in the head order (so that one entry after another of index `job_i10` serves it), at most
 * `lim`. Rows: `id`, `data`. Their `key` and `head` are the statement's PL/pgSQL variables; the
 * queue's name is `queue`, the limit `lim`.
 */
export function batchMembersStatement(schema: string, table: string): string {
  const s = pg.escapeIdentifier(schema);
  const t = `${s}.${pg.escapeIdentifier(table)}`;
  return `select m.${J.id}, m.${J.data} from ${t} m
   where m.${J.name} = queue and m.${J.singleton_key} = key and m.${J.id} <> head
     and m.${J.state} < '${S.active}' and not m.${J.blocked} and m.${J.policy} = '${KEY_STRICT_FIFO}'
     and m.${J.start_after} <= ${s}.${BOSS_NOW}()
   order by m.${J.state} desc, m.${J.created_on}, m.${J.id}
   limit lim`;
}

/**
 * S14: a debounce window (src/db/turns/batches.ts, B5), on the key's queued jobs that a debounce holds
 * (not due yet, marked `debounced` in corral's data), through index `job_i10` and `job_i8` like
 * the busy probe: `running` whether a job of the key is active, waiting to retry or failed (its
 * turn runs: no window); `first` the oldest held job's `created_on`; `move` sets their
 * `start_after` to `due`; `releaseOf` does so for every held job of an agent (`session` null)
 * or actor. PL/pgSQL variables: `queue`, `key`, `due`, `agent`, `session`.
 */
export function debounceStatements(
  schema: string,
  table: string,
): { running: string; first: string; move: string; now: string; releaseOf: string } {
  const s = pg.escapeIdentifier(schema);
  const t = `${s}.${pg.escapeIdentifier(table)}`;
  const heldOf = (a: string, keys: string) =>
    `${a}.${J.name} = queue and ${keys} and ${a}.${J.state} < '${S.active}' and not ${a}.${J.blocked}
     and ${a}.${J.policy} = '${KEY_STRICT_FIFO}' and ${a}.${J.start_after} > ${s}.${BOSS_NOW}() and ${a}.${J.data} ? 'debounced'`;
  const held = (a: string) => heldOf(a, `${a}.${J.singleton_key} = key`);
  return {
    now: `${s}.${BOSS_NOW}()`,
    running: `select 1 from ${t} b where b.${J.name} = queue and b.${J.singleton_key} = key
     and b.${J.state} in ${stateList(HOLDING_STATES)} and b.${J.policy} = '${KEY_STRICT_FIFO}'`,
    first: `select w.${J.created_on} from ${t} w where ${held('w')}
   order by w.${J.state} desc, w.${J.created_on}, w.${J.id} limit 1`,
    move: `update ${t} u set ${J.start_after} = due
   where u.${J.name} = queue and u.${J.id} in (
     select w.${J.id} from ${t} w where ${held('w')} order by w.${J.state} desc, w.${J.created_on}, w.${J.id})`,
    // an agent's keys are the range ['agent/', 'agent0') of job_i10's key column ('0' follows '/')
    releaseOf: `IF session IS NULL THEN
    update ${t} u set ${J.start_after} = due where ${heldOf('u', `u.${J.singleton_key} >= agent || '/' and u.${J.singleton_key} < agent || '0'`)};
  ELSE
    update ${t} u set ${J.start_after} = due where ${heldOf('u', `u.${J.singleton_key} = agent || '/' || session`)};
  END IF;`,
  };
}

/** S13: whether job `id` of `queue` is still queued (created: a batch member no one has taken). */
export function jobQueuedStatement(schema: string, table: string, id: string): string {
  const t = `${pg.escapeIdentifier(schema)}.${pg.escapeIdentifier(table)}`;
  return `select 1 from ${t} q where q.${J.name} = queue and q.${J.id} = ${id} and q.${J.state} = '${S.created}'`;
}

/**
 * S5: what the claim copies from pg-boss's `key_strict_fifo` fetch (`fetchNextJob`), each as both
 * statements contain it once whitespace and letter case are set aside (`schema` as written in
 * them, e.g. `"pgboss"`). The test holds both statements to every one.
 */
export function claimMirrorsFetch(schema: string): { what: string; text: string }[] {
  const now = `${schema}.${BOSS_NOW}()`;
  return [
    {
      what: "a key's head is its first queued, unblocked, due job",
      text: `h.state < 'active' and not h.blocked and h.policy = 'key_strict_fifo'`,
    },
    { what: "a head is due by pg-boss's clock", text: `h.start_after <= ${now}` },
    { what: 'the head order (a retry before created jobs, then age, then id)', text: 'h.state desc, h.created_on, h.id' },
    { what: 'a candidate is queued and unblocked', text: `j.state < 'active' and not j.blocked` },
    { what: 'a candidate is due', text: `j.start_after <= ${now}` },
    {
      what: 'a key with a job active, waiting to retry or failed is held',
      text: `b.singleton_key = j.singleton_key and b.state in ('active', 'retry', 'failed') and b.policy = 'key_strict_fifo' and b.id <> j.id`,
    },
    { what: 'the fetch order', text: 'order by j.priority desc, j.created_on' },
    { what: 'the lock', text: 'for update of j skip locked' },
    {
      what: 'the claim update (a re-claim adds one attempt)',
      text:
        `set state = 'active', started_on = ${now}, heartbeat_on = ${now}, ` +
        'retry_count = case when started_on is not null then retry_count + 1 else retry_count end',
    },
  ];
}

/** S9: pg-boss's NOTIFY channel for a schema (the expression pg-boss evaluates in SQL, `notifyChannelSql`). */
export function bossNotifyChannel(schema: string): string {
  const name = /^".*"$/.test(schema) ? schema.slice(1, -1) : schema;
  return `pgboss_${createHash('sha224').update(name).digest('hex').slice(0, 24)}`;
}

/** S9: whether a notification on that channel is for `queue` (pg-boss sends the queue's name). */
export const notifiesQueue = (payload: string, queue: string): boolean => payload === queue;

/** S11: the function S1's insert becomes (its one argument is the insert's `$1`: the payloads as JSON text). */
export const EVENT_JOBS_INSERT_FUNCTION = 'corral.insert_event_jobs';

/** S11: what S1's insert needs of a queue: its job table and whether it notifies (`getQueues`). */
export interface InsertTarget {
  table: string;
  notify: boolean;
}

/** What runs S1's lookups: `boss.getDb()` or any `executeSql` adapter pg-boss takes. */
export interface BossSqlRunner {
  executeSql(text: string, values?: unknown[]): Promise<{ rows: unknown[] }>;
}

/** S11: the queue's insert target, or undefined when pg-boss's schema is not at S2's version or the queue does not exist. */
export async function insertTargetOf(db: BossSqlRunner, schema: string, queue: string): Promise<InsertTarget | undefined> {
  const { getVersion, getQueues } = await bossPlans();
  const version = await db
    .executeSql(getVersion(schema))
    .then((r) => Number((r.rows[0] as { version?: unknown } | undefined)?.version))
    .catch(() => undefined);
  if (version !== BOSS_SCHEMA_VERSION) return undefined;
  const q = getQueues(schema, [queue]);
  const found = (await db.executeSql(q.text, q.values)).rows[0] as { table?: string; notify?: boolean } | undefined;
  return found?.table ? { table: found.table, notify: Boolean(found.notify) } : undefined;
}

/**
 * S11: `CREATE OR REPLACE FUNCTION corral.insert_event_jobs(jobs text) RETURNS SETOF uuid`, whose
 * body is S1's insert for `queue` as pg-boss's `send` runs it (`returnId`, the queue's `notify`):
 * it inserts the payloads (`sendPayloadSql`'s) and returns the ids inserted.
 */
export async function eventJobsInsertFunction(schema: string, queue: string, target: InsertTarget): Promise<string> {
  const { insertJobs } = await bossPlans();
  const body = insertJobs(schema, { table: target.table, name: queue, returnId: true, notify: target.notify });
  const quote = '$corral_insert$';
  if (body.includes(quote)) throw new Error(`pg-boss's insert holds ${quote}`);
  return `CREATE OR REPLACE FUNCTION ${EVENT_JOBS_INSERT_FUNCTION}(jobs text) RETURNS SETOF uuid
LANGUAGE sql VOLATILE AS ${quote}${body}${quote};`;
}

/**
 * S11: the payload `sendPayload` builds, as a jsonb SQL expression of the job's `id` (uuid),
 * `data` (jsonb) and `singletonKey` (text) expressions: the fields it sets itself are literals,
 * read off `sendPayload`, so the two cannot drift apart.
 */
export function sendPayloadSql(queue: string, exprs: { id: string; data: string; singletonKey: string }): string {
  const marks = { id: '\u0000id', data: '\u0000data', singletonKey: '\u0000key' };
  const sqlOf = new Map<unknown, string>([
    [marks.id, `to_jsonb((${exprs.id})::text)`],
    [marks.data, `(${exprs.data})`],
    [marks.singletonKey, `to_jsonb((${exprs.singletonKey})::text)`],
  ]);
  const fields = Object.entries(sendPayload(queue, marks)).map(([k, v]) => {
    const value = sqlOf.get(v) ?? `${literal(JSON.stringify(v ?? null))}::jsonb`;
    return `${literal(k)}, ${value}`;
  });
  return `jsonb_build_object(${fields.join(', ')})`;
}

const literal = (s: string) => `'${s.replaceAll("'", "''")}'`;
