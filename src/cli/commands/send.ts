/**
 * `corral send <agent_uid>/<session_id> '<json>' | --file F | -`: enqueue one event and print
 * its id.
 *
 * The light path: one connection, no Drizzle, no pool, one query to check corral's schema, then
 * the one enqueue every sender runs (src/db/enqueue/send.ts: `corral.send_events`, its checks,
 * event ids and input policies). A database still being set up (a daemon's first start) is waited
 * for (src/db/postgres/setup-lock.ts); one without corral's schema is refused, nothing written.
 */
import pg from 'pg';
import { parseActorKey } from '../../base/actor-key.ts';
import { CorralError } from '../../base/errors.ts';
import { toJsonPayload } from '../../base/json-safety.ts';
import type { Config } from '../../config.ts';
import { requireCorralSchema } from '../../db/postgres/health.ts';
import { waitForSetup } from '../../db/postgres/setup-lock.ts';
import { sendEvents } from '../../db/enqueue/send.ts';
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
  // refused before the database is touched (the one enqueue checks it again, as for every sender)
  toJsonPayload(event, config.maxEventBytes);
  const logger = commandLogger(config);
  let catalogUrl = '';
  const client = await connectDatabase(config, logger, async (url) => {
    catalogUrl = url;
    const client = new pg.Client({ connectionString: url, application_name: 'corral-cli', connectionTimeoutMillis: 10_000 });
    client.on('error', (e) => logger.warn({ err: e.message }, 'database connection error'));
    try {
      await client.connect();
      return client;
    } catch (e) {
      await client.end().catch(() => undefined);
      throw e;
    }
  });
  try {
    // a daemon still setting the database up (the first `npm start`) is waited for, not refused
    await waitForSetup(client, {
      homeDir: config.homeDir,
      timeoutMs: config.setupWaitMs,
      onWait: (message) => io.err.write(`corral: ${message}\n`),
    });
    // before anything is written: a database that is not corral's gets nothing
    await requireCorralSchema(client);
    const events = [{ agentUid: key.agentUid, sessionId: key.sessionId, data: event }];
    const send = (c: pg.ClientBase) => sendEvents(c, events, { maxEventBytes: config.maxEventBytes });
    const [sent] = await send(client).catch(async (e: unknown) => {
      // a deployment of several shards: the catalog takes only shard 0's actors; this one's shard takes it
      if (!(e instanceof CorralError && e.code === 'wrong_shard')) throw e;
      const { connectShardOf } = await import('../../db/shards/shard-pools.ts');
      const shard = await connectShardOf(client, catalogUrl, key, config.bossSchema, 'corral-cli');
      try {
        return await send(shard);
      } finally {
        await shard.end().catch(() => undefined);
      }
    });
    io.out.write(`${sent!.eventId}\n`);
    return 0;
  } finally {
    await client.end().catch(() => undefined);
  }
}
