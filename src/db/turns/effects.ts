/**
 * SQL of a turn's durable effects (see src/effects/emit.ts): what a committed turn emitted, and
 * the steering inputs a result did not see. Both run inside the commit transaction, and only for
 * turns that have effects: the hot path of a turn without them runs none of this.
 */
import { sql } from '../orm.ts';
import type { DbOrTx } from '../client.ts';

/** One recorded effect: the event it became. */
export interface EmittedRecord {
  event_id: string;
  actor: string;
  data: unknown;
  delay_ms?: number;
  /** Set when the event carries a steering input the result did not see (docs/protocol.md §9). */
  steer_revision?: number;
}

/** Records on each turn (by delivery) the events it emitted, in ONE statement. */
export async function recordEmittedMany(tx: DbOrTx, rows: readonly { deliveryId: string; emitted: EmittedRecord[] }[]): Promise<void> {
  if (rows.length === 0) return;
  const input = JSON.stringify(rows.map((r) => ({ delivery_id: r.deliveryId, emitted: r.emitted })));
  await tx.execute(sql`
    update corral.turns t set emitted = i.emitted
      from jsonb_to_recordset(${input}::jsonb) as i(delivery_id uuid, emitted jsonb)
     where t.delivery_id = i.delivery_id`);
}

/** The steering inputs recorded on the turns of `deliveryIds` (`[{ revision, input }]`), in ONE statement. */
export async function steersOfMany(
  tx: DbOrTx,
  deliveryIds: readonly string[],
): Promise<Map<string, { revision: number; input: unknown }[]>> {
  if (deliveryIds.length === 0) return new Map();
  const rows = await tx.execute<{ delivery_id: string; steers: { revision: number; input: unknown }[] | null }>(sql`
    select delivery_id, steers from corral.turns
     where delivery_id in (select jsonb_array_elements_text(${JSON.stringify(deliveryIds)}::jsonb)::uuid)`);
  return new Map(rows.rows.map((r) => [r.delivery_id, r.steers ?? []]));
}
