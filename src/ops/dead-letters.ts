/**
 * Dead-letter operations: list, show, replay, discard.
 *
 * When an event's last attempt fails, pg-boss puts the original job in state `failed` and, in the
 * same transaction, inserts a copy into `<queue>-dlq` (copy id ≠ event id; `source_id` = event id).
 * Dead-letter mode `continue` then deletes the failed original so the actor's later events run;
 * mode `block` keeps it (it holds the actor's key) and sets `actors.blocked_by_event_id`.
 *
 * Invariants:
 *  1. Replay preserves per-actor order. A failed original still in the actor queue is retried in
 *     place (`boss.retry`: it keeps its place at the head of its key). An original that is gone is
 *     re-sent with its ORIGINAL id and singletonKey; several of one actor are re-sent in one
 *     transaction in event-id order (UUIDv7 = enqueue order; pg-boss breaks ties of one
 *     transaction by id), so they run in the order they were first enqueued.
 *  2. Exactly once per dead letter. Each actor's dead letters are handled in one transaction that
 *     first row-locks their copies; the copy is deleted and the action recorded in
 *     `corral.dead_letter_actions` in that same transaction (pg-boss calls run inside it through
 *     `fromDrizzle`). A second replay finds no copy and answers from the record: "already
 *     replayed". Re-sending an id that exists is a no-op in pg-boss (ON CONFLICT DO NOTHING).
 *  3. A block is lifted only by the event that set it (`blocked_by_event_id = event id`).
 */
import { sql } from '../db/orm.ts';
import type { PgBoss } from 'pg-boss';
import type { Db, DbOrTx, Tx } from '../db/client.ts';
import { inTransaction } from '../db/tx.ts';
import { CorralError } from '../base/errors.ts';
import { findDeadLetters, getDeadLetter, jobState, lockDeadLetters, type DeadLetter, type DeadLetterFilter } from '../db/boss/jobs.ts';
import { JOB_STATE } from '../db/boss/internals.ts';
import {
  actionsOnEvent,
  clearBlockIf,
  lastActionsOn,
  recordDeadLetterAction,
  type DeadLetterActionRow,
} from '../db/operations/dead-letter-actions.ts';
import { actorStatus, type ActorStatus } from './status.ts';
import type { Queues } from '../db/boss/jobs.ts';
import { attemptsOfEvent, type TurnView } from '../db/operations/actor-views.ts';
import { isUuid } from '../base/uuid.ts';

export type { DeadLetter, DeadLetterFilter } from '../db/boss/jobs.ts';

/** Throws `invalid_argument` unless `id` looks like a job id (a UUID). */
export function assertJobId(id: string, what = 'dead letter id'): string {
  if (!isUuid(id)) throw new CorralError('invalid_argument', `invalid ${what} ${JSON.stringify(id)}: expected a UUID`);
  return id.toLowerCase();
}

/** One line for a dead letter's (or turn's) error: `code: message`. */
export function errorLine(lastError: unknown): string {
  type ErrorLike = { code?: unknown; message?: unknown };
  const e = lastError as (ErrorLike & { error?: ErrorLike; value?: ErrorLike; kind?: unknown }) | null;
  if (!e || typeof e !== 'object') return lastError ? String(lastError) : '';
  // corral's `{ error: { code, message }, kind }`; pg-boss's own failures `{ value: { message } }`
  const inner: ErrorLike = e.error ?? e.value ?? e;
  const code = typeof inner.code === 'string' ? inner.code : typeof e.kind === 'string' ? e.kind : '';
  const message = typeof inner.message === 'string' ? inner.message : JSON.stringify(inner);
  return (code ? `${code}: ${message}` : message).replace(/\s+/g, ' ').trim();
}

export interface ListOptions {
  limit?: number;
  after?: string;
}

/** A page of dead letters matching `filter`, oldest first. */
export async function listDeadLetters(db: DbOrTx, q: Queues, filter: DeadLetterFilter, opts: ListOptions = {}): Promise<DeadLetter[]> {
  if (opts.after !== undefined) {
    const after = assertJobId(opts.after, '--after id');
    if (!(await getDeadLetter(db, q, after))) {
      throw new CorralError('not_found', `no dead letter ${after} (--after must name a dead letter that still exists)`);
    }
  }
  return findDeadLetters(db, q, filter, {
    ...(opts.limit !== undefined ? { limit: opts.limit } : {}),
    ...(opts.after !== undefined ? { after: opts.after.toLowerCase() } : {}),
  });
}

export interface DeadLetterDetail {
  deadLetter: DeadLetter;
  /** Every attempt's turn for the event, with its error. */
  attempts: TurnView[];
  actor: ActorStatus;
  /** Earlier operator actions on dead letters of the same event. */
  history: DeadLetterActionRow[];
}

