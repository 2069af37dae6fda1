/** `corral steer <actor> '<json>' | --file F | -` and `corral cancel <actor>`: act on an actor's live turn. */
import { formatActorKey, parseActorKey } from '../../base/actor-key.ts';
import type { Config } from '../../config.ts';
import { MAX_STEERING_BYTES } from '../../db/turns/control.ts';
import { cancelTurn, steerTurn } from '../../ops/turn-control.ts';
import { openCommandContext, type CommandContext } from '../context.ts';
import { readJsonInput, type JsonSource } from '../event-input.ts';

async function withContext<T>(config: Config, fn: (ctx: CommandContext) => Promise<T>): Promise<T> {
  const ctx = await openCommandContext(config);
  try {
    return await fn(ctx);
  } finally {
    await ctx.close();
  }
}

export async function runSteerCommand(
  config: Config,
  actor: string,
  source: JsonSource,
  io: { out: NodeJS.WritableStream; stdin: NodeJS.ReadableStream },
): Promise<number> {
  const key = parseActorKey(actor);
  const input = await readJsonInput(source, { what: 'steering input', maxBytes: MAX_STEERING_BYTES, stdin: io.stdin });
  const fence = await withContext(config, (ctx) => steerTurn({ db: ctx.database.db }, key, input));
  io.out.write(`steered ${formatActorKey(key)}: event ${fence.eventId} now at revision ${fence.revision}\n`);
  return 0;
}

export async function runCancelCommand(
  config: Config,
  actor: string,
  opts: { reason?: string },
  out: NodeJS.WritableStream,
): Promise<number> {
  const key = parseActorKey(actor);
  const reason = opts.reason ?? 'cancelled by operator';
  const fence = await withContext(config, async (ctx) =>
    cancelTurn({ db: ctx.database.db, boss: await ctx.boss(), queueName: config.queueName }, key, reason),
  );
  out.write(`cancelled the turn of ${formatActorKey(key)} for event ${fence.eventId} (epoch ${fence.actorEpoch})\n`);
  return 0;
}
