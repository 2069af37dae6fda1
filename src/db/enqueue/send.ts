/**
 * The one enqueue: every event a producer sends enters corral here, through `corral.send_events`
 * (src/db/enqueue/send-event.ts makes it; its rules E1–E7 are there): the client's `send` and
 * `sendMany`, the HTTP API (through the client), `corral send`, and any language calling the SQL
 * function itself. Light on purpose (no Drizzle unless the caller's handle is Drizzle's), so that
 * `corral send` loads little.
 *
 * Two ways events come in that are not sends, and the send-time rules they skip:
 *  - a turn's `emit` (and a late steer that becomes an event, src/effects/emit.ts) is written by
 *    the turn's own commit: it skips input policies (a committed turn's effect is never refused,
 *    nor held by a debounce: under `coalesce` it is batched when it is fetched) and idempotency
 *    keys (the commit is its exactly-once); its payload limit and actor key are checked before
 *    the commit, as a send checks them;
 *  - a dead letter's replay (src/ops/dead-letters.ts) resumes the same event, with its id and
 *    payload: it is no new event, so no policy, key or limit applies to it again.
 */
import { CorralError, sqlState } from '../../base/errors.ts';
import { toJsonPayload } from '../../base/json-safety.ts';
import type { TraceCarrier } from '../../base/trace-context.ts';
import { runText, type StatementTarget } from '../executor.ts';
import { MAX_SEND_BATCH, SEND_ERRORS } from '../views.ts';

/** One event for `sendEvents`: its data is already JSON (checked by the caller or not: the function checks again). */
export interface EventToSend {
  agentUid: string;
  sessionId: string;
  data: unknown;
  idempotencyKey?: string | undefined;
  /**
   * Whose idempotency key it is (E4): only corral's own role may name one (`token:<name>` for the
   * HTTP API); by default the SQL role the sender logged in as.
   */
  idempotencyScope?: string | undefined;
  /** The sender's trace context, stored with the event (E9): it travels to the turn's worker. */
  trace?: TraceCarrier | undefined;
}

export interface SentEvent {
  eventId: string;
  /** The key had enqueued this event already: nothing was enqueued now. */
  duplicate: boolean;
}

export interface SendOptions {
  /**
   * CORRAL_MAX_EVENT_BYTES of the database's functions: a payload over it is refused here, before
   * a round trip (the function refuses it too). Default: only the function checks the size.
   */
  maxEventBytes?: number;
}

/**
 * Runs `corral.send_events` on `db` (in its transaction, if it is in one), for `events` in order.
 * Each payload is checked first as it will be stored (`toJsonPayload`: storable, and within
 * `maxEventBytes`), so that every sender gets the same refusal, with nothing written.
 */
export async function sendEvents(db: StatementTarget, events: readonly EventToSend[], opts: SendOptions = {}): Promise<SentEvent[]> {
  if (events.length === 0) return [];
  const input = events.map((e, i) => {
    let data: unknown;
    try {
      data = toJsonPayload(e.data, opts.maxEventBytes ?? Number.POSITIVE_INFINITY);
    } catch (err) {
      if (err instanceof CorralError && events.length > 1)
        throw new CorralError(err.code, `event ${i + 1}: ${err.message}`, { cause: err });
      throw err;
    }
    return {
      agent_uid: e.agentUid,
      session_id: e.sessionId,
      data,
      ...(e.idempotencyKey === undefined ? {} : { idempotency_key: e.idempotencyKey }),
      ...(e.idempotencyScope === undefined ? {} : { idempotency_scope: e.idempotencyScope }),
      ...(e.trace === undefined ? {} : { traceparent: e.trace.traceparent, tracestate: e.trace.tracestate ?? null }),
    };
  });
  let rows: Record<string, unknown>[];
  try {
    rows = await runText(db, 'select ord, event_id, duplicate from corral.send_events($1::jsonb) order by ord', [JSON.stringify(input)]);
  } catch (e) {
    throw sendError(e) ?? e;
  }
  if (rows.length !== events.length)
    throw new CorralError('internal', `corral.send_events answered ${rows.length} of ${events.length} events`);
  return rows.map((r) => ({ eventId: String(r.event_id), duplicate: r.duplicate === true || r.duplicate === 't' }));
}

/** A database error of the functions as a `CorralError` (undefined for any other error). */
export function sendError(e: unknown): CorralError | undefined {
  const state = sqlState(e);
  const message = messageOf(e);
  const code = state ? SEND_ERRORS[state] : undefined;
  if (code) return new CorralError(code, message, { cause: e });
  if (state === '42883' && /send_events|next_event_id|insert_event_jobs/.test(message)) {
    return new CorralError(
      'database_unavailable',
      'the database has no corral.send_events yet: start `corral daemon` or run `corral db migrate` (they install it once the queue exists)',
      { cause: e },
    );
  }
  return undefined;
}

/** The driver's message, looking through Drizzle's wrapper (whose own message repeats the statement). */
function messageOf(e: unknown, depth = 0): string {
  const err = e as { message?: unknown; cause?: unknown } | null;
  if (!err || depth > 5) return String(e);
  if (err.cause !== undefined && err.cause !== err && sqlState(err.cause) !== undefined) return messageOf(err.cause, depth + 1);
  return typeof err.message === 'string' ? err.message : String(e);
}

/**
 * `events` in their order, in as many calls of at most MAX_SEND_BATCH as they take (tools and
 * benchmarks filling a queue): each call is atomic, the whole only inside the caller's transaction.
 */
export async function sendEventsInBatches(
  db: StatementTarget,
  events: readonly EventToSend[],
  opts: SendOptions = {},
): Promise<SentEvent[]> {
  const out: SentEvent[] = [];
  for (let i = 0; i < events.length; i += MAX_SEND_BATCH) out.push(...(await sendEvents(db, events.slice(i, i + MAX_SEND_BATCH), opts)));
  return out;
}