export async function showDeadLetter(db: DbOrTx, q: Queues, id: string): Promise<DeadLetterDetail> {
  const dlId = assertJobId(id);
  const deadLetter = await getDeadLetter(db, q, dlId);
  if (!deadLetter) throw await notFoundError(db, dlId);
  const [attempts, actor, history] = await Promise.all([
    attemptsOfEvent(db, { agentUid: deadLetter.agentUid, sessionId: deadLetter.sessionId }, deadLetter.eventId),
    actorStatus(db, q, deadLetter, { turns: 5, pending: 20, deadLetters: 20 }),
    actionsOnEvent(db, deadLetter.eventId),
  ]);
  return { deadLetter, attempts, actor, history };
}

async function notFoundError(db: DbOrTx, id: string): Promise<CorralError> {
  const last = (await lastActionsOn(db, [id])).get(id);
  const why = last ? ` (it was ${last.action === 'replay' ? 'replayed' : 'discarded'} at ${last.actedAt.toISOString()})` : '';
  return new CorralError('not_found', `no dead letter ${id}${why}`);
}

/** What happened to one requested dead letter. */
export type ResultStatus = 'replayed' | 'already_replayed' | 'discarded' | 'already_discarded' | 'not_found';

/**
 * The recorded outcome (`dead_letter_actions.outcome`):
 * - `retried`: the failed original was still queued (mode block) and was retried at its key's head;
 * - `reinserted`: the original was gone (mode continue) and was re-sent with its original id;
 * - `already_queued`: the event was in the queue already (nothing re-sent; the copy was removed);
 * - `already_done`: the event completed meanwhile (nothing re-sent; the copy was removed);
 * - `discarded`, `discarded_with_original`: the copy (and the failed original holding the actor) deleted.
 */
export type ActionOutcome = 'retried' | 'reinserted' | 'already_queued' | 'already_done' | 'discarded' | 'discarded_with_original';

export interface ActionResult {
  id: string;
  status: ResultStatus;
  outcome?: ActionOutcome;
  eventId?: string;
  actor?: string;
  /** The actor's dead-letter block was lifted. */
  unblocked?: boolean;
}

export interface BulkOptions {
  /** Called after each actor's transaction with the number of dead letters handled so far. */
  onProgress?: (done: number, total: number) => void;
}

export interface OpsDeps {
  db: Db;
  boss: PgBoss;
  queues: Queues;
}

/** Every dead letter matching `filter` (for `--all`), oldest first. */
export async function selectDeadLetters(db: DbOrTx, q: Queues, filter: DeadLetterFilter): Promise<DeadLetter[]> {
  return findDeadLetters(db, q, filter);
}

/** Replays dead letters by id; see the module invariants. One result per distinct id, in input order. */
export function replayDeadLetters(deps: OpsDeps, ids: readonly string[], opts: BulkOptions = {}): Promise<ActionResult[]> {
  return actOn(deps, 'replay', ids, opts);
}

/**
 * Discards dead letters by id: deletes the copy and, when the failed original still holds its actor
 * (mode block), the original too, lifting the block. The payload stays in `dead_letter_actions`.
 */
export function discardDeadLetters(deps: OpsDeps, ids: readonly string[], opts: BulkOptions = {}): Promise<ActionResult[]> {
  return actOn(deps, 'discard', ids, opts);
}

async function actOn(deps: OpsDeps, action: 'replay' | 'discard', rawIds: readonly string[], opts: BulkOptions): Promise<ActionResult[]> {
  const ids = [...new Set(rawIds.map((id) => assertJobId(id)))];
  const { db, queues: q } = deps;
  const found = await findDeadLetters(db, q, { ids });
  const results = new Map<string, ActionResult>();

  // Group by actor: one transaction per actor, its dead letters in event-id (enqueue) order.
  const byActor = new Map<string, DeadLetter[]>();
  for (const d of found) {
    const group = byActor.get(d.actor);
    if (group) group.push(d);
    else byActor.set(d.actor, [d]);
  }
  const foundIds = new Set(found.map((d) => d.id));
  const missing = ids.filter((id) => !foundIds.has(id));
  for (const r of await absentResults(db, missing)) results.set(r.id, r);
  let done = missing.length;
  if (done > 0) opts.onProgress?.(done, ids.length);

  for (const group of byActor.values()) {
    const groupResults = await inTransaction(db, async (tx) => {
      const locked = await lockDeadLetters(
        tx,
        q,
        group.map((d) => d.id),
      );
      locked.sort((x, y) => (x.eventId < y.eventId ? -1 : x.eventId > y.eventId ? 1 : 0));
      // Taken by a concurrent replay/discard while we waited for the locks.
      const lockedIds = new Set(locked.map((d) => d.id));
      const out = await absentResults(
        tx,
        group.filter((d) => !lockedIds.has(d.id)).map((d) => d.id),
      );
      for (const d of locked) {
        out.push(action === 'replay' ? await replayOne(deps.boss, tx, q, d) : await discardOne(deps.boss, tx, q, d));
      }
      return out;
    });
    for (const r of groupResults) results.set(r.id, r);
    done += group.length;
    opts.onProgress?.(done, ids.length);
  }
  return ids.map((id) => results.get(id) ?? { id, status: 'not_found' as const });
}

