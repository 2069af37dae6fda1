/**
 * `corral send`'s direct path writes the job pg-boss's own `send` writes (same columns, the same
 * queue settings applied, the NOTIFY that wakes a daemon), and steps aside when the database is
 * not ready for it.
 */
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { DEFAULTS } from '../../src/config.ts';
import { createBoss } from '../../src/queue/boss.ts';
import { bossNotifyChannel } from '../../src/db/boss/internals.ts';
import { directSend } from '../../src/queue/direct-send.ts';
import { actorEventJob } from '../../src/queue/event-job.ts';
import { createTestDatabase, type TestDatabase } from '../helpers/db.ts';
import { waitFor } from '../helpers/wait.ts';

let db: TestDatabase;
let client: pg.Client;

beforeAll(async () => {
  db = await createTestDatabase();
  client = new pg.Client({ connectionString: db.url });
  await client.connect();
});

afterAll(async () => {
  await client?.end();
  await db?.drop();
});

type JobRow = Record<string, unknown>;
const jobRow = async (id: string): Promise<JobRow> => (await client.query<JobRow>('select * from pgboss.job where id = $1', [id])).rows[0]!;

describe('directSend', () => {
  it("writes the row pg-boss's send writes, and notifies", async () => {
    const listener = new pg.Client({ connectionString: db.url });
    await listener.connect();
    const heard: string[] = [];
    listener.on('notification', (n) => heard.push(n.channel));
    await listener.query(`listen "${bossNotifyChannel(DEFAULTS.bossSchema)}"`);

    const direct = actorEventJob(actorKey('direct', 's'), { text: 'a' }, DEFAULTS.maxEventBytes);
    expect(await directSend(client, DEFAULTS.bossSchema, DEFAULTS.queueName, direct)).toBe(true);
    await waitFor(() => heard.length > 0, { what: 'the NOTIFY of the direct insert' });

    const boss = createBoss(db.url, DEFAULTS, { max: 2 });
    await boss.start();
    const viaBoss = actorEventJob(actorKey('boss', 's'), { text: 'a' }, DEFAULTS.maxEventBytes);
    await boss.send(DEFAULTS.queueName, viaBoss.data as unknown as object, { id: viaBoss.id, singletonKey: viaBoss.singletonKey });
    await boss.stop({ graceful: false, close: true });
    await listener.end();

    const a = await jobRow(direct.id);
    const b = await jobRow(viaBoss.id);
    const differing = Object.keys(b).filter((k) => JSON.stringify(a[k]) !== JSON.stringify(b[k]));
    // Only what is per job or per moment may differ.
    expect(differing.filter((k) => !['id', 'data', 'singleton_key', 'created_on', 'start_after', 'keep_until'].includes(k))).toEqual([]);
    expect(a.singleton_key).toBe('direct/s');
    expect(a.data).toEqual(direct.data);
    expect(a.state).toBe('created');
    expect(a.retry_limit).toBe(DEFAULTS.retryLimit);
  });

  it('steps aside, writing nothing, for a queue that does not exist', async () => {
    const job = actorEventJob(actorKey('nowhere', 's'), {}, DEFAULTS.maxEventBytes);
    expect(await directSend(client, DEFAULTS.bossSchema, 'no-such-queue', job)).toBe(false);
    expect(await directSend(client, 'no_such_schema', DEFAULTS.queueName, job)).toBe(false);
    expect((await client.query('select 1 from pgboss.job where id = $1', [job.id])).rowCount).toBe(0);
  });
});
