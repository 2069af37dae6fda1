/**
 * The outbox, the operator's use-cases (`corral outbox list | show | replay | discard`, the
 * client's `outbox`), and what each turn delivered as `corral transcript` and `corral actor` show it.
 *
 *  - Every input is checked before the database is touched: states, a sink name, an actor or an
 *    agent, ids, limits (`invalid_argument`, `invalid_actor_key`).
 *  - A replay takes dead or discarded messages, a discard pending or dead ones; either names
 *    messages by id, or takes every one a query matches only with `all` (a query alone is refused:
 *    a forgotten id must not widen into a bulk action). A discarded message keeps its row and can
 *    be replayed, so `all` is the whole confirmation.
 *  - A replayed message keeps its `webhook-id`: a receiver that had it after all drops it again.
 */
import { actorKey, formatActorKey, isValidActorPart, parseActorKey, type ActorKey } from '../base/actor-key.ts';
import type { DbOrTx } from '../db/client.ts';
import { discardOutbox, listOutbox, outboxOfTurns, replayOutbox, type OutboxFilter, type OutboxRow } from '../db/outbox/messages.ts';
import { listSinks } from '../db/outbox/sinks.ts';
import { readTranscript, type TranscriptEntry } from '../db/turns/transcript.ts';
import {
  OUTBOX_STATES,
  type OutboxActionResult,
  type OutboxListOptions,
  type OutboxMessage,
  type OutboxMessageDetail,
  type OutboxPage,
  type OutboxQuery,
  type OutboxState,
  type OutboxTarget,
  type TurnDelivery,
} from '../db/views.ts';
import { CorralError } from '../base/errors.ts';
import { parseSinkName } from './sinks.ts';

export type {
  OutboxActionResult,
  OutboxListOptions,
  OutboxMessage,
  OutboxMessageDetail,
  OutboxPage,
  OutboxQuery,
  OutboxTarget,
  TurnDelivery,
} from '../db/views.ts';

export const DEFAULT_OUTBOX_LIMIT = 50;
export const MAX_OUTBOX_LIMIT = 1_000;
/** Most ids one replay or discard names. */
export const MAX_OUTBOX_IDS = 1_000;
/** A bulk action updates this many messages per statement, so that no statement locks a whole backlog at once. */
const BULK_BATCH = 500;

/** The states an action takes. */
const TAKES: Record<OutboxActionResult['action'], readonly OutboxState[]> = {
  replay: ['dead', 'discarded'],
  discard: ['pending', 'dead'],
};

/** States as given: each item a state or a comma list of them (`--state dead,discarded --state pending`). */
export function parseOutboxStates(items: readonly string[]): OutboxState[] {
  const states = new Set<OutboxState>();
  for (const item of items) {
    for (const part of String(item).split(',')) {
      const s = part.trim();
      if (!(OUTBOX_STATES as readonly string[]).includes(s)) {
        throw new CorralError('invalid_argument', `a state is one of ${OUTBOX_STATES.join(', ')}, not ${JSON.stringify(s.slice(0, 40))}`);
      }
      states.add(s as OutboxState);
    }
  }
  return [...states];
}

/** A message id: a positive integer (as text from a command line, or a number). */
export function parseOutboxId(v: unknown, what = 'a message id'): number {
  const n = typeof v === 'number' ? v : typeof v === 'string' && /^[0-9]{1,16}$/.test(v.trim()) ? Number(v.trim()) : NaN;
  if (!Number.isSafeInteger(n) || n < 1) {
    throw new CorralError(
      'invalid_argument',
      `${what} is a positive integer (an id from corral outbox list), not ${JSON.stringify(String(v).slice(0, 40))}`,
    );
  }
  return n;
}

function actorOf(v: string | ActorKey): ActorKey {
  if (typeof v === 'string') return parseActorKey(v);
  if (v !== null && typeof v === 'object') return actorKey(v.agentUid, v.sessionId);
  throw new CorralError('invalid_actor_key', 'an actor is "agent_uid/session_id" or { agentUid, sessionId }');
}

