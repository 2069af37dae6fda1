/**
 * `corral status [--json]`: queues, activations, workers. `corral actor <agent_uid>/<session_id>
 * [--json]`: one actor's activation, pending events, recent turns and dead letters. Read-only.
 * Also home of the small text-table renderer the operator commands share.
 */
import { formatActorKey, parseActorKey } from '../../base/actor-key.ts';
import { traceIdsOf } from '../../base/trace-context.ts';
import { isUuid } from '../../base/uuid.ts';
import type { Config } from '../../config.ts';
import { CorralError } from '../../base/errors.ts';
import { errorLine } from '../../ops/dead-letters.ts';
import { optionsText } from '../../ops/input-policies.ts';
import { describeDelivery, type TurnDelivery } from '../../outbox/operations.ts';
import { attemptsOfEvent, describeActivation } from '../../ops/actor-state.ts';
import { actorStatus, mergeShardStatus, systemStatus, type SystemStatus } from '../../ops/status.ts';
import { queuesOf } from '../../queue/names.ts';
import { readShardIdentity } from '../../db/shards/catalog.ts';
import { openCommandContext } from '../context.ts';

type Out = NodeJS.WritableStream;

/** Renders rows under headers, columns padded to their widest cell; long cells are cut at `maxCell`. */
export function renderTable(headers: readonly string[], rows: readonly (readonly string[])[], maxCell = 60): string {
  const cut = (s: string) => (s.length > maxCell ? `${s.slice(0, maxCell - 1)}…` : s);
  const cells = rows.map((r) => r.map((c) => cut(c)));
  const widths = headers.map((h, i) => Math.max(h.length, ...cells.map((r) => (r[i] ?? '').length)));
  const line = (r: readonly string[]) =>
    r
      .map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i]!)))
      .join('  ')
      .trimEnd();
  return [line(headers), ...cells.map(line)].map((l) => `${l}\n`).join('');
}

/** `2026-05-01 16:30:35Z` (UTC, second precision); '-' for none. */
export function fmtTime(d: Date | null | undefined): string {
  if (!d) return '-';
  return `${d.toISOString().slice(0, 19).replace('T', ' ')}Z`;
}

