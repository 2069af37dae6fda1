/**
 * Enqueueing one actor event without starting pg-boss, for short-lived commands (`corral send`):
 * starting pg-boss costs its module graph and several round trips, more than the insert itself.
 *
 * The job is still written by pg-boss's own statements (its `plans` module: the queue lookup and
 * the job insert, NOTIFY included), with the payload fields pg-boss's `send` builds, so the row
 * is the one `boss.send` would write (a test compares the two column by column). Only when the
 * database is ready for it: pg-boss's schema at the version corral's statements were tested
 * against and the queue present. Otherwise `directSend` returns false and the caller takes the
 * full pg-boss path, which migrates and creates the queues. The plans, the payload and the
 * version are S1 and S2 of src/db/boss/internals.ts.
 */
import type pg from 'pg';
import { BOSS_SCHEMA_VERSION, bossPlans, sendPayload } from '../db/boss/internals.ts';
import { CorralError } from '../base/errors.ts';
import type { ActorEventJob } from './event-job.ts';

/**
 * Inserts `job` into `queue` through pg-boss's statements on `client`. Returns false, having
 * written nothing, when the database is not ready for the direct path.
 */
export async function directSend(client: pg.Client, schema: string, queue: string, job: ActorEventJob): Promise<boolean> {
  const { getVersion, getQueues, insertJobs } = await bossPlans();
  const version = await client
    .query<{ version: string }>(getVersion(schema))
    .then((r) => Number(r.rows[0]?.version))
    .catch(() => undefined);
  if (version !== BOSS_SCHEMA_VERSION) return false;
  const q = getQueues(schema, [queue]);
  const { rows } = await client.query<{ table: string; policy: string; notify: boolean }>(q.text, q.values);
  const found = rows[0];
  if (!found?.table) return false;
  const text = insertJobs(schema, { table: found.table, name: queue, returnId: true, notify: found.notify });
  const inserted = await client.query<{ id: string }>(text, [JSON.stringify([sendPayload(queue, job)])]);
  if (inserted.rows[0]?.id !== job.id) throw new CorralError('internal', `pg-boss's insert did not accept event ${job.id}`);
  return true;
}