/** The database's filter of a query, every part checked. */
export function outboxFilterOf(q: OutboxQuery): OutboxFilter {
  if (q === null || typeof q !== 'object') throw new CorralError('invalid_argument', 'an outbox query is an object');
  const filter: OutboxFilter = {};
  if (q.states !== undefined) {
    if (!Array.isArray(q.states)) throw new CorralError('invalid_argument', 'states is an array of outbox states');
    const states = parseOutboxStates(q.states as readonly string[]);
    if (states.length > 0) filter.states = states;
  }
  if (q.sink !== undefined) filter.sink = parseSinkName(q.sink);
  if (q.actor !== undefined && q.agent !== undefined) {
    throw new CorralError('invalid_argument', 'give an actor or an agent, not both');
  }
  if (q.actor !== undefined) {
    const key = actorOf(q.actor);
    filter.agentUid = key.agentUid;
    filter.sessionId = key.sessionId;
  }
  if (q.agent !== undefined) {
    if (typeof q.agent !== 'string' || !isValidActorPart(q.agent)) {
      throw new CorralError(
        'invalid_argument',
        `an agent is 1-128 characters of A-Z a-z 0-9 . _ : @ -, not ${JSON.stringify(String(q.agent).slice(0, 80))}`,
      );
    }
    filter.agentUid = q.agent;
  }
  return filter;
}

/** Whether a query narrows anything (a bulk action's plan says so). */
export const isNarrowed = (f: OutboxFilter): boolean =>
  f.states !== undefined || f.sink !== undefined || f.agentUid !== undefined || f.sessionId !== undefined;

const iso = (d: Date | null): string | null => d?.toISOString() ?? null;

export function deliveryOf(r: OutboxRow): TurnDelivery {
  return {
    id: r.id,
    sink: r.sink,
    webhookId: r.webhookId,
    state: r.state,
    attempts: r.attempts,
    lastStatus: r.lastStatus,
    lastError: r.lastError,
    nextAttemptAt: r.nextAttemptAt.toISOString(),
    deliveredAt: iso(r.deliveredAt),
  };
}

function messageOf(r: OutboxRow): OutboxMessage {
  return {
    ...deliveryOf(r),
    actor: formatActorKey({ agentUid: r.agentUid, sessionId: r.sessionId }),
    turnId: r.turnId,
    eventId: r.eventId,
    position: r.position,
    claimedBy: r.claimedBy,
    claimedUntil: iso(r.claimedUntil),
    createdAt: r.createdAt.toISOString(),
  };
}

/** A page of messages, newest first; `next` continues it. */
export async function listOutboxMessages(db: DbOrTx, opts: OutboxListOptions = {}): Promise<OutboxPage> {
  const filter = outboxFilterOf(opts);
  const limit = opts.limit ?? DEFAULT_OUTBOX_LIMIT;
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_OUTBOX_LIMIT) {
    throw new CorralError('invalid_argument', `a limit is 1 to ${MAX_OUTBOX_LIMIT}, not ${String(limit)}`);
  }
  if (opts.before !== undefined) filter.beforeId = parseOutboxId(opts.before, 'before');
  const rows = await listOutbox(db, filter, limit);
  return { messages: rows.map(messageOf), next: rows.length === limit ? rows.at(-1)!.id : null };
}

/** One message with its body; `not_found` when there is none. */
export async function showOutboxMessage(db: DbOrTx, id: number | string): Promise<OutboxMessageDetail> {
  const n = parseOutboxId(id);
  const [row] = await listOutbox(db, { ids: [n] }, 1);
  if (!row) throw new CorralError('not_found', `no outbox message ${n}`);
  return { ...messageOf(row), body: row.body };
}