/** `950ms`, `12.3s`, `4m05s`, `2h03m`, `3d04h`. */
export function fmtAge(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined) return '-';
  if (seconds < 1) return `${Math.round(seconds * 1000)}ms`;
  if (seconds < 60) return `${seconds.toFixed(1)}s`;
  const pad = (n: number) => String(Math.floor(n)).padStart(2, '0');
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m${pad(seconds % 60)}s`;
  if (seconds < 86_400) return `${Math.floor(seconds / 3600)}h${pad((seconds % 3600) / 60)}m`;
  return `${Math.floor(seconds / 86_400)}d${pad((seconds % 86_400) / 3600)}h`;
}

/** Compact one-line JSON, cut at `max` characters. */
export function oneLine(v: unknown, max = 60): string {
  const s = v === undefined ? '' : JSON.stringify(v);
  return s.length > max ? `${s.slice(0, max - 1)}…` : s;
}

export async function runStatusCommand(config: Config, opts: { json?: boolean }, out: Out): Promise<number> {
  const ctx = await openCommandContext(config, { connections: 1 });
  try {
    const own = await systemStatus(ctx.database.db, queuesOf(config), { defaultStaleMs: config.workerStaleMs });
    // a deployment of several shards: every shard's counts, read one shard at a time
    const identity = await readShardIdentity((text) => ctx.database.pool.query(text));
    const others =
      identity && identity.shardCount > 1
        ? await (
            await import('../../ops/shards.ts')
          ).onOtherShards(ctx.database.pool, ctx.database.url, config, (db, queues) =>
            systemStatus(db.db, queues, { defaultStaleMs: config.workerStaleMs }),
          )
        : undefined;
    const merged = others ? mergeShardStatus([own, ...others]) : undefined;
    const s: SystemStatus = merged ?? own;
    if (opts.json) {
      out.write(`${JSON.stringify({ ...s, deadLetterMode: config.deadLetterMode }, null, 2)}\n`);
      return 0;
    }
    writeDaemons(out, s.daemons);
    const q = s.queue;
    out.write(`queue ${q.name} (dead-letter queue ${q.deadLetterQueue}, mode ${config.deadLetterMode})\n`);
    out.write(
      renderTable(
        ['READY', 'DEFERRED', 'RETRYING', 'ACTIVE', 'FAILED-HELD', 'DEAD-LETTERED'],
        [[q.ready, q.deferred, q.retrying, q.active, q.failedHeld, q.deadLettered].map(String)],
      ),
    );
    out.write(
      `oldest waiting event: ${q.oldestWaitingEventId ? `${q.oldestWaitingEventId} (waiting ${fmtAge(s.oldestWaitingSeconds)})` : 'none'}\n`,
    );
    if (merged) {
      out.write(
        renderTable(
          ['SHARD', 'READY', 'ACTIVE', 'DEAD-LETTERED', 'LIVE ACTIVATIONS', 'BLOCKED'],
          merged.shards.map((x) =>
            [x.shard, x.queue.ready, x.queue.active, x.queue.deadLettered, x.liveActivations, x.blockedActors].map(String),
          ),
        ),
      );
    }
    out.write(`live activations: ${s.liveActivations}\n`);
    out.write(`blocked actors: ${s.blockedActors}${s.blockedActors > 0 ? ' (see `corral dlq list`)' : ''}\n`);
    const ob = s.outbox;
    out.write(
      `outbox: ${ob.pending} pending${ob.pending > 0 ? ` (oldest ${fmtAge(ob.oldestPendingSeconds)})` : ''}, ${ob.dead} dead${ob.dead > 0 ? ' (see `corral outbox list --state dead`)' : ''}\n`,
    );
    if (s.workers.length === 0) {
      out.write('workers: none registered\n');
    } else {
      out.write(`workers: ${s.workers.filter((w) => w.status === 'ready').length} ready of ${s.workers.length}\n`);
      out.write(
        renderTable(
          ['WORKER', 'STATUS', 'CAPACITY', 'IN-FLIGHT', 'LAST HEARTBEAT', 'AGO', 'DAEMON'],
          s.workers.map((w) => [
            w.workerId,
            w.status,
            String(w.capacity),
            String(w.inFlight),
            fmtTime(w.lastHeartbeatAt),
            fmtAge(w.heartbeatAgeSeconds),
            w.ownerId,
          ]),
        ),
      );
    }
    return 0;
  } finally {
    await ctx.close();
  }
}

function writeDaemons(out: Out, daemons: SystemStatus['daemons']): void {
  const running = daemons.filter((d) => d.alive).length;
  out.write(
    `daemons: ${running === 0 ? 'none running' : `${running} running`}${daemons.length > running ? ` (${daemons.length - running} stopped or dead)` : ''}\n`,
  );
  if (daemons.length === 0) return;
  out.write(
    renderTable(
      ['DAEMON', 'STATE', 'HOST', 'PID', 'ENDPOINT', 'STARTED', 'LAST SEEN', 'AGO'],
      daemons.map((d) => [
        d.daemonId,
        d.state,
        d.host,
        String(d.pid),
        d.endpoint,
        fmtTime(d.startedAt),
        fmtTime(d.lastSeenAt),
        fmtAge(d.lastSeenAgeSeconds),
      ]),
    ),
  );
}

const POLICY_FROM = { actor: "the actor's own", agent: "its agent's", default: 'the default, CORRAL_INPUT_POLICY' } as const;

export async function runActorCommand(config: Config, actor: string, opts: { json?: boolean }, out: Out): Promise<number> {
  const key = parseActorKey(actor);
  const ctx = await openCommandContext(config, { connections: 1 });
  try {
    const s = await actorStatus(ctx.database.db, queuesOf(config), key);
    if (!s.known) throw new CorralError('not_found', `actor ${s.actor} is unknown (no events, turns or dead letters)`);
    if (opts.json) {
      out.write(`${JSON.stringify(s, null, 2)}\n`);
      return 0;
    }
    out.write(`actor ${s.actor}\n`);
    out.write(`epoch counter: ${s.epochCounter}\n`);
    out.write(`blocked: ${s.blockedByEventId ? `yes, by dead-lettered event ${s.blockedByEventId}` : 'no'}\n`);
    const policyOptions = optionsText(s.inputPolicy.options);
    out.write(`input policy: ${s.inputPolicy.policy}${policyOptions ? `, ${policyOptions}` : ''} (${POLICY_FROM[s.inputPolicy.from]})\n`);
    const a = s.activation;
    if (a) {
      out.write(`activation: ${describeActivation(a, fmtTime)}, current event ${a.currentEventId ?? 'none'}, daemon ${a.ownerId}\n`);
    } else {
      out.write('activation: none\n');
    }
    out.write(`pending events: ${s.pendingEvents.length}\n`);
    if (s.pendingEvents.length > 0) {
      out.write(
        renderTable(
          ['EVENT', 'STATE', 'ATTEMPT', 'ENQUEUED', 'PAYLOAD'],
          s.pendingEvents.map((p) => [p.id, p.state, String(p.retryCount + 1), fmtTime(p.createdOn), oneLine(p.payload)]),
        ),
      );
    }
    out.write(`recent turns: ${s.recentTurns.length}\n`);
    if (s.recentTurns.length > 0) {
      out.write(
        renderTable(
          ['EVENT', 'ATTEMPT', 'STATUS', 'EPOCH', 'REV', 'WORKER', 'STARTED', 'TRACE', 'EMITTED', 'DELIVERED', 'ERROR'],
          s.recentTurns.map((t) => [
            t.eventId,
            String(t.attempt),
            t.status,
            String(t.epoch),
            String(t.revision),
            t.workerId ?? '-',
            fmtTime(t.startedAt),
            t.traceparent ? traceIdsOf(t.traceparent).traceId : '-',
            emittedLine(t.emitted),
            deliveredLine(t.delivered),
            t.error ? errorLine(t.error) : '',
          ]),
        ),
      );
      // the table has a count per turn; each message's state gets a line of its own
      for (const t of s.recentTurns) {
        for (const d of t.delivered) out.write(`  ${t.eventId} delivered → ${d.sink} (${d.webhookId}): ${describeDelivery(d)}\n`);
      }
    }
    out.write(`dead letters: ${s.deadLetters.length}\n`);
    if (s.deadLetters.length > 0) {
      out.write(
        renderTable(
          ['ID', 'EVENT', 'FAILED', 'ATTEMPTS', 'LAST ERROR'],
          s.deadLetters.map((d) => [d.id, d.eventId, fmtTime(d.failedAt), String(d.attempts), errorLine(d.lastError)]),
        ),
      );
    }
    return 0;
  } finally {
    await ctx.close();
  }
}

/**
 * `corral turn <actor> <event-id>`: every attempt of one event, each with its trace and span
 * (docs/observability.md), its fence and its outcome.
 */
export async function runTurnCommand(config: Config, actor: string, eventId: string, opts: { json?: boolean }, out: Out): Promise<number> {
  const key = parseActorKey(actor);
  if (!isUuid(eventId)) throw new CorralError('invalid_argument', `not an event id (a UUID): ${JSON.stringify(eventId)}`);
  const ctx = await openCommandContext(config, { connections: 1 });
  try {
    const attempts = await attemptsOfEvent(ctx.database.db, key, eventId.toLowerCase());
    if (attempts.length === 0) throw new CorralError('not_found', `actor ${formatActorKey(key)} has no turn of event ${eventId}`);
    if (opts.json) {
      const rows = attempts.map((t) => ({ ...t, ...(t.traceparent ? traceIdsOf(t.traceparent) : {}) }));
      out.write(`${JSON.stringify({ actor: formatActorKey(key), eventId, attempts: rows }, null, 2)}\n`);
      return 0;
    }
    out.write(`event ${eventId} of ${formatActorKey(key)}: ${attempts.length} attempt${attempts.length === 1 ? '' : 's'}\n`);
    out.write(
      renderTable(
        ['ATTEMPT', 'STATUS', 'EPOCH', 'REV', 'WORKER', 'STARTED', 'FINISHED', 'TRACE', 'SPAN', 'ERROR'],
        attempts.map((t) => {
          const ids = t.traceparent ? traceIdsOf(t.traceparent) : undefined;
          return [
            String(t.attempt),
            t.status,
            String(t.epoch),
            String(t.revision),
            t.workerId ?? '-',
            fmtTime(t.startedAt),
            t.finishedAt ? fmtTime(t.finishedAt) : '-',
            ids?.traceId ?? '-',
            ids?.spanId ?? '-',
            t.error ? errorLine(t.error) : '',
          ];
        }),
      ),
    );
    return 0;
  } finally {
    await ctx.close();
  }
}

/** `2 → crm, slack` for a turn's outbox messages (and how many are not delivered), `-` for none. */
function deliveredLine(delivered: readonly TurnDelivery[]): string {
  if (delivered.length === 0) return '-';
  const open = delivered.filter((d) => d.state !== 'delivered').length;
  const text = `${delivered.length} → ${[...new Set(delivered.map((d) => d.sink))].join(', ')}${open ? ` (${open} not delivered)` : ''}`;
  return text.length > 60 ? `${text.slice(0, 59)}…` : text;
}

/** `2 → a/b, c/d` for a turn's emitted events, `-` for none. */
function emittedLine(emitted: unknown): string {
  if (!Array.isArray(emitted) || emitted.length === 0) return '-';
  const actors = emitted.map((e) => String((e as { actor?: unknown }).actor ?? '?'));
  const text = `${emitted.length} → ${[...new Set(actors)].join(', ')}`;
  return text.length > 60 ? `${text.slice(0, 59)}…` : text;
}
