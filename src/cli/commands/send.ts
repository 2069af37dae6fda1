/** `corral send <agent_uid>/<session_id> '<json>'`: enqueue one event and print its id. */
import { parseActorKey } from '../../actor-key.ts';
import type { Config } from '../../config.ts';
import { CorralError } from '../../errors.ts';
import { unstorableReason } from '../../json-safety.ts';
import { createEventQueue } from '../../queue/events.ts';
import { openCommandContext } from '../context.ts';

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
  const event = parseJsonArgument(json);
  const ctx = await openCommandContext(config, { needsSchema: false });
  try {
    const boss = await ctx.boss();
    const queue = createEventQueue(boss, config.queueName, { maxEventBytes: config.maxEventBytes });
    const { eventId } = await queue.enqueueActorEvent(ctx.database.db, key, event);
    out.write(`${eventId}\n`);
    return 0;
  } finally {
    await ctx.close();
  }
}
