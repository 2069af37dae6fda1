/**
 * `corral.waitForTurn(eventId)`: the committed turn of one event, heard of through the daemon's
 * notifications (src/db/turns/turn-events.ts), never by polling.
 *
 *  T1 It reads where the event stands, LISTENs on its actor's channel, then reads again: a turn
 *     committed before the LISTEN took effect is found by that second read, one after it is heard.
 *  T2 A lost notification connection is made again and the event read again (nothing is missed).
 *  T3 It settles once: the committed turn (its messages), or a `CorralError`: `dead_lettered`,
 *     `cancelled`, `not_found` (no such event: not sent, its transaction not committed yet, or
 *     gone with the retention), `timeout`, `aborted`, `closed`.
 *  T4 At the deadline the event is read once more before `timeout`: an outcome that no
 *     notification announced yet (a job pg-boss failed by itself, before a daemon's recovery
 *     settled it and said so) is still reported as itself.
 */
import { formatActorKey, parseActorKey } from '../base/actor-key.ts';
import type { Db } from '../db/client.ts';
import type { Queues } from '../db/boss/jobs.ts';
import { committedTurnOf, eventStatus, type EventStatus } from '../db/turns/event-status.ts';
import type { TurnListener, TurnSubscription } from '../db/turns/turn-listener.ts';
import { turnChannelOf, type TurnNotice } from '../db/turns/turn-events.ts';
import { CorralError, toError } from '../base/errors.ts';
import { isUuid } from '../base/uuid.ts';
import { DEFAULT_WAIT_MS, type CommittedTurn, type WaitOptions } from './api.ts';

export { DEFAULT_WAIT_MS };
export type { CommittedTurn, WaitOptions } from './api.ts';

const MAX_TIMER_MS = 2_147_483_647;

export interface WaitDeps {
  db: Db;
  queues: Queues;
  listener: () => TurnListener;
  /** Holds `cancel` (the client's close rejects the wait with it) until the returned function is called. */
  track: (cancel: (e: CorralError) => void) => () => void;
}

export function checkedTimeout(timeoutMs: unknown): number {
  if (timeoutMs === undefined) return DEFAULT_WAIT_MS;
  if (typeof timeoutMs !== 'number' || !Number.isInteger(timeoutMs) || timeoutMs < 1 || timeoutMs > MAX_TIMER_MS) {
    throw new CorralError('invalid_argument', `timeoutMs must be an integer from 1 to ${MAX_TIMER_MS} (got ${String(timeoutMs)})`);
  }
  return timeoutMs;
}

export async function waitForTurn(deps: WaitDeps, eventId: string, opts: WaitOptions = {}): Promise<CommittedTurn> {
  if (typeof eventId !== 'string' || !isUuid(eventId)) {
    throw new CorralError('invalid_argument', `invalid event id ${JSON.stringify(eventId)}: expected a UUID`);
  }
  const id = eventId.toLowerCase();
  const timeoutMs = checkedTimeout(opts.timeoutMs);
  const signal = opts.signal;
  if (signal?.aborted) throw aborted(id, signal);

  return new Promise<CommittedTurn>((resolve, reject) => {
    let settled = false;
    let subscription: TurnSubscription | undefined;
    let reads = Promise.resolve();
    let untrack = () => {};
    const finish = (fn: () => void) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      untrack();
      void subscription?.close().catch(() => undefined);
      fn();
    };
    const fail = (e: CorralError) => finish(() => reject(e));
    const cancel = (e: CorralError) => fail(e);
    const onAbort = () => fail(aborted(id, signal!));
    const timedOut = () =>
      fail(new CorralError('timeout', `no committed turn of event ${id} within ${timeoutMs} ms`, { details: { eventId: id } }));
    // T4: at the deadline, one last read: an outcome no notification told of (pg-boss failing a
    // job by itself, past its heartbeat or expiry) is reported as what it is, not as a timeout
    const timer = setTimeout(() => {
      reads = reads.then(async () => {
        if (settled) return;
        const final = await eventStatus(deps.db, deps.queues, id).catch(() => undefined);
        if (final && !settled && (await judge(final).catch(() => false))) return;
        timedOut();
      });
    }, timeoutMs);
    signal?.addEventListener('abort', onAbort, { once: true });
    untrack = deps.track(cancel);

    const committed = async () => {
      const turn = await committedTurnOf(deps.db, id);
      if (turn) finish(() => resolve(turn));
      return turn !== undefined;
    };
    /** Settles from what the database says; false when the event is still pending. */
    const judge = async (status: EventStatus): Promise<boolean> => {
      switch (status.state) {
        case 'committed':
          return committed();
        case 'cancelled':
          fail(new CorralError('cancelled', `the turn of event ${id} was cancelled`, { details: { eventId: id, actor: status.actor } }));
          return true;
        case 'dead_lettered':
          fail(deadLettered(id, status.actor));
          return true;
        case 'unknown':
          fail(
            new CorralError('not_found', `no event ${id}: not sent, its transaction not committed yet, or gone with the retention`, {
              details: { eventId: id },
            }),
          );
          return true;
        default:
          return false;
      }
    };
    /** One read after another (a notice and a gap may both ask for one). */
    const recheck = () => {
      reads = reads.then(async () => {
        if (settled) return;
        try {
          await judge(await eventStatus(deps.db, deps.queues, id));
        } catch (e) {
          fail(unavailable(id, e));
        }
      });
    };
    const heard = (notices: TurnNotice[]) => {
      for (const n of notices) {
        if (n.eventId !== id || settled) continue;
        if (n.kind === 'committed') {
          reads = reads.then(async () => {
            if (settled) return;
            try {
              if (!(await committed())) recheck();
            } catch (e) {
              fail(unavailable(id, e));
            }
          });
        } else if (n.kind === 'dead_lettered') fail(deadLettered(id, `${n.agentUid}/${n.sessionId}`, n.attempt));
        else if (n.kind === 'cancelled') {
          fail(new CorralError('cancelled', `the turn of event ${id} was cancelled`, { details: { eventId: id, attempt: n.attempt } }));
        }
      }
    };

    void (async () => {
      try {
        const first = await eventStatus(deps.db, deps.queues, id);
        if (settled || (await judge(first)) || settled) return;
        const actor = formatActorKey(parseActorKey(first.actor ?? ''));
        // T1: listen, then read again
        const sub = await deps.listener().subscribe(turnChannelOf(actor), { notices: heard, gap: () => recheck() });
        if (settled) {
          await sub.close();
          return;
        }
        subscription = sub;
        recheck();
      } catch (e) {
        fail(e instanceof CorralError ? e : unavailable(id, e));
      }
    })();
  });
}

function aborted(id: string, signal: AbortSignal): CorralError {
  return new CorralError('aborted', `the wait for event ${id} was aborted`, { cause: signal.reason, details: { eventId: id } });
}

function deadLettered(id: string, actor: string | undefined, attempt?: number): CorralError {
  return new CorralError('dead_lettered', `event ${id} was dead-lettered: its retries are spent (see \`corral dlq show\`)`, {
    details: { eventId: id, actor, ...(attempt === undefined ? {} : { attempts: attempt }) },
  });
}

function unavailable(id: string, e: unknown): CorralError {
  return new CorralError('database_unavailable', `cannot read event ${id}: ${toError(e).message}`, { cause: e });
}
