/**
 * The outbox's part of the commit step: what a `turn_result` delivers (`deliver: [{ sink, body,
 * key? }]`), checked before any transaction and written by the transaction that commits the turn
 * (src/db/outbox/messages.ts, O1). The delivery loop (src/outbox/sender.ts) sends it afterwards.
 *
 *  X1 A result whose `deliver` breaks the limits (count, body size or depth, key, a key twice for
 *     one sink, a sink that does not exist) is refused `deliver_limit` before any transaction: nothing of it
 *     is written and its attempt fails, as for `emit_limit`.
 *  X2 Each message's `webhook-id` names its actor: `<agent_uid>/<session_id>/<key>`, or without a
 *     key `<agent_uid>/<session_id>/<event_id>.<index in deliver>`: the same on every attempt of
 *     the turn, different for every other turn, and never the same for two actors, so the sink's
 *     de-duplication (and a receiver's, by webhook-id) is per actor, and the signature, which
 *     covers the id, covers the actor.
 *  X3 The body is serialized once, here: the bytes stored are the bytes signed and sent.
 *  X4 A result delivering to a sink whose `agents` do not include the turn's agent is refused
 *     `deliver_forbidden` before any transaction, as X1 is: a tenant's turn cannot speak through
 *     another tenant's sink.
 */
import type { TraceCarrier } from '../base/trace-context.ts';
import type { Db } from '../db/client.ts';
import type { NewOutboxMessage } from '../db/outbox/messages.ts';
import { sinkScopes } from '../db/outbox/sinks.ts';
import { unstorableReason } from '../base/json-safety.ts';
import { agentInScope } from '../base/agent-scope.ts';
import { MAX_DELIVERIES, deliverSchema } from '../fabric/protocol.ts';
import type { Fence } from '../db/turns/fence.ts';

/** One checked outbound message. */
export interface DeliverRequest {
  sink: string;
  /** The request body, as sent (X3). */
  body: string;
  key?: string;
}

/** X1 (all but the sinks' existence): the messages, or why the result must be refused. */
export function checkDeliveries(
  raw: readonly unknown[] | undefined,
  maxBodyBytes: number,
): { ok: true; deliveries: DeliverRequest[] } | { ok: false; detail: string } {
  if (raw === undefined || raw.length === 0) return { ok: true, deliveries: [] };
  if (raw.length > MAX_DELIVERIES) return { ok: false, detail: `${raw.length} deliveries; at most ${MAX_DELIVERIES}` };
  const deliveries: DeliverRequest[] = [];
  const keys = new Set<string>();
  for (const [i, d] of raw.entries()) {
    const parsed = deliverSchema.safeParse(d);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      return { ok: false, detail: `deliver[${i}]: ${issue?.path.join('.') ?? ''} ${issue?.message ?? 'invalid'}` };
    }
    // the shape limits of every stored value (docs/protocol.md §4): a frame cut too deep lands here
    const unstorable = unstorableReason(parsed.data.body ?? null, `$.deliver[${i}].body`);
    if (unstorable) return { ok: false, detail: unstorable };
    const body = JSON.stringify(parsed.data.body ?? null);
    const bytes = Buffer.byteLength(body);
    if (bytes > maxBodyBytes) return { ok: false, detail: `deliver[${i}].body: ${bytes} bytes; at most ${maxBodyBytes}` };
    if (parsed.data.key !== undefined) {
      const k = `${parsed.data.sink}\n${parsed.data.key}`;
      if (keys.has(k)) return { ok: false, detail: `deliver[${i}].key: ${parsed.data.key} is used twice for sink ${parsed.data.sink}` };
      keys.add(k);
    }
    deliveries.push({ sink: parsed.data.sink, body, ...(parsed.data.key === undefined ? {} : { key: parsed.data.key }) });
  }
  return { ok: true, deliveries };
}

/** X2: the `webhook-id` of a message: its actor, then its key or its event and place in the result. */
export function webhookIdOf(actor: { agentUid: string; sessionId: string }, eventId: string, position: number, key?: string): string {
  return `${actor.agentUid}/${actor.sessionId}/${key ?? `${eventId}.${position}`}`;
}

/** The rows a committing turn writes for its messages (X2). */
export function outboxRowsOf(fence: Fence, deliveries: readonly DeliverRequest[], trace?: TraceCarrier): NewOutboxMessage[] {
  return deliveries.map((d, position) => ({
    deliveryId: fence.deliveryId,
    eventId: fence.eventId,
    agentUid: fence.agentUid,
    sessionId: fence.sessionId,
    sink: d.sink,
    webhookId: webhookIdOf(fence, fence.eventId, position, d.key),
    key: d.key ?? null,
    position,
    body: d.body,
    ...(trace ? { trace } : {}),
  }));
}

/** What the sinks a result names say of it: those that do not exist (X1), those whose agents exclude the turn's (X4). */
export interface SinkJudgement {
  missing: string[];
  forbidden: string[];
}

/**
 * X1's last check and X4: the sinks a result names, and the agents each takes. What a sink is
 * found to be is kept for `ttlMs`, so a busy actor asks the database once in a while; a sink
 * removed meanwhile fails the commit itself (the outbox's foreign key), and the attempt is
 * retried. A change of a sink's agents (remove and add again) takes effect within `ttlMs` on
 * every daemon.
 */
export class SinkDirectory {
  private readonly known = new Map<string, { agents: string[] | null; untilMs: number }>();
  private readonly db: Db;
  private readonly nowMs: () => number;
  private readonly ttlMs: number;

  constructor(db: Db, nowMs: () => number, ttlMs = 5_000) {
    this.db = db;
    this.nowMs = nowMs;
    this.ttlMs = ttlMs;
  }

  /** Judges the sinks `names` for a turn of `agentUid`: at most one query, none when every name is known. */
  async judge(agentUid: string, names: readonly string[]): Promise<SinkJudgement> {
    const now = this.nowMs();
    const distinct = [...new Set(names)];
    const ask = distinct.filter((n) => (this.known.get(n)?.untilMs ?? -Infinity) <= now);
    if (ask.length > 0) {
      const found = await sinkScopes(this.db, ask);
      if (this.known.size > 10_000) this.known.clear();
      for (const [n, agents] of found) this.known.set(n, { agents, untilMs: now + this.ttlMs });
      for (const n of ask) if (!found.has(n)) this.known.delete(n);
    }
    const missing: string[] = [];
    const forbidden: string[] = [];
    for (const n of distinct) {
      const sink = this.known.get(n);
      if (!sink) missing.push(n);
      else if (!agentInScope(sink.agents ?? undefined, agentUid)) forbidden.push(n);
    }
    return { missing, forbidden };
  }
}
