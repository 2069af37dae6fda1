/**
 * Control notifications (steer, cancel) from any process to the daemon that holds the turn's
 * worker connection. Sent with pg_notify inside the transaction that changed the rows, so the
 * daemon hears of a change only once it is committed.
 */
import { sql } from '../orm.ts';
import type { DbOrTx } from '../client.ts';
import type { Fence } from './fence.ts';

export const CONTROL_CHANNEL = 'corral_control';

/**
 * `interrupt`: an event (`eventId`) was sent to an actor whose input policy is `interrupt`
 * (src/db/enqueue/send-event.ts E7): the daemon running the actor's turn interrupts it, unless the turn
 * takes that event already.
 */
export type ControlMessage =
  | { kind: 'steer'; fence: Fence; input: unknown }
  | { kind: 'cancel'; fence: Fence; reason: string }
  | { kind: 'interrupt'; agentUid: string; sessionId: string; eventId: string };

/** NOTIFY payloads are limited to 8000 bytes; larger steering input travels by reference. */
export const MAX_NOTIFY_BYTES = 7_900;

/** Largest steering input (its JSON): the notification carries it with its fence, within MAX_NOTIFY_BYTES. */
export const MAX_STEERING_BYTES = MAX_NOTIFY_BYTES - 1_000;

export async function notifyControl(tx: DbOrTx, msg: ControlMessage): Promise<void> {
  await tx.execute(sql`select pg_notify(${CONTROL_CHANNEL}, ${JSON.stringify(msg)})`);
}

export function parseControl(payload: string): ControlMessage | undefined {
  try {
    const m = JSON.parse(payload) as ControlMessage;
    if (m && m.kind === 'interrupt') {
      return typeof m.agentUid === 'string' && typeof m.sessionId === 'string' && typeof m.eventId === 'string' ? m : undefined;
    }
    return m && (m.kind === 'steer' || m.kind === 'cancel') && m.fence ? m : undefined;
  } catch {
    return undefined;
  }
}
