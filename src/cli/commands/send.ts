/**
 * `corral send <agent_uid>/<session_id> '<json>'`: enqueue one event and print its id.
 *
 * The light path: one connection, no Drizzle, no pool, and pg-boss's insert statement without
 * starting pg-boss (see queue/direct-send.ts); a database not yet set up for that gets the full
 * pg-boss path, which migrates and creates the queues.
 */
import pg from 'pg';
import { parseActorKey } from '../../actor-key.ts';
import type { Config } from '../../config.ts';
import { CorralError, toError } from '../../errors.ts';
import { unstorableReason } from '../../json-safety.ts';
import { directSend } from '../../queue/direct-send.ts';
import { actorEventJob, type ActorEventJob } from '../../queue/event-job.ts';
import type { Logger } from '../../logger.ts';
import { commandLogger, connectDatabase } from '../database.ts';

export function parseJsonArgument(text: string, what = 'event'): unknown {
  let value: unknown;
  try {
    value = JSON.parse(text) as unknown;
  } catch (e) {
    throw new CorralError('invalid_argument', `the ${what} must be JSON: ${(e as Error).message}`);
  }
  // refuse what jsonb cannot keep before touching the database (a usage error, not exit 1)
  const why = unstorableReason(value);
  if (why) throw new CorralError('invalid_argument', `the ${what} cannot be stored: ${why}`);
  return value;
}

export async function runSendCommand(config: Config, actor: string, json: string, out: NodeJS.WritableStream): Promise<number> {
  const key = parseActorKey(actor);
  const job = actorEventJob(key, parseJsonArgument(json), config.maxEventBytes);
  const logger = commandLogger(config);
  const { client, url } = await connectDatabase(config, logger, async (url) => {
    const client = new pg.Client({ connectionString: url, application_name: 'corral-cli', connectionTimeoutMillis: 10_000 });
    client.on('error', (e) => logger.warn({ err: e.message }, 'database connection error'));
    try {
      await client.connect();
      return { client, url };
    } catch (e) {
      await client.end().catch(() => undefined);
      throw e;
    }
  });
  let sent: boolean;
  try {
    sent = await directSend(client, config.bossSchema, config.queueName, job);
  } finally {
    await client.end().catch(() => undefined);
  }
  if (!sent) await sendWithBoss(url, config, job, logger);
  out.write(`${job.id}\n`);
  return 0;
}

/**
 * The full path, for a database pg-boss has not set up yet: start pg-boss (it migrates, under its
 * advisory lock), create the queues, send. Commands started together on a fresh database race
 * pg-boss's install; the loser retries, and the fixed job id makes a retry unable to enqueue
 * the event twice (a second insert of the same id fails).
 */
async function sendWithBoss(url: string, config: Config, job: ActorEventJob, logger: Logger): Promise<void> {
  const { createBoss, ensureQueues } = await import('../../queue/boss.ts');
  for (let attempt = 1; ; attempt++) {
    const boss = createBoss(url, config, { max: 2, onError: (e) => logger.warn({ err: e.message }, 'pg-boss error') });
    try {
      await boss.start();
      await ensureQueues(boss, config, { updateExisting: false });
      const id = await boss.send(config.queueName, job.data as unknown as object, { id: job.id, singletonKey: job.singletonKey });
      if (id !== job.id) throw new CorralError('internal', `pg-boss did not accept event ${job.id}`);
      return;
    } catch (e) {
      if (attempt >= 3 || e instanceof CorralError) throw e;
      logger.info({ err: toError(e).message, attempt }, 'setting up the queue failed; trying again');
      await new Promise((r) => setTimeout(r, 250 * attempt));
    } finally {
      await boss.stop({ graceful: false, close: true }).catch(() => undefined);
    }
  }
}
