/**
 * The outbox's part of the commit step: what a `turn_result` delivers (`deliver: [{ sink, body,
 * key? }]`), checked before any transaction and written by the transaction that commits the turn
 * (src/db/outbox/messages.ts, O1). The delivery loop (outbox-sender.ts) sends it afterwards.
 *
 *  X1 A result whose `deliver` breaks the limits (count, body size or depth, key, a key twice for
 *     one sink, a sink that does not exist) is refused `deliver_limit` before any transaction: nothing of it
 *     is written and its attempt fails, as for `emit_limit`.
 *  X2 Each message's `webhook-id` is its `key`, or derived from the event and its place in the
 *     result: the same on every attempt of the turn, and different for every other turn.
 *  X3 The body is serialized once, here: the bytes stored are the bytes signed and sent.
 */
import type { Db } from '../db/client.ts';
import type { NewOutboxMessage } from '../db/outbox/messages.ts';
import { existingSinkNames } from '../db/outbox/sinks.ts';
import { unstorableReason } from '../base/json-safety.ts';
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

/** X2: the `webhook-id` of a message with no key. */
export function derivedWebhookId(eventId: string, position: number): string {
  return `msg_${eventId.replaceAll('-', '')}_${position}`;
}

/** The rows a committing turn writes for its messages (X2). */
export function outboxRowsOf(fence: Fence, deliveries: readonly DeliverRequest[]): NewOutboxMessage[] {
  return deliveries.map((d, position) => ({
    deliveryId: fence.deliveryId,
    eventId: fence.eventId,
    agentUid: fence.agentUid,
    sessionId: fence.sessionId,
    sink: d.sink,
    webhookId: d.key ?? derivedWebhookId(fence.eventId, position),
    position,
    body: d.body,
  }));
}

/**
 * X1's last check: which sinks a result names that do not exist. Names seen to exist are kept
 * for `ttlMs`, so a busy actor asks the database once in a while; a sink removed meanwhile fails
 * the commit itself (the outbox's foreign key), and the attempt is retried.
 */
export class SinkNames {
  private readonly known = new Map<string, number>();
  private readonly db: Db;
  private readonly nowMs: () => number;
  private readonly ttlMs: number;

  constructor(db: Db, nowMs: () => number, ttlMs = 5_000) {
    this.db = db;
    this.nowMs = nowMs;
    this.ttlMs = ttlMs;
  }

  async missing(names: readonly string[]): Promise<string[]> {
    const now = this.nowMs();
    const ask = [...new Set(names)].filter((n) => (this.known.get(n) ?? -Infinity) <= now);
    if (ask.length === 0) return [];
    const found = await existingSinkNames(this.db, ask);
    if (this.known.size > 10_000) this.known.clear();
    for (const n of found) this.known.set(n, now + this.ttlMs);
    return ask.filter((n) => !found.has(n));
  }
}
