/**
 * `corral transcript <agent_uid>/<session_id> [--json]`: print the transcript: committed turns,
 * and cancelled ones (marked, with the event's user message); under each turn what it emitted and
 * what it delivered to sinks, with how each delivery stands now.
 */
import { formatActorKey, parseActorKey } from '../../base/actor-key.ts';
import type { Config } from '../../config.ts';
import { describeDelivery, transcriptWithDeliveries } from '../../outbox/operations.ts';
import { openCommandContext } from '../context.ts';

function contentText(content: unknown): string {
  if (content && typeof content === 'object' && 'text' in content && typeof content.text === 'string') {
    const rest = Object.fromEntries(Object.entries(content).filter(([k]) => k !== 'text'));
    return Object.keys(rest).length ? `${content.text} ${JSON.stringify(rest)}` : content.text;
  }
  return JSON.stringify(content);
}

export async function runTranscriptCommand(
  config: Config,
  actor: string,
  opts: { json?: boolean },
  out: NodeJS.WritableStream,
): Promise<number> {
  const key = parseActorKey(actor);
  const ctx = await openCommandContext(config, { connections: 1 });
  try {
    const turns = await transcriptWithDeliveries(ctx.database.db, key);
    if (opts.json) {
      out.write(`${JSON.stringify({ actor: formatActorKey(key), turns }, null, 2)}\n`);
      return 0;
    }
    if (turns.length === 0) {
      out.write(`no committed turns for ${formatActorKey(key)}\n`);
      return 0;
    }
    for (const t of turns) {
      const cancelled =
        t.status === 'cancelled'
          ? ` cancelled: ${t.cancelReason ?? 'cancelled'}`
          : t.status === 'interrupted'
            ? ' interrupted (its events are in the next turn)'
            : '';
      out.write(`── turn ${t.eventId}${cancelled} (epoch ${t.actorEpoch}, revision ${t.revision}, ${t.finishedAt?.toISOString() ?? ''})\n`);
      for (const m of t.messages) out.write(`  ${String(m.seq).padStart(4)} ${m.role.padEnd(9)} ${contentText(m.content)}\n`);
      for (const e of t.emitted) {
        const what = e.steer_revision !== undefined ? `steer (revision ${e.steer_revision}) as next event` : `emitted`;
        const delay = e.delay_ms ? ` after ${e.delay_ms} ms` : '';
        out.write(`       ${what} → ${e.actor}${delay}: ${contentText(e.data)} (event ${e.event_id})\n`);
      }
      for (const d of t.delivered) out.write(`       delivered → ${d.sink} (${d.webhookId}): ${describeDelivery(d)}\n`);
    }
    return 0;
  } finally {
    await ctx.close();
  }
}
