/**
 * Enqueueing one actor event without starting pg-boss, for short-lived commands (`corral send`):
 * starting pg-boss costs its module graph and several round trips, more than the insert itself.
 *
 * The job is still written by pg-boss's own statements (its `plans` module: the queue lookup and
 * the job insert, NOTIFY included), with the payload fields pg-boss's `send` builds, so the row
 * is the one `boss.send` would write (a test compares the two column by column). Only when the
 * database is ready for it: pg-boss's schema at the version this pg-boss expects and the queue
 * present. Otherwise `directSend` returns false and the caller takes the full pg-boss path, which
 * migrates and creates the queues.
 */
import { readFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import type pg from 'pg';
import { getQueues, getVersion, insertJobs } from 'pg-boss/dist/plans.js';
import { CorralError } from '../errors.ts';
import type { ActorEventJob } from './event-job.ts';

let expectedVersion: Promise<number | undefined> | undefined;

/** The schema version this pg-boss installs (its package.json `pgboss.schema`). */
function bossSchemaVersion(): Promise<number | undefined> {
  expectedVersion ??= readFile(createRequire(import.meta.url).resolve('pg-boss/package.json'), 'utf8')
    .then((t) => (JSON.parse(t) as { pgboss?: { schema?: number } }).pgboss?.schema)
    .catch(() => undefined);
  return expectedVersion;
}

/** The fields pg-boss's `send` puts in a job's insert payload; absent ones take the queue's settings. */
function insertPayload(queue: string, job: ActorEventJob): Record<string, unknown> {
  return {
    id: job.id,
    name: queue,
    data: job.data,
    singletonKey: job.singletonKey,
    singletonOffset: 0,
    groupId: null,
    groupTier: null,
    deadLetter: null,
  };
}

/**
 * Inserts `job` into `queue` through pg-boss's statements on `client`. Returns false, having
 * written nothing, when the database is not ready for the direct path.
 */
export async function directSend(client: pg.Client, schema: string, queue: string, job: ActorEventJob): Promise<boolean> {
  const expected = await bossSchemaVersion();
  if (expected === undefined) return false;
  const version = await client
    .query<{ version: string }>(getVersion(schema))
    .then((r) => Number(r.rows[0]?.version))
    .catch(() => undefined);
  if (version !== expected) return false;
  const q = getQueues(schema, [queue]);
  const { rows } = await client.query<{ table: string; policy: string; notify: boolean }>(q.text, q.values);
  const found = rows[0];
  if (!found?.table) return false;
  const text = insertJobs(schema, { table: found.table, name: queue, returnId: true, notify: found.notify });
  const inserted = await client.query<{ id: string }>(text, [JSON.stringify([insertPayload(queue, job)])]);
  if (inserted.rows[0]?.id !== job.id) throw new CorralError('internal', `pg-boss's insert did not accept event ${job.id}`);
  return true;
}
