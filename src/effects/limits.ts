/**
 * What a `turn_result` may carry besides its messages: durable effects (`emit`: events enqueued
 * with the commit) and outbound messages (`deliver`: the outbox), their limits, and the check
 * that every stored value of a result can be stored. Re-exported by protocol.ts.
 */
import { z } from 'zod';
import { unstorableReason } from '../base/json-safety.ts';
import { jsonValueSchema as json } from '../base/json-value.ts';

/** Most effects (`emit` entries) one `turn_result` may carry. */
export const MAX_EMITS = 32;
/** Longest delay of an emitted event (`delay_ms`): 30 days. */
export const MAX_EMIT_DELAY_MS = 30 * 86_400_000;
/** Most outbound messages (`deliver` entries) one `turn_result` may carry. */
export const MAX_DELIVERIES = 16;
/** A `deliver[].key` (the message's `webhook-id`): 1–256 printable ASCII characters, no space. */
export const DELIVER_KEY_PATTERN = /^[\x21-\x7e]{1,256}$/;

/**
 * One durable effect of a turn: an event for `actor` (`agent/session`; the turn's own actor too,
 * e.g. a timer with `delay_ms`), enqueued in the transaction that commits the turn. The daemon
 * checks the actor key, the size of `data` (CORRAL_MAX_EVENT_BYTES) and the delay; a result
 * breaking them is rejected `emit_limit`.
 */
export const emitSchema = z.object({
  actor: z.string().min(1).max(300),
  data: json,
  delay_ms: z.int().min(0).max(MAX_EMIT_DELAY_MS).optional(),
});
export type Emit = z.infer<typeof emitSchema>;

/**
 * One outbound message of a turn (the outbox, docs/protocol.md §5.4): `body` is POSTed to the sink
 * named `sink` as JSON once the turn has committed, signed, with `key` (or one derived from the
 * event) as its `webhook-id`. The daemon checks the sink exists, the size of `body`
 * (CORRAL_MAX_EVENT_BYTES) and the key; a result breaking them is rejected `deliver_limit`.
 */
export const deliverSchema = z.object({
  sink: z.string().regex(/^[A-Za-z0-9._-]{1,64}$/),
  body: json,
  key: z.string().regex(DELIVER_KEY_PATTERN).optional(),
});
export type Deliver = z.infer<typeof deliverSchema>;

/**
 * Why a result's stored values (each message's `content`, the `output`, and with `emit`, each
 * entry's `data`) cannot be stored: nested deeper than MAX_JSON_DEPTH or holding what jsonb
 * cannot keep (src/base/json-safety.ts). Names the field and the path of the first offender; null
 * when every value can be stored. Each value is walked once.
 */
export function resultValuesProblem(result: {
  messages: readonly { content?: unknown }[];
  output?: unknown;
  emit?: readonly unknown[] | undefined;
  deliver?: readonly unknown[] | undefined;
}): { field: 'messages' | 'output' | 'emit' | 'deliver'; why: string } | null {
  for (let i = 0; i < result.messages.length; i++) {
    const why = unstorableReason(result.messages[i]?.content ?? null, `$.messages[${i}].content`);
    if (why) return { field: 'messages', why };
  }
  if (result.output !== undefined) {
    const why = unstorableReason(result.output, '$.output');
    if (why) return { field: 'output', why };
  }
  for (let i = 0; i < (result.emit?.length ?? 0); i++) {
    const e = result.emit![i];
    const why = unstorableReason(e !== null && typeof e === 'object' ? (e as { data?: unknown }).data : null, `$.emit[${i}].data`);
    if (why) return { field: 'emit', why };
  }
  for (let i = 0; i < (result.deliver?.length ?? 0); i++) {
    const d = result.deliver![i];
    const why = unstorableReason(d !== null && typeof d === 'object' ? (d as { body?: unknown }).body : null, `$.deliver[${i}].body`);
    if (why) return { field: 'deliver', why };
  }
  return null;
}