/** Results for ids with no dead letter: answered from the action record (idempotence). */
async function absentResults(db: DbOrTx, ids: string[]): Promise<ActionResult[]> {
  const last = await lastActionsOn(db, ids);
  return ids.map((id) => {
    const a = last.get(id);
    if (!a) return { id, status: 'not_found' as const };
    return {
      id,
      status: a.action === 'replay' ? ('already_replayed' as const) : ('already_discarded' as const),
      outcome: a.outcome as ActionOutcome,
      eventId: a.eventId,
      actor: `${a.agentUid}/${a.sessionId}`,
    };
  });
}

/**
 * pg-boss's adapter that runs its statements in `tx`. pg-boss loads here, at the first replay or
 * discard (whose caller has started a pg-boss by then), not with this module: listing and showing
 * dead letters, and `corral status`, need none of it, and it is ~60 ms of their start-up.
 */
async function bossDb(tx: Tx) {
  const { fromDrizzle } = await import('pg-boss');
  return fromDrizzle(tx, sql);
}

async function replayOne(boss: PgBoss, tx: Tx, q: Queues, d: DeadLetter): Promise<ActionResult> {
  const db = await bossDb(tx);
  const original = await jobState(tx, q.schema, q.events, d.eventId, { lock: true });
  let outcome: ActionOutcome;
  if (original === JOB_STATE.failed) {
    // Mode block: the failed original still holds the actor's key; retrying it keeps its place.
    const res = (await boss.retry(q.events, d.eventId, { db })) as { affected?: number };
    outcome = res.affected === 1 ? 'retried' : 'already_queued';
  } else if (original === undefined) {
    // Mode continue: the original is gone; re-send it under its own id (a repeat is a no-op).
    const id = await boss.send(q.events, d.data, { id: d.eventId, singletonKey: d.actor, db });
    outcome = id === d.eventId ? 'reinserted' : 'already_queued';
  } else {
    outcome = original === JOB_STATE.completed || original === JOB_STATE.cancelled ? 'already_done' : 'already_queued';
  }
  const replayed = outcome === 'retried' || outcome === 'reinserted';
  const unblocked = await closeDeadLetter(boss, tx, q, d, 'replay', outcome, replayed);
  return {
    id: d.id,
    status: replayed ? 'replayed' : 'already_replayed',
    outcome,
    eventId: d.eventId,
    actor: d.actor,
    unblocked,
  };
}

/** The dead letter is done with: its copy goes, its actor is unblocked if it held it, the action is recorded. Returns whether it unblocked. */
async function closeDeadLetter(
  boss: PgBoss,
  tx: Tx,
  q: Queues,
  d: DeadLetter,
  action: 'replay' | 'discard',
  outcome: ActionOutcome,
  replayed: boolean,
): Promise<boolean> {
  await boss.deleteJob(q.deadLetter, d.id, { db: await bossDb(tx) });
  const unblocked = await clearBlockIf(tx, d, d.eventId);
  await recordDeadLetterAction(tx, {
    action,
    deadLetterId: d.id,
    eventId: d.eventId,
    agentUid: d.agentUid,
    sessionId: d.sessionId,
    payload: d.payload,
    outcome,
    replayed,
  });
  return unblocked;
}

async function discardOne(boss: PgBoss, tx: Tx, q: Queues, d: DeadLetter): Promise<ActionResult> {
  const db = await bossDb(tx);
  const original = await jobState(tx, q.schema, q.events, d.eventId, { lock: true });
  let outcome: ActionOutcome = 'discarded';
  if (original === JOB_STATE.failed) {
    // Mode block: the failed original holds the actor; it goes too, so the actor proceeds.
    await boss.deleteJob(q.events, d.eventId, { db });
    outcome = 'discarded_with_original';
  }
  const unblocked = await closeDeadLetter(boss, tx, q, d, 'discard', outcome, false);
  return { id: d.id, status: 'discarded', outcome, eventId: d.eventId, actor: d.actor, unblocked };
}