/** Replays (dead or discarded → pending, same webhook-id) or discards (pending or dead → discarded) messages. */
export async function actOnOutbox(db: DbOrTx, action: OutboxActionResult['action'], target: OutboxTarget): Promise<OutboxActionResult> {
  if (target === null || typeof target !== 'object')
    throw new CorralError('invalid_argument', `${action} takes { ids } or { all: true, … }`);
  const takes = TAKES[action];
  const run = action === 'replay' ? replayOutbox : discardOutbox;
  const result: OutboxActionResult = { action, done: [], skipped: [], notFound: [], disabledSinks: [] };
  let sinks = new Set<string>();
  if ('ids' in target && target.ids !== undefined) {
    if ((target as { all?: unknown }).all !== undefined) throw new CorralError('invalid_argument', 'give ids or all, not both');
    if (!Array.isArray(target.ids) || target.ids.length === 0 || target.ids.length > MAX_OUTBOX_IDS) {
      throw new CorralError('invalid_argument', `ids is an array of 1 to ${MAX_OUTBOX_IDS} message ids`);
    }
    const ids = [...new Set(target.ids.map((id) => parseOutboxId(id)))];
    const done = await run(db, { ids, states: takes }, ids.length);
    result.done = done.map((d) => d.id);
    sinks = new Set(done.map((d) => d.sink));
    const left = ids.filter((id) => !result.done.includes(id));
    if (left.length > 0) {
      const found = new Map((await listOutbox(db, { ids: left }, left.length)).map((r) => [r.id, r.state]));
      for (const id of left) {
        const state = found.get(id);
        if (state === undefined) result.notFound.push(id);
        else result.skipped.push({ id, state });
      }
    }
  } else {
    if ((target as { all?: unknown }).all !== true) {
      throw new CorralError(
        'invalid_argument',
        `nothing to ${action}: give message ids, or all (optionally narrowed by states, sink, actor or agent)`,
      );
    }
    const filter = outboxFilterOf(target as OutboxQuery);
    const wrong = filter.states?.filter((s) => !takes.includes(s)) ?? [];
    if (wrong.length > 0) {
      throw new CorralError('invalid_argument', `${action} takes ${takes.join(' or ')} messages, not ${wrong.join(', ')}`);
    }
    filter.states ??= [...takes];
    // each batch leaves the states it takes, so the loop ends even while new messages arrive
    for (;;) {
      const done = await run(db, filter, BULK_BATCH);
      for (const d of done) {
        result.done.push(d.id);
        sinks.add(d.sink);
      }
      if (done.length < BULK_BATCH) break;
    }
  }
  if (action === 'replay' && sinks.size > 0) {
    result.disabledSinks = (await listSinks(db)).filter((s) => s.disabledAt !== null && sinks.has(s.name)).map((s) => s.name);
  }
  return result;
}

/** What each of `turnIds` delivered, in order: one statement for any number of turns. */
export async function deliveriesOfTurns(db: DbOrTx, turnIds: readonly string[]): Promise<Map<string, TurnDelivery[]>> {
  const byTurn = new Map<string, TurnDelivery[]>();
  for (const r of await outboxOfTurns(db, [...new Set(turnIds)])) {
    const list = byTurn.get(r.turnId) ?? [];
    list.push(deliveryOf(r));
    byTurn.set(r.turnId, list);
  }
  return byTurn;
}

/** The transcript of `key` (src/db/turns/transcript.ts), each turn with what it delivered: one statement more than the transcript alone, whatever its length. */
export async function transcriptWithDeliveries(db: DbOrTx, key: ActorKey): Promise<(TranscriptEntry & { delivered: TurnDelivery[] })[]> {
  const turns = await readTranscript(db, key);
  const delivered = await deliveriesOfTurns(
    db,
    turns.map((t) => t.turnId),
  );
  return turns.map((t) => ({ ...t, delivered: delivered.get(t.turnId) ?? [] }));
}

/** The last answer of an attempt, as a person reads it: `HTTP 503`, or the error (a timeout, a refused connection). */
export function lastAnswer(d: Pick<TurnDelivery, 'lastStatus' | 'lastError'>): string {
  if (d.lastStatus !== null) return `HTTP ${d.lastStatus}`;
  return d.lastError ? (d.lastError.length > 80 ? `${d.lastError.slice(0, 79)}…` : d.lastError) : '-';
}

/** How one delivery stands, in a line: `delivered after 1 attempt`, `pending (attempt 2, last: HTTP 503)`, `dead: HTTP 410`. */
export function describeDelivery(d: TurnDelivery): string {
  const attempts = `${d.attempts} attempt${d.attempts === 1 ? '' : 's'}`;
  switch (d.state) {
    case 'delivered':
      return `delivered after ${attempts}`;
    case 'pending':
      return d.attempts === 0 ? 'pending (not sent yet)' : `pending (attempt ${d.attempts}, last: ${lastAnswer(d)})`;
    case 'dead':
      return `dead after ${attempts}: ${lastAnswer(d)}`;
    case 'discarded':
      return `discarded after ${attempts}${d.lastStatus !== null || d.lastError ? ` (last: ${lastAnswer(d)})` : ''}`;
  }
}
