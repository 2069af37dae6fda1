/**
 * `corral send <agent_uid>/<session_id> '<json>' | --file F | -`: enqueue one event and print
 * its id.
 *
 * The light path: one connection, no Drizzle, no pool, one query to check corral's schema, then
 * `corral.send_event`, the enqueue every other sender runs (src/db/enqueue/send-event.ts: its checks,
 * event ids and input policies). A database where the daemon has not installed that function
 * yet gets pg-boss's insert statement without starting pg-boss (see queue/direct-send.ts), and
 * one whose queue is not set up either the full pg-boss path, which creates it.
 */
import pg from 'pg';
import { parseActorKey } from '../../base/actor-key.ts';
import type { Config } from '../../config.ts';
import { requireCorralSchema } from '../../db/postgres/health.ts';
import { waitForSetup } from '../../db/postgres/setup-lock.ts';
import { CorralError, toError } from '../../base/errors.ts';
import { sendOneEvent } from '../../db/send-one.ts';
import { directSend } from '../../queue/direct-send.ts';
import { actorEventJob, type ActorEventJob } from '../../queue/event-job.ts';
import type { Logger } from '../../base/logger.ts';
import { commandLogger, connectDatabase } from '../database.ts';
import { readJsonInput, type JsonSource } from '../event-input.ts';

export interface SendIo {
  out: NodeJS.WritableStream;
  /** Where the command says what it waits for. */
  err: NodeJS.WritableStream;
  stdin: NodeJS.ReadableStream;
}

export async function runSendCommand(config: Config, actor: string, source: JsonSource, io: SendIo): Promise<number> {
  const key = parseActorKey(actor);
  const event = await readJsonInput(source, {
    what: 'event',
    maxBytes: config.maxEventBytes,
    limitName: 'CORRAL_MAX_EVENT_BYTES',
    stdin: io.stdin,
  });
  const job = actorEventJob(key, event, config.maxEventBytes);
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
  let id: string | undefined;
  try {
    // a daemon still setting the database up (the first `npm start`) is waited for, not refused
    await waitForSetup(client, {
      homeDir: config.homeDir,
      timeoutMs: config.setupWaitMs,
      onWait: (message) => io.err.write(`corral: ${message}\n`),
    });
    // before anything is written: a database that is not corral's gets nothing, not even pg-boss
    await requireCorralSchema(client);
    id = await sendOneEvent(client, key.agentUid, key.sessionId, event);
    sent = id !== undefined || (await directSend(client, config.bossSchema, config.queueName, job));
  } finally {
    await client.end().catch(() => undefined);
  }
  if (!sent) await sendWithBoss(url, config, job, logger);
  io.out.write(`${id ?? job.id}\n`);
  return 0;
}

/**
 * The full path, for a corral database whose queue pg-boss has not set up yet (or set up for an
 * older pg-boss): `corral db migrate` installs pg-boss's schema but creates no queue, the daemon
 * creates them on start. Start pg-boss (it migrates, under its advisory lock), create the queues
 * (keeping a daemon's settings), send. A send next to a daemon that is still setting up (corral's
 * schema is in, pg-boss's not yet) races pg-boss's install; the loser retries, and the fixed job
 * id makes a retry unable to enqueue the event twice (a second insert of the same id fails).
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
