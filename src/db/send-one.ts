/**
 * One event through `corral.send_event` on a plain pg client, for `corral send`: the enqueue every
 * sender runs (src/db/enqueue/send-event.ts), without loading Drizzle for the statement.
 */
import type pg from 'pg';
import { sqlState } from '../base/errors.ts';

/** The new event's id, or undefined when the database has no `corral.send_event` yet (nothing written). */
export async function sendOneEvent(client: pg.Client, agentUid: string, sessionId: string, data: unknown): Promise<string | undefined> {
  try {
    const { rows } = await client.query<{ id: string }>('select corral.send_event($1, $2, $3::jsonb) as id', [
      agentUid,
      sessionId,
      JSON.stringify(data),
    ]);
    return rows[0]!.id;
  } catch (e) {
    if (sqlState(e) === '42883') return undefined;
    // loaded only to explain a refusal: it brings Drizzle with it
    const { sendError } = await import('./enqueue/send-event.ts');
    throw sendError(e) ?? e;
  }
}
