/**
 * pg-boss's internals that corral relies on (src/db/boss/internals.ts, S1–S10) are those of the
 * installed pg-boss, on a schema that pg-boss installed. Run after every pg-boss upgrade (see
 * docs/migrations.md, "Upgrading pg-boss"): each assertion names the piece it guards, so a failure
 * says which of corral's statements to revisit. With test/queue/key-head-fetch.test.ts (corral's claim takes
 * what pg-boss's fetch takes) and test/queue/notify-channel.test.ts (the channel is the one
 * pg-boss's SQL computes), this is the whole check of that surface. S11 (the SQL enqueue) is checked
 * here whole: the function's body, the row it writes column by column, its NOTIFY.
 */
import { readFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import pg from 'pg';
import type { PgBoss } from 'pg-boss';
import * as plans from 'pg-boss/dist/plans.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { DEFAULTS } from '../../src/config.ts';
import { keyHeadFetch } from '../../src/db/boss/fetch.ts';
import {
  BOSS_FAILURE_MESSAGE,
  BOSS_INDEXES,
  BOSS_NOW,
  BOSS_SCHEMA_VERSION,
  BOSS_TABLE,
  HOLDING_STATES,
  JOB,
  JOB_STATE,
  JOB_STATE_ORDER,
  JOB_TYPES,
  KEY_STRICT_FIFO,
  LIVE_STATES,
  QUEUE,
  QUEUE_TYPES,
  VERSION_COLUMN,
  bossNotifyChannel,
  bossPlans,
  claimMirrorsFetch,
  claimKeysStatement,
  claimStatement,
  notifiesQueue,
  queueTable,
  sendPayload,
  sendPayloadSql,
  EVENT_JOBS_INSERT_FUNCTION,
} from '../../src/db/boss/internals.ts';
import { installSendEvent, sendEventFunctionsSql } from '../../src/db/enqueue/send-event.ts';
import { getDeadLetter, holdBossMaintenance, makeLastAttempt, makeQueuedLastAttempt, requeueActiveJob } from '../../src/db/boss/jobs.ts';
import { jobActiveOf } from '../../src/db/turns/fence.ts';
import { sql } from '../../src/db/orm.ts';
import { createBoss, queuesOf } from '../../src/queue/boss.ts';
import { actorEventJob } from '../../src/queue/event-job.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { waitFor } from '../helpers/wait.ts';

const q = queuesOf(DEFAULTS);
const schema = q.schema;
const tdb = useTestDatabase();
let boss: PgBoss;
let table: string;

beforeAll(async () => {
  boss = createBoss(tdb.url, DEFAULTS, { max: 2 });
  await boss.start();
  table = await queueTable(tdb.client, q);
});

afterAll(async () => {
  await boss?.stop({ graceful: false, close: true });
});

const one = async <R extends pg.QueryResultRow>(text: string, values: unknown[] = []): Promise<R> =>
  (await tdb.client.query<R>(text, values)).rows[0]!;

/** A statement's text with whitespace collapsed, lower case, the schema unquoted. */
const normalized = (text: string) => text.replaceAll(pg.escapeIdentifier(schema), schema).replace(/\s+/g, ' ').toLowerCase();

/** Sends a job of a fresh actor through pg-boss, recording the statements it runs. */
async function sendRecorded(session: string) {
  const job = actorEventJob(actorKey('internals', session), { session }, DEFAULTS.maxEventBytes);
  const calls: { text: string; values: unknown[] }[] = [];
  const recorder = {
    executeSql: (text: string, values?: unknown[]) => {
      calls.push({ text, values: values ?? [] });
      return tdb.client.query(text, values);
    },
  };
  const id = await boss.send(q.events, job.data as unknown as object, { id: job.id, singletonKey: job.singletonKey, db: recorder });
  expect(id).toBe(job.id);
  return { job, calls };
}

describe('pg-boss internals (src/db/boss/internals.ts)', () => {
  it('package.json pins pg-boss (exact or ~) and the pinned release is the one installed', async () => {
    const root = JSON.parse(await readFile(new URL('../../package.json', import.meta.url), 'utf8')) as {
      dependencies: Record<string, string>;
    };
    const pin = root.dependencies['pg-boss'] ?? '';
    const installed = (
      JSON.parse(await readFile(createRequire(import.meta.url).resolve('pg-boss/package.json'), 'utf8')) as { version: string }
    ).version;
    const m = /^(~?)(\d+)\.(\d+)\.(\d+)$/.exec(pin);
    expect(m, `the pg-boss pin in package.json is exact or ~ (found "${pin}"): a new release must pass this test first`).not.toBeNull();
    const [, tilde, major, minor, patch] = m!;
    const [iMajor, iMinor, iPatch] = installed.split('.').map(Number);
    const admitted = tilde
      ? iMajor === Number(major) && iMinor === Number(minor) && iPatch! >= Number(patch)
      : installed === `${major}.${minor}.${patch}`;
    expect(admitted, `the installed pg-boss ${installed} is the pinned ${pin}`).toBe(true);
  });

  it("S2: the schema version is the installed pg-boss's and the installed schema's", async () => {
    const pkg = JSON.parse(await readFile(createRequire(import.meta.url).resolve('pg-boss/package.json'), 'utf8')) as {
      version: string;
      pgboss: { schema: number };
    };
    expect(BOSS_SCHEMA_VERSION, `S2: pg-boss ${pkg.version} installs schema version ${pkg.pgboss.schema}`).toBe(pkg.pgboss.schema);
    const installed = await one<{ version: number }>(
      `select ${Object.keys(VERSION_COLUMN)[0]} as version from ${schema}.${BOSS_TABLE.version}`,
    );
    expect(Number(installed.version), 'S2: the version pg-boss wrote into its schema').toBe(BOSS_SCHEMA_VERSION);
  });

  it('S3: the tables: the job table partitioned by queue name, the queue table pg-boss uses, its clock', async () => {
    expect(BOSS_TABLE.job, "S3: pg-boss's job table").toBe(plans.BASE_JOB_TABLE);
    expect(BOSS_TABLE.commonJob, "S3: pg-boss's shared job table").toBe(plans.COMMON_JOB_TABLE);
    const part = await one<{ key: string | null }>(`select pg_get_partkeydef(to_regclass($1)) as key`, [`${schema}.${BOSS_TABLE.job}`]);
    expect(part.key, 'S3: the job table is partitioned by queue name').toBe('LIST (name)');
    const queue = await boss.getQueue(q.events);
    expect(table, "S3: queueTable() names the table pg-boss's getQueue() names").toBe(queue?.table);
    expect(table, 'S3: an unpartitioned queue keeps its jobs in the shared table').toBe(BOSS_TABLE.commonJob);
    const parent = await one<{ parent: string }>(
      `select inhparent::regclass::text as parent from pg_inherits where inhrelid = to_regclass($1)`,
      [`${schema}.${table}`],
    );
    expect(parent?.parent, "S3: the queue's table is a partition of the job table").toBe(`${schema}.${BOSS_TABLE.job}`);
    const clock = await one<{ now: Date; db_now: Date }>(`select ${schema}.${BOSS_NOW}() as now, now() as db_now`);
    expect(clock.now, "S3: pg-boss's clock function is PostgreSQL's now()").toEqual(clock.db_now);
  });

  it('S4, S10: the columns corral reads and writes exist with their types', async () => {
    const columns = async (t: string) =>
      new Map(
        (
          await tdb.client.query<{ column_name: string; udt_name: string }>(
            'select column_name, udt_name from information_schema.columns where table_schema = $1 and table_name = $2',
            [schema, t],
          )
        ).rows.map((r) => [r.column_name, r.udt_name]),
      );
    const changed: string[] = [];
    const check = (t: string, found: Map<string, string>, expected: [string, string][]) => {
      for (const [name, type] of expected) {
        if (found.get(name) !== type) changed.push(`${t}.${name}: expected ${type}, found ${found.get(name) ?? 'no such column'}`);
      }
    };
    const jobColumns = Object.entries(JOB).map(([k, name]) => [name, JOB_TYPES[k as keyof typeof JOB]] as [string, string]);
    check(BOSS_TABLE.job, await columns(BOSS_TABLE.job), jobColumns);
    check(table, await columns(table), jobColumns);
    check(
      BOSS_TABLE.queue,
      await columns(BOSS_TABLE.queue),
      Object.entries(QUEUE).map(([k, name]) => [name, QUEUE_TYPES[k as keyof typeof QUEUE]]),
    );
    check(BOSS_TABLE.version, await columns(BOSS_TABLE.version), Object.entries(VERSION_COLUMN));
    expect(changed, "S4: pg-boss's columns that corral's statements name").toEqual([]);
  });

  it("S4: the job states and their order are pg-boss's, and so is the actor queue's policy", async () => {
    const labels = (
      await tdb.client.query<{ label: string }>(
        'select enumlabel as label from pg_enum where enumtypid = to_regtype($1) order by enumsortorder',
        [`${schema}.job_state`],
      )
    ).rows.map((r) => r.label);
    expect(labels, "S4: the states of pg-boss's job_state enum, in order").toEqual(JOB_STATE_ORDER);
    expect(JOB_STATE, "S4: pg-boss's JOB_STATES").toEqual(plans.JOB_STATES);
    expect(KEY_STRICT_FIFO, "S4: pg-boss's key_strict_fifo policy").toBe(plans.QUEUE_POLICIES.key_strict_fifo);
    expect((await boss.getQueue(q.events))?.policy, "S4: the actor queue's policy").toBe(KEY_STRICT_FIFO);
  });

  it('S5: the indexes the claim and the counts rely on are on the queue table as expected', async () => {
    const { rows } = await tdb.client.query<{ indexname: string; indexdef: string }>(
      'select indexname, indexdef from pg_indexes where schemaname = $1 and tablename = $2',
      [schema, table],
    );
    const defs = new Map(rows.map((r) => [r.indexname, r.indexdef]));
    const changed: string[] = [];
    for (const [key, expected] of Object.entries(BOSS_INDEXES)) {
      const def = defs.get(`${table}_${key}`);
      const m = def && /^CREATE (UNIQUE )?INDEX \S+ ON \S+ USING (.*)$/.exec(def);
      const found = m ? `${m[1] ?? ''}${m[2]!.replaceAll(`${schema}.`, '')}` : 'no such index';
      if (found !== expected) changed.push(`job_${key}: expected ${expected}\n  found ${found}`);
    }
    expect(changed, "S5: pg-boss's indexes behind the claim (job_i8, job_i10, job_i11) and the live counts (job_i14)").toEqual([]);
    expect(BOSS_INDEXES.i8, 'S5: the states that hold a key are those of job_i8').toContain(
      HOLDING_STATES.map((s) => `'${s}'::job_state`).join(', '),
    );
    expect(BOSS_INDEXES.i14, 'S5: the live states are those of job_i14').toContain(LIVE_STATES.map((s) => `'${s}'::job_state`).join(', '));
  });

  it("S5: the claim copies what it relies on of pg-boss's key_strict_fifo fetch", async () => {
    const calls: string[] = [];
    await tdb.client.query('begin');
    try {
      await boss.fetch(q.events, {
        batchSize: 5,
        db: {
          executeSql: (text: string, values?: unknown[]) => {
            calls.push(text);
            return tdb.client.query(text, values);
          },
        },
      });
    } finally {
      await tdb.client.query('rollback');
    }
    expect(calls, 'S5: one statement per fetch').toHaveLength(1);
    const theirs = normalized(calls[0]!);
    const ours = normalized(claimStatement(schema, table));
    const ofKeys = normalized(claimKeysStatement(schema, table));
    for (const m of claimMirrorsFetch(schema)) {
      expect(theirs, `S5: pg-boss's fetch: ${m.what}`).toContain(m.text);
      expect(ours, `S5: corral's claim: ${m.what}`).toContain(m.text);
      // the claim of named keys takes each key's head: it has no order across keys
      if (m.what !== 'the fetch order') expect(ofKeys, `S5: corral's claim of named keys: ${m.what}`).toContain(m.text);
    }
    // a concurrent claim of one key fails on job_i8: pg-boss's fetch takes that for an empty fetch, as corral's does
    const manager = await readFile(createRequire(import.meta.url).resolve('pg-boss/dist/manager.js'), 'utf8');
    const at = manager.indexOf('plans.fetchNextJob(');
    const fetchCall = at < 0 ? '' : manager.slice(at, manager.indexOf('const rows', at));
    expect(fetchCall, "S5: pg-boss's fetch takes a unique violation (23505) for an empty fetch").toMatch(
      /catch \(err\) \{[^}]*err\?\.code !== '23505'\)\s*throw err;\s*\}/,
    );
  });

  it("S1: the plans the direct send runs are the statement and payload pg-boss's send runs", async () => {
    const { getVersion, getQueues, insertJobs } = await bossPlans();
    expect(Number((await one<{ version: string }>(getVersion(schema))).version), 'S1: getVersion reads the schema version').toBe(
      BOSS_SCHEMA_VERSION,
    );
    const lookup = getQueues(schema, [q.events]);
    const queue = (await tdb.client.query<{ table: string; notify: boolean }>(lookup.text, lookup.values)).rows[0];
    expect(queue, "S1: getQueues gives the queue's table and notify").toMatchObject({ table, notify: true });

    const { job, calls } = await sendRecorded('plans');
    const insert = calls.find((c) => /insert into/i.test(c.text));
    expect(insert?.text, "S1: boss.send's insert is insertJobs(…)").toBe(
      insertJobs(schema, { table, name: q.events, returnId: true, notify: true }),
    );
    expect(JSON.parse(insert!.values[0] as string), "S1: boss.send's payload is sendPayload(…)").toEqual(
      JSON.parse(JSON.stringify([sendPayload(q.events, job)])),
    );
  });

  it('S9: pg-boss NOTIFYs the queue name on the channel the consumer LISTENs on', async () => {
    const listener = new pg.Client({ connectionString: tdb.url });
    await listener.connect();
    try {
      const heard: { channel: string; payload?: string }[] = [];
      listener.on('notification', (n) => heard.push(n));
      // also on the channel pg-boss's own SQL names, so a wrong channel fails at once, saying so
      const theirs = (await one<{ channel: string }>(`select ${plans.notifyChannelSql(schema)} as channel`)).channel;
      await listener.query(`listen ${pg.escapeIdentifier(bossNotifyChannel(schema))}`);
      await listener.query(`listen ${pg.escapeIdentifier(theirs)}`);
      await sendRecorded('notify');
      await waitFor(() => heard.length > 0, { what: "S9: pg-boss's NOTIFY of a send", timeoutMs: 5_000 });
      expect(heard[0]!.channel, 'S9: pg-boss NOTIFYs on bossNotifyChannel(schema)').toBe(bossNotifyChannel(schema));
      expect(notifiesQueue(heard[0]!.payload ?? '', q.events), `S9: the payload names the queue (got ${heard[0]!.payload})`).toBe(true);
    } finally {
      await listener.end();
    }
  });

  it("S5–S8: a claim is pg-boss's attempt, the fence reads it, and a last attempt dead-letters through pg-boss", async () => {
    const { job } = await sendRecorded('attempts');
    const claim = keyHeadFetch(tdb.client, q, table);
    const fenced = async (retryCount: number) => {
      const res = await tdb.database.db.execute<{ active: boolean }>(
        sql`select ${jobActiveOf({ schema, queue: q.events }, 'd')} as active
              from (select ${job.id}::uuid as event_id, ${retryCount}::int as job_retry_count) d`,
      );
      return res.rows[0]!.active;
    };

    const first = (await claim(100)).find((j) => j.id === job.id);
    expect(first?.retryCount, 'S5: the first claim is attempt 0').toBe(0);
    expect(await fenced(0), 'S6: the fence holds for the claimed attempt').toBe(true);
    await boss.fail(q.events, { id: job.id, retryCount: 0 }, { error: 'first' });
    expect(await fenced(0), 'S6: the fence fails once pg-boss failed the attempt').toBe(false);
    const retried = await one<{ state: string }>(`select state::text from ${schema}.job where name = $1 and id = $2`, [q.events, job.id]);
    expect(retried.state, 'S7: a failure with retries left is a retry').toBe(JOB_STATE.retry);

    await tdb.client.query(`update ${schema}.job set start_after = now() where name = $1 and id = $2`, [q.events, job.id]);
    const second = (await claim(100)).find((j) => j.id === job.id);
    expect(second?.retryCount, 'S5: a re-claim adds one attempt').toBe(1);
    expect(await fenced(0), 'S6: the fence fails for the earlier attempt').toBe(false);
    expect(await fenced(1), 'S6: the fence holds for the re-claimed attempt').toBe(true);

    expect(await makeLastAttempt(tdb.database.db, schema, q.events, job.id, 0), 'S7: makeLastAttempt is fenced by the attempt').toBe(false);
    expect(await makeLastAttempt(tdb.database.db, schema, q.events, job.id, 1), 'S7: makeLastAttempt on the running attempt').toBe(true);
    const output = { error: { code: 'turn_error', message: 'last' }, kind: 'turn_error' };
    await boss.fail(q.events, { id: job.id, retryCount: 1 }, output);
    const failed = await one<{ state: string }>(`select state::text from ${schema}.job where name = $1 and id = $2`, [q.events, job.id]);
    expect(failed.state, "S7: pg-boss's fail after makeLastAttempt is final").toBe(JOB_STATE.failed);

    const copy = await one<{ id: string }>(`select id from ${schema}.job where name = $1 and source_id = $2`, [q.deadLetter, job.id]);
    expect(copy, 'S7: pg-boss made the dead-letter copy').toBeDefined();
    const dead = await getDeadLetter(tdb.database.db, q, copy.id);
    expect(dead, "S8: the dead letter's provenance, as pg-boss stamped it").toMatchObject({
      eventId: job.id,
      actor: job.singletonKey,
      attempts: 2,
      lastError: output,
      payload: job.data.payload,
    });
  });

  it("S8: pg-boss's own failures put their message where the dead-letter search reads it", async () => {
    const { job } = await sendRecorded('heartbeat');
    const claimed = (await keyHeadFetch(tdb.client, q, table)(100)).find((j) => j.id === job.id);
    expect(claimed).toBeDefined();
    await tdb.client.query(`update ${schema}.job set heartbeat_on = now() - interval '1 day' where name = $1 and id = $2`, [
      q.events,
      job.id,
    ]);
    await boss.supervise(q.events);
    const [value, message] = BOSS_FAILURE_MESSAGE;
    const row = await one<{ state: string; message: string | null }>(
      `select state::text, output->'${value}'->>'${message}' as message from ${schema}.job where name = $1 and id = $2`,
      [q.events, job.id],
    );
    expect(row.state, "S8: pg-boss's supervision failed the job whose heartbeat lapsed").toBe(JOB_STATE.retry);
    expect(row.message ?? 'none', `S8: pg-boss's failure output carries its message at ${BOSS_FAILURE_MESSAGE.join('.')}`).toMatch(
      /heartbeat/,
    );
  });
  it("S11: corral.send_event runs pg-boss's insert and writes the row boss.send writes, column by column, and NOTIFYs", async () => {
    const { insertJobs } = await bossPlans();
    const body = await one<{ src: string }>(`select prosrc as src from pg_proc where oid = to_regprocedure($1)`, [
      `${EVENT_JOBS_INSERT_FUNCTION}(text)`,
    ]);
    expect(body.src, `S11: ${EVENT_JOBS_INSERT_FUNCTION}'s body is pg-boss's insertJobs(…)`).toBe(
      insertJobs(schema, { table, name: q.events, returnId: true, notify: true }),
    );
    const twin = { id: '01234567-89ab-7def-8123-456789abcdef', data: { a: [1, 'x'] }, singletonKey: 'a/s' };
    const payload = await one<{ p: unknown }>(
      `select ${sendPayloadSql(q.events, { id: '$1::uuid', data: '$2::jsonb', singletonKey: '$3::text' })} as p`,
      [twin.id, JSON.stringify(twin.data), twin.singletonKey],
    );
    expect(payload.p, "S11: sendPayloadSql is sendPayload's payload").toEqual(JSON.parse(JSON.stringify(sendPayload(q.events, twin))));
    const generated = await sendEventFunctionsSql({ ...DEFAULTS }, { table, notify: true });
    expect(generated, `S11: the generated enqueue calls ${EVENT_JOBS_INSERT_FUNCTION}`).toContain(`FROM ${EVENT_JOBS_INSERT_FUNCTION}(`);
    const version = async () =>
      (await one<{ x: string }>(`select xmin::text as x from pg_proc where oid = to_regprocedure('corral.send_events(jsonb)')`)).x;
    const installed = await version();
    expect(await installSendEvent(boss.getDb(), DEFAULTS), 'S11: installed for an existing queue').toBe(true);
    expect(await version(), 'S11: the same text is not installed again').toBe(installed);
    expect(await installSendEvent(boss.getDb(), { ...DEFAULTS, maxEventBytes: 1000 }), 'S11: other settings are').toBe(true);
    expect(await version(), 'S11: other settings replace the functions').not.toBe(installed);
    await installSendEvent(boss.getDb(), DEFAULTS);
    expect(await installSendEvent(boss.getDb(), { ...DEFAULTS, queueName: 'no-such-queue' }), 'S11: not for a missing one').toBe(false);

    const listener = new pg.Client({ connectionString: tdb.url });
    await listener.connect();
    try {
      const heard: string[] = [];
      listener.on('notification', (n) => heard.push(`${n.channel} ${n.payload}`));
      await listener.query(`listen ${pg.escapeIdentifier(bossNotifyChannel(schema))}`);
      await tdb.client.query('begin');
      const viaSql = (
        await one<{ id: string }>(`select corral.send_event('internals', 'sql', $1::jsonb) as id`, [JSON.stringify({ n: 1 })])
      ).id;
      await tdb.client.query('commit');
      await waitFor(() => heard.length > 0, { what: 'S11: the NOTIFY of corral.send_event', timeoutMs: 5_000 });
      expect(heard[0], "S11: pg-boss's channel and payload").toBe(`${bossNotifyChannel(schema)} ${q.events}`);

      const { job } = await sendRecorded('sql-twin');
      type Row = Record<string, unknown>;
      const row = async (id: string) =>
        (await tdb.client.query<Row>(`select * from ${schema}.job where name = $1 and id = $2`, [q.events, id])).rows[0]!;
      const a = await row(viaSql);
      const b = await row(job.id);
      const differing = Object.keys(b).filter((k) => JSON.stringify(a[k]) !== JSON.stringify(b[k]));
      expect(
        differing.filter((k) => !['id', 'data', 'singleton_key', 'created_on', 'start_after', 'keep_until'].includes(k)),
        "S11: only what is per job or per moment differs from boss.send's row",
      ).toEqual([]);
      expect(a.singleton_key, 'S11: the singleton key is the actor key').toBe('internals/sql');
      const data = a.data as Record<string, unknown>;
      expect(Object.keys(data).sort(), "S11: the job's data has the fields actorEventJob gives it").toEqual(Object.keys(job.data).sort());
      expect(data).toMatchObject({ agentUid: 'internals', sessionId: 'sql', payload: { n: 1 } });
      expect(new Date(data.enqueuedAt as string).toISOString(), 'S11: enqueuedAt as toISOString() writes it').toBe(data.enqueuedAt);
    } finally {
      await tdb.client.query('rollback').catch(() => undefined);
      await listener.end();
    }
  });

  it('S13–S15: a batch is read off the key in order, completed or dead-lettered from created, and an interrupted attempt requeued unspent', async () => {
    const key = actorKey('internals', 'batch');
    const jobs = [0, 1, 2, 3].map((n) => actorEventJob(key, { n }, DEFAULTS.maxEventBytes));
    for (const [i, j] of jobs.entries()) {
      await boss.send(q.events, j.data as unknown as object, {
        id: j.id,
        singletonKey: j.singletonKey,
        // the last one is not due yet (a reminder): a batch leaves it out
        ...(i === 3 ? { startAfter: 3600 } : {}),
        db: { executeSql: (text: string, values?: unknown[]) => tdb.client.query(text, values) },
      });
    }
    await tdb.client.query(`insert into corral.input_policies (agent_uid, session_id, policy) values ('internals', 'batch', 'coalesce')`);
    try {
      const head = (await keyHeadFetch(tdb.client, q, table)(100)).find((j) => j.id === jobs[0]!.id);
      expect(
        head?.batch?.map((m) => m.event_id),
        'S13: the due jobs after the head, in order',
      ).toEqual([jobs[1]!.id, jobs[2]!.id]);
      expect(head?.batch?.map((m) => m.data)).toEqual([{ n: 1 }, { n: 2 }]);
      const state = async (id: string) => (await one<{ s: string }>(`select state::text as s from ${schema}.job where id = $1`, [id])).s;
      expect(await state(jobs[1]!.id), 'S13: members stay created while the head runs').toBe(JOB_STATE.created);

      // S15: the head back to the queue unspent; the next claim takes it at the same attempt
      expect(await requeueActiveJob(tdb.database.db, schema, q.events, jobs[0]!.id, 1), 'S15: fenced by the attempt').toBe(false);
      expect(await requeueActiveJob(tdb.database.db, schema, q.events, jobs[0]!.id, 0)).toBe(true);
      expect(await state(jobs[0]!.id)).toBe(JOB_STATE.created);
      const again = (await keyHeadFetch(tdb.client, q, table)(100)).find((j) => j.id === jobs[0]!.id);
      expect(again?.retryCount, 'S15: no attempt spent').toBe(0);

      // B2: members complete from created with includeQueued
      const done = (await boss.complete(q.events, [jobs[1]!.id], null, { includeQueued: true })) as { affected?: number };
      expect(done.affected, "S13: pg-boss's complete takes a queued job with includeQueued").toBe(1);
      expect(await state(jobs[1]!.id)).toBe(JOB_STATE.completed);
      // B4: a queued member's last attempt, failed unfenced, is dead-lettered by pg-boss (one at a time: failed holds the key)
      await boss.deleteJob(q.events, jobs[0]!.id);
      expect(await makeQueuedLastAttempt(tdb.database.db, schema, q.events, jobs[2]!.id)).toBe(true);
      await boss.fail(q.events, jobs[2]!.id, { error: 'batch' });
      expect(await state(jobs[2]!.id), "S13: pg-boss's fail after makeQueuedLastAttempt is final").toBe(JOB_STATE.failed);
      const copy = await one<{ n: number }>(`select count(*)::int as n from ${schema}.job where name = $1 and source_id = $2`, [
        q.deadLetter,
        jobs[2]!.id,
      ]);
      expect(copy.n, 'S13: with its dead-letter copy').toBe(1);

      // S14: a debounce moves the held jobs of an idle key to one start time
      await boss.deleteJob(q.events, jobs[2]!.id);
      await tdb.client.query(`update ${schema}.job set data = data || '{"debounced": true}' where id = $1`, [jobs[3]!.id]);
      const due = await one<{ due: Date }>(`select corral.debounce_due($1, $2, 300, 5000) as due`, [q.events, 'internals/batch']);
      const moved = await one<{ start_after: Date }>(`select start_after from ${schema}.job where id = $1`, [jobs[3]!.id]);
      expect(moved.start_after.getTime(), 'S14: the held job starts when the window ends').toBe(due.due.getTime());
      expect(due.due.getTime() - Date.now(), 'S14: a debounce from now').toBeLessThan(5_000);
    } finally {
      await tdb.client.query(`delete from corral.input_policies where agent_uid = 'internals'`);
    }
  });

  it("S12: a stamped maintenance claim keeps pg-boss's daily walk off corral's queues", async () => {
    const names = [q.events, q.deadLetter];
    const day = 86_400;
    // pg-boss's own claim: the queues it would walk now with its default interval
    const due = async () => {
      await tdb.client.query('begin');
      try {
        const claim = plans.trySetQueueDeletionTime(schema, names, day, true);
        return (await tdb.client.query<{ name: string }>(claim.text, claim.values)).rows.map((r) => r.name).sort();
      } finally {
        await tdb.client.query('rollback');
      }
    };
    await tdb.client.query(`update ${schema}.queue set maintain_on = null where name = any($1)`, [names]);
    expect(await due(), 'S12: never maintained, both queues are due').toEqual([...names].sort());
    await holdBossMaintenance(tdb.database.db, schema, names);
    expect(await due(), "S12: after corral's stamp, neither is").toEqual([]);
    await tdb.client.query(`update ${schema}.queue set maintain_on = maintain_on - interval '1 day 1 second' where name = any($1)`, [
      names,
    ]);
    expect(await due(), 'S12: a stamp a day old is due again (the sweep stamps every pass)').toEqual([...names].sort());
  });
});
