/**
 * The runtime's invariants, checked FROM THE DATABASE ONLY (rows typed by src/db/schema.ts, live
 * states from its constants), given the list of events that were enqueued.
 *
 * A turn takes a BATCH: its own event (`turns.event_id`, the head) and, under a batching input
 * policy (`coalesce`, src/db/turns/batches.ts), the actor's events queued behind it (`turns.coalesced`,
 * in order; null for a turn of one event, as under `queue`). An event is COMMITTED by the
 * succeeded turn whose batch holds it, as its head or as a member.
 *
 *  I1 every event is committed exactly once (the head of one succeeded turn or a member of one,
 *     never both, never twice) or is in the dead-letter queue, never both, never lost. A
 *     succeeded turn's messages are written once: a `user` message per event of its batch, in
 *     order, then the worker's reply to the batch; every job of the batch is completed (the
 *     head's at the turn's attempt). A dead-lettered head's batch is dead-lettered whole. A retry
 *     takes no event its earlier attempt did not. A batch is one actor's, at most its policy's
 *     `max_events`, and only under a batching policy;
 *  I2 per actor, committed events appear in the transcript in enqueue order (UUIDv7 order),
 *     across turns and within each batch, skipping only dead-lettered ones; message seqs are
 *     gapless;
 *  I3 no transcript row was written under a stale fence: each succeeded turn equals the delivery
 *     (batch included) and activation it committed under, no later attempt / newer epoch exists
 *     for any event of its batch, a committed member never ran as a head, and no message belongs
 *     to a turn that did not succeed;
 *  I4 never two live activations for one actor: the partial unique index exists, epochs are unique
 *     per actor and strictly increase with creation time, and never exceed the durable counter.
 *
 * The example worker (`corral worker`) fails a turn whose FIRST event says `fail: true`: such an
 * event dead-letters when it heads its batch (and its batch's other events with it), and commits
 * like any other when it is a later member of a batch.
 *
 * Used by the chaos runner after every scenario and by in-process tests (any database whose
 * events were enqueued through the event queue: pass the events with their ids).
 */
import { isDeepStrictEqual } from 'node:util';
import type pg from 'pg';
import { DEFAULTS } from '../../src/config.ts';
import type { Db } from '../../src/db/client.ts';
import { defaultInputPolicy, listInputPolicies, type InputPolicyRow } from '../../src/db/enqueue/input-policies.ts';
import { activations, actors, conversations, deliveries, messages, turns } from '../../src/db/schema.ts';
import { DEFAULT_BATCH_EVENTS, type InputPolicy } from '../../src/db/views.ts';
import { queuesOf } from '../../src/queue/boss.ts';
import type { ChaosTimings } from './environment.ts';
import type { ActorRef } from './plan.ts';

import {
  type TurnRow,
  UNIQUE_INDEXES,
  type CheckedEvent,
  type CheckOptions,
  echoes,
  type InvariantId,
  type Violation,
  type CheckResult,
  keyOf,
  isLiveActivation,
  isLiveDelivery,
  isBatching,
  groupBy,
  batchOf,
  byStart,
} from './invariant-parts.ts';

export type { CheckedEvent, CheckOptions, InvariantId, Violation, CheckSummary, CheckResult } from './invariant-parts.ts';

export async function checkInvariants(db: Db, plan: CheckedEvent[], opts: CheckOptions = {}): Promise<CheckResult> {
  const queue = opts.queues ?? queuesOf(DEFAULTS);
  const replyMatches = opts.replyMatches ?? echoes;
  const v: Violation[] = [];
  const add = (invariant: InvariantId, code: string, message: string, details?: unknown) =>
    v.push({ invariant, code, message, ...(details !== undefined ? { details } : {}) });

  const turnRows = await db.select().from(turns);
  const messageRows = await db.select().from(messages);
  const deliveryRows = await db.select().from(deliveries);
  const activationRows = await db.select().from(activations);
  const conversationRows = await db.select().from(conversations);
  const actorRows = await db.select().from(actors);
  const policyRows = await listInputPolicies(db);
  const fallbackPolicy = await defaultInputPolicy(db);
  // pg-boss's tables and the catalogue are not part of corral's schema.
  const q = async <T extends pg.QueryResultRow>(text: string, params: unknown[] = []) => (await db.$client.query<T>(text, params)).rows;
  const jobs = await q<{ id: string; state: string; retry_count: number; singleton_key: string | null }>(
    `select id, state, retry_count, singleton_key from pgboss.job where name = $1`,
    [queue.events],
  );
  const dlq = await q<{
    id: string;
    source_id: string | null;
    data: { payload?: unknown; agentUid?: string; sessionId?: string } | null;
    singleton_key: string | null;
  }>(`select id, source_id, data, singleton_key from pgboss.job where name = $1`, [queue.deadLetter]);
  const indexes = await q<{ indexname: string; indexdef: string }>(
    `select indexname, indexdef from pg_indexes where schemaname = 'corral' and indexname = any($1::text[])`,
    [UNIQUE_INDEXES],
  );
  const planned = plan.filter((e) => e.id);
  if (planned.length !== plan.length) add('harness', 'unenqueued', `${plan.length - planned.length} planned events have no id`);
  const plannedById = new Map(planned.map((e) => [e.id!, e]));
  const turnById = new Map(turnRows.map((t) => [t.id, t]));
  const turnsByEvent = groupBy(turnRows, (t) => t.eventId);
  const messagesByTurn = groupBy(messageRows, (m) => m.turnId);
  const deliveryById = new Map(deliveryRows.map((d) => [d.deliveryId, d]));
  const activationById = new Map(activationRows.map((a) => [a.activationUid, a]));
  const conversationById = new Map(conversationRows.map((c) => [c.id, c]));
  const jobById = new Map(jobs.map((j) => [j.id, j]));
  const dlqBySource = groupBy(
    dlq.filter((d) => d.source_id),
    (d) => d.source_id!,
  );
  const label = (id: string | undefined) => {
    if (id === undefined) return '(end)';
    const p = plannedById.get(id);
    return p ? `${keyOf(p.actor)}#${p.ordinal}` : id;
  };

  // Every turn's batch; which turns (any status) took each event, and which succeeded ones did.
  const batchByTurn = new Map(turnRows.map((t) => [t.id, batchOf(t)]));
  const turnsTaking = new Map<string, { turn: TurnRow; index: number }[]>();
  for (const t of turnRows) {
    batchByTurn.get(t.id)!.ids.forEach((id, index) => {
      const list = turnsTaking.get(id);
      if (list) list.push({ turn: t, index });
      else turnsTaking.set(id, [{ turn: t, index }]);
    });
  }
  /** The succeeded turn that committed each event (the first one, if several did). */
  const committedBy = new Map<string, { turn: TurnRow; index: number }>();

  // The policy a batch was formed under (P1 of src/db/enqueue/input-policies.ts): the actor's own row,
  // else its agent's, else the daemons' CORRAL_INPUT_POLICY as installed.
  const policyOf = (a: ActorRef): { policy: InputPolicy; maxEvents: number } => {
    const own: InputPolicyRow | undefined =
      policyRows.find((p) => p.agentUid === a.agentUid && p.sessionId === a.sessionId) ??
      policyRows.find((p) => p.agentUid === a.agentUid && p.sessionId === null);
    const policy = own?.policy ?? fallbackPolicy;
    return { policy, maxEvents: isBatching(policy) ? (own?.options.maxEvents ?? DEFAULT_BATCH_EVENTS) : 1 };
  };

  // ---- I1: exactly once, or dead-lettered ---------------------------------------------------
  // A head's dead-lettered batch: the members of its last turn (what src/runtime/attempt-failure.ts
  // sends to the dead-letter queue with it).
  const deadLetteredBatchOf = new Map<string, string>(); // member → its dead-lettered head
  const committedByAny = (id: string) => (turnsTaking.get(id) ?? []).some((x) => x.turn.status === 'succeeded');
  let deadLetteredBatches = 0;
  for (const [head, copies] of dlqBySource) {
    if (copies.length === 0) continue;
    const last = [...(turnsByEvent.get(head) ?? [])].sort(byStart).at(-1);
    if (!last) continue;
    const { ids } = batchByTurn.get(last.id)!;
    if (ids.length > 1) deadLetteredBatches++;
    for (const m of ids.slice(1)) {
      deadLetteredBatchOf.set(m, head);
      if (!dlqBySource.has(m)) {
        add(
          'I1',
          'dead_letter_batch_split',
          `event ${label(m)} was in the batch of dead-lettered head ${label(head)} (its last turn ${last.id}, attempt ${last.attempt}) but is not in the dead-letter queue${committedByAny(m) ? ' (it committed later)' : ''}`,
        );
      }
    }
  }

  let committed = 0;
  let deadLettered = 0;
  let committedMembers = 0;
  // A `fail` event dead-letters unless a batch took it after its head; a dead-lettered `fail`
  // head takes its batch with it.
  let expectedDeadLetters = 0;
  for (const e of planned) {
    const id = e.id!;
    const taking = turnsTaking.get(id) ?? [];
    const ok = taking.filter((x) => x.turn.status === 'succeeded');
    const dl = dlqBySource.get(id) ?? [];
    const dlHead = deadLetteredBatchOf.get(id);
    const where = `event ${id} (${keyOf(e.actor)}#${e.ordinal}${e.payload.fail ? ', fail' : ''})`;
    if (e.payload.fail ? !ok.some((x) => x.index > 0) : dlHead !== undefined && plannedById.get(dlHead)?.payload.fail)
      expectedDeadLetters++;
    if (ok.length === 0 && dl.length === 0) {
      add('I1', 'lost', `${where} is neither committed nor dead-lettered`, { job: jobById.get(id) ?? null });
      continue;
    }
    if (ok.length > 1)
      add(
        'I1',
        'duplicate_commit',
        `${where} was committed by ${ok.length} succeeded turns (as head of ${ok.filter((x) => x.index === 0).length}, as member of ${ok.filter((x) => x.index > 0).length})`,
        ok.map((x) => ({ turn: x.turn.id, head: label(x.turn.eventId), index: x.index })),
      );
    if (dl.length > 1) add('I1', 'duplicate_dead_letter', `${where} was dead-lettered ${dl.length} times`);
    if (ok.length > 0 && dl.length > 0) add('I1', 'committed_and_dead_lettered', `${where} is both committed and dead-lettered`);
    if (ok.length > 0) {
      committed++;
      const c = ok[0]!;
      committedBy.set(id, c);
      if (c.index > 0) committedMembers++;
      if (e.payload.fail && c.index === 0)
        add('I1', 'fail_event_committed', `${where} committed as its turn's head although the worker fails such a turn`);
      const job = jobById.get(id);
      const d = deliveryById.get(c.turn.deliveryId);
      if (!job) add('I1', 'job_missing', `${where} committed but its job is gone from ${queue.events}`);
      else if (job.state !== 'completed')
        add(
          'I1',
          'job_not_completed',
          `${where} committed${c.index > 0 ? ` (member ${c.index} of a batch)` : ''} but its job is ${job.state}`,
          job,
        );
      else if (c.index === 0 && d && job.retry_count !== d.jobRetryCount) {
        add(
          'I1',
          'job_attempt_mismatch',
          `${where} committed under job attempt ${d.jobRetryCount} but the job completed at retry_count ${job.retry_count}`,
        );
      }
    }
    if (dl.length > 0) {
      deadLettered++;
      const copy = dl[0]!;
      if (!isDeepStrictEqual(copy.data?.payload, e.payload))
        add('I1', 'dead_letter_payload', `${where}: its dead letter carries another payload`, copy.data);
      // A non-failing event dead-letters only with the batch of a `fail` head it was taken into.
      const withFailHead = dlHead !== undefined && plannedById.get(dlHead)?.payload.fail === true;
      if (!e.payload.fail && !withFailHead && !opts.allowUnexpectedDeadLetters) {
        const attempts = taking.map((x) => ({
          head: label(x.turn.eventId),
          index: x.index,
          attempt: x.turn.attempt,
          status: x.turn.status,
          epoch: x.turn.actorEpoch,
          worker: x.turn.workerId,
        }));
        add(
          'I1',
          'unexpected_dead_letter',
          `${where} exhausted its retries although its worker never fails it${dlHead ? ` (it went with the batch of ${label(dlHead)})` : ''}`,
          { attempts },
        );
      }
      const original = jobById.get(id);
      if (original && ['created', 'retry', 'active'].includes(original.state)) {
        add('I1', 'dead_letter_original_live', `${where} is dead-lettered but its original job is still ${original.state}`);
      }
    }
  }
  for (const j of jobs) {
    if (!plannedById.has(j.id)) add('I1', 'unknown_event', `job ${j.id} in ${queue.events} was never enqueued by the harness`, j);
  }
  for (const d of dlq) {
    if (!d.source_id || !plannedById.has(d.source_id)) add('I1', 'unknown_dead_letter', `dead letter ${d.id} names no planned event`, d);
  }

  // Each succeeded turn: its batch (one actor's, in order, within its policy) and its messages
  // ([user per event of the batch, in order, then the reply to the batch], written once).
  let committedBatches = 0;
  let largest = 0;
  for (const t of turnRows) {
    if (t.status !== 'succeeded') continue;
    const { ids, members, malformed } = batchByTurn.get(t.id)!;
    const where = `succeeded turn ${t.id} (head ${label(t.eventId)}${ids.length > 1 ? `, batch of ${ids.length}` : ''})`;
    largest = Math.max(largest, ids.length);
    if (ids.length > 1) committedBatches++;
    if (malformed) add('I1', 'bad_batch', `${where}: coalesced is not a list of events`, t.coalesced);
    const conv = conversationById.get(t.conversationId);
    const events = ids.map((id) => plannedById.get(id));
    if (ids.length > 1) {
      const dup = ids.filter((id, i) => ids.indexOf(id) !== i);
      if (dup.length > 0) add('I1', 'batch_duplicate', `${where} takes event(s) ${dup.map(label).join(', ')} twice`);
      if (ids.some((id, i) => i > 0 && !(ids[i - 1]! < id)))
        add('I2', 'batch_order', `${where}: its events are not in enqueue (UUIDv7) order`, ids.map(label));
      const foreign = events.filter((p, i) => i > 0 && p && conv && keyOf(p.actor) !== keyOf(conv));
      if (foreign.length > 0)
        add('I1', 'batch_other_actor', `${where} takes events of another actor: ${foreign.map((p) => label(p!.id)).join(', ')}`);
      members.forEach((m, i) => {
        const p = events[i + 1];
        if (p && !isDeepStrictEqual(m.data, p.payload))
          add('I1', 'batch_payload', `${where}: member ${i + 1} (${label(m.event_id)}) records another payload`, {
            recorded: m.data,
            payload: p.payload,
          });
      });
    }
    if (conv) {
      const { policy, maxEvents } = policyOf(conv);
      if (ids.length > maxEvents)
        add(
          'I1',
          isBatching(policy) ? 'batch_too_large' : 'batch_under_non_batching_policy',
          `${where} takes ${ids.length} events; the actor's policy ${policy} allows ${maxEvents}`,
        );
    }
    const unknown = ids.filter((id) => !plannedById.has(id));
    if (unknown.length > 0) {
      add('I1', 'unknown_event', `${where} takes event(s) the harness never enqueued: ${unknown.join(', ')}`);
      continue;
    }
    const payloads = events.map((p) => p!.payload);
    const msgs = (messagesByTurn.get(t.id) ?? []).sort((a, b) => a.seq - b.seq);
    const good =
      msgs.length === ids.length + 1 &&
      payloads.every((p, i) => msgs[i]!.role === 'user' && isDeepStrictEqual(msgs[i]!.content, p)) &&
      msgs.at(-1)!.role === 'assistant' &&
      replyMatches(payloads, msgs.at(-1)!.content) &&
      msgs.every((m, i) => m.seq === msgs[0]!.seq + i);
    if (!good) {
      add(
        'I1',
        'bad_messages',
        `${where} does not carry exactly [${ids.length > 1 ? `user payload ×${ids.length}` : 'user payload'}, assistant reply]`,
        { batch: ids.map(label), messages: msgs.map((m) => ({ seq: m.seq, role: m.role, content: m.content })) },
      );
    }
  }

  // A retry runs its batch again (B3 of src/db/turns/batches.ts): no attempt of a head takes an event
  // its previous attempt did not.
  let retriedThenCommitted = 0;
  for (const [head, ts] of turnsByEvent) {
    const sorted = [...ts].sort(byStart);
    if (sorted.length > 1 && sorted.some((t) => t.coalesced) && sorted.some((t) => t.status === 'succeeded')) retriedThenCommitted++;
    for (let i = 1; i < sorted.length; i++) {
      const before = new Set(batchByTurn.get(sorted[i - 1]!.id)!.ids);
      const added = batchByTurn.get(sorted[i]!.id)!.ids.filter((id) => !before.has(id));
      if (added.length > 0) {
        add(
          'I1',
          'retry_batch_grew',
          `head ${label(head)}: attempt ${sorted[i]!.attempt} (turn ${sorted[i]!.id}) takes ${added.map(label).join(', ')}, which attempt ${sorted[i - 1]!.attempt} did not`,
        );
      }
    }
  }

  // ---- I2: per-actor enqueue order ----------------------------------------------------------
  const convByActor = new Map(conversationRows.map((c) => [keyOf(c), c]));
  const plannedByActor = groupBy(planned, (e) => keyOf(e.actor));
  const messagesByConv = groupBy(messageRows, (m) => m.conversationId);
  for (const [actor, events] of plannedByActor) {
    const inPlanOrder = [...events].sort((a, b) => a.ordinal - b.ordinal);
    const byId = [...events].sort((a, b) => (a.id! < b.id! ? -1 : a.id! > b.id! ? 1 : 0));
    if (inPlanOrder.some((e, i) => e !== byId[i])) add('harness', 'ids_not_monotonic', `${actor}: UUIDv7 ids do not follow enqueue order`);
    const expected = byId.filter((e) => committedBy.has(e.id!)).map((e) => e.id!);
    const conv = convByActor.get(actor);
    const convMsgs = conv ? (messagesByConv.get(conv.id) ?? []).sort((a, b) => a.seq - b.seq) : [];
    // The events the transcript's user messages stand for: the k-th user message of a turn is
    // the k-th event of its batch.
    const actual: string[] = [];
    const usersSeen = new Map<string, number>();
    for (const m of convMsgs) {
      if (m.role !== 'user') continue;
      const t = turnById.get(m.turnId);
      const k = usersSeen.get(m.turnId) ?? 0;
      usersSeen.set(m.turnId, k + 1);
      actual.push(t ? (batchByTurn.get(t.id)!.ids[k] ?? `?extra:${t.id}`) : `?turn:${m.turnId}`);
    }
    if (!isDeepStrictEqual(actual, expected)) {
      const i = actual.findIndex((id, k) => id !== expected[k]);
      const at = i < 0 ? Math.min(actual.length, expected.length) : i;
      const short = (id: string | undefined) => {
        const p = id === undefined ? undefined : plannedById.get(id);
        return p ? `#${p.ordinal}` : label(id);
      };
      add(
        'I2',
        'order',
        `${actor}: transcript order differs from enqueue order at position ${at}: got ${short(actual[at])}, expected ${short(expected[at])}`,
        {
          actual: actual.map(short),
          expected: expected.map(short),
        },
      );
    }
    if (convMsgs.some((m, i) => m.seq !== i + 1)) {
      add(
        'I2',
        'seq_gap',
        `${actor}: message seqs are not 1..${convMsgs.length}`,
        convMsgs.map((m) => m.seq),
      );
    }
    if (conv && conv.nextSeq !== convMsgs.length + 1) {
      add('I2', 'next_seq', `${actor}: conversation next_seq ${conv.nextSeq} but ${convMsgs.length} messages`);
    }
  }

  // ---- I3: no write under a stale fence -----------------------------------------------------
  for (const t of turnRows) {
    const msgs = messagesByTurn.get(t.id) ?? [];
    if (t.status !== 'succeeded') {
      if (msgs.length > 0)
        add('I3', 'messages_on_unsucceeded_turn', `turn ${t.id} (${t.status}) of event ${t.eventId} has ${msgs.length} messages`);
      continue;
    }
    const d = deliveryById.get(t.deliveryId);
    const a = activationById.get(t.activationUid);
    const conv = conversationById.get(t.conversationId);
    const { ids } = batchByTurn.get(t.id)!;
    const where = `succeeded turn ${t.id} of event ${t.eventId}`;
    if (!d) {
      add('I3', 'no_delivery', `${where} has no delivery row ${t.deliveryId}`);
      continue;
    }
    const mism: string[] = [];
    if (d.state !== 'completed') mism.push(`delivery state ${d.state}`);
    if (d.eventId !== t.eventId) mism.push('event');
    if (!isDeepStrictEqual(d.coalesced ?? [], ids.slice(1)))
      mism.push(`batch ${JSON.stringify(ids.slice(1).map(label))} vs delivery ${JSON.stringify((d.coalesced ?? []).map(label))}`);
    if (d.activationUid !== t.activationUid) mism.push('activation');
    if (d.actorEpoch !== t.actorEpoch) mism.push(`epoch ${t.actorEpoch} vs delivery ${d.actorEpoch}`);
    if (d.revision !== t.revision) mism.push(`revision ${t.revision} vs delivery ${d.revision}`);
    if (d.jobRetryCount + 1 !== t.attempt) mism.push(`attempt ${t.attempt} vs delivery job_retry_count ${d.jobRetryCount}`);
    if (!a) mism.push('activation row missing');
    else {
      if (a.actorEpoch !== t.actorEpoch) mism.push(`epoch ${t.actorEpoch} vs activation ${a.actorEpoch}`);
      if (conv && keyOf(a) !== keyOf(conv)) mism.push('activation of another actor');
    }
    if (conv && keyOf(d) !== keyOf(conv)) mism.push('delivery of another actor');
    if (mism.length > 0) add('I3', 'fence_mismatch', `${where} does not match its fence: ${mism.join(', ')}`);
    const others = (turnsByEvent.get(t.eventId) ?? []).filter((o) => o.id !== t.id);
    const later = others.filter((o) => o.attempt > t.attempt);
    if (later.length > 0) {
      add(
        'I3',
        'attempt_after_commit',
        `${where} committed at attempt ${t.attempt} but attempt(s) ${later.map((o) => o.attempt).join(', ')} exist`,
      );
    }
    // No event of the batch ran again under a newer epoch (as a head or in another batch).
    for (const [k, id] of ids.entries()) {
      const newer = (turnsTaking.get(id) ?? []).filter((o) => o.turn.id !== t.id && o.turn.actorEpoch > t.actorEpoch);
      if (newer.length > 0) {
        add(
          'I3',
          'commit_under_older_epoch',
          `${where} committed ${k === 0 ? 'its event' : `event ${label(id)} (member ${k})`} under epoch ${t.actorEpoch} but it also ran under epoch(s) ${newer.map((o) => o.turn.actorEpoch).join(', ')}`,
          {
            committed: { attempt: t.attempt, epoch: t.actorEpoch, worker: t.workerId, finishedAt: t.finishedAt },
            others: newer.map((o) => ({
              head: label(o.turn.eventId),
              index: o.index,
              attempt: o.turn.attempt,
              epoch: o.turn.actorEpoch,
              status: o.turn.status,
              worker: o.turn.workerId,
              startedAt: o.turn.startedAt,
            })),
          },
        );
      }
      // A member stays queued behind its head (B2): no fetch takes it, so it never heads a turn.
      const asHead = k > 0 ? (turnsByEvent.get(id) ?? []) : [];
      if (asHead.length > 0)
        add(
          'I3',
          'member_ran_as_head',
          `${where} committed event ${label(id)} as member ${k}, but it also headed turn(s) ${asHead.map((o) => `${o.id} (${o.status})`).join(', ')}`,
        );
    }
  }
  for (const d of deliveryRows) {
    if (d.state !== 'completed') continue;
    const t = turnRows.find((x) => x.deliveryId === d.deliveryId);
    if (!t || t.status !== 'succeeded')
      add('I3', 'completed_delivery_without_commit', `delivery ${d.deliveryId} is completed but its turn is ${t?.status ?? 'missing'}`);
  }

  // ---- I4: one live activation per actor; epochs unique and increasing ---------------------
  const idx = new Map(indexes.map((i) => [i.indexname, i.indexdef]));
  for (const name of UNIQUE_INDEXES) {
    if (!idx.has(name)) add('I4', 'missing_index', `unique index corral.${name} is missing`);
  }
  const counters = new Map(actorRows.map((r) => [keyOf(r), r.epochCounter]));
  let maxEpoch = 0;
  for (const [actor, acts] of groupBy(activationRows, (a) => keyOf(a))) {
    const epochs = acts.map((a) => a.actorEpoch);
    maxEpoch = Math.max(maxEpoch, ...epochs);
    const dup = epochs.filter((e, i) => epochs.indexOf(e) !== i);
    if (dup.length > 0) add('I4', 'duplicate_epoch', `${actor}: epoch(s) ${[...new Set(dup)].join(', ')} used by more than one activation`);
    const byTime = [...acts].sort((a, b) => a.createdAt.getTime() - b.createdAt.getTime() || a.actorEpoch - b.actorEpoch);
    for (let i = 1; i < byTime.length; i++) {
      const prev = byTime[i - 1]!;
      const cur = byTime[i]!;
      if (prev.createdAt.getTime() === cur.createdAt.getTime()) {
        add(
          'I4',
          'activations_same_instant',
          `${actor}: activations of epochs ${prev.actorEpoch} and ${cur.actorEpoch} were created at the same instant`,
        );
      } else if (cur.actorEpoch <= prev.actorEpoch) {
        add(
          'I4',
          'epoch_not_increasing',
          `${actor}: activation created at ${cur.createdAt.toISOString()} has epoch ${cur.actorEpoch} <= ${prev.actorEpoch} of an earlier one`,
        );
      }
    }
    const live = acts.filter((a) => isLiveActivation(a));
    if (live.length > 1)
      add(
        'I4',
        'two_live',
        `${actor}: ${live.length} live activations`,
        live.map((a) => a.activationUid),
      );
    const counter = counters.get(actor);
    if (counter === undefined || counter < Math.max(...epochs))
      add('I4', 'epoch_counter_behind', `${actor}: durable epoch counter ${counter} < max epoch ${Math.max(...epochs)}`);
  }
  for (const [eventId, dels] of groupBy(deliveryRows, (d) => d.eventId)) {
    const live = dels.filter((d) => isLiveDelivery(d));
    if (live.length > 1) add('I4', 'two_live_deliveries', `event ${eventId}: ${live.length} live deliveries`);
  }

  const residue = {
    startedTurns: turnRows.filter((t) => t.status === 'started').length,
    liveDeliveries: deliveryRows.filter((d) => isLiveDelivery(d)).length,
    busyActivations: activationRows.filter((a) => isLiveActivation(a) && a.currentEventId !== null).length,
    liveActivations: activationRows.filter((a) => isLiveActivation(a)).length,
  };
  return {
    ok: v.length === 0,
    violations: v,
    summary: {
      events: planned.length,
      committed,
      deadLettered,
      expectedDeadLetters,
      turns: turnRows.length,
      activations: activationRows.length,
      maxEpoch,
      batches: { committed: committedBatches, committedMembers, largest, retriedThenCommitted, deadLettered: deadLetteredBatches },
      residue,
    },
  };
}

/**
 * Recovery latency of orphaned job attempts: an attempt pg-boss handed out (the job was fetched)
 * that never got a delivery row, because its daemon died (or its begin transaction failed)
 * before T2 committed. Nothing else fails such an attempt but pg-boss's job heartbeat, so its
 * actor is held until then. The next attempt of the event should start within
 * CORRAL_JOB_HEARTBEAT_S + the retry delay (+ a margin for a loaded machine) of the fault.
 * Caught B2: pg-boss checked heartbeats only in its supervise pass (every 60 s by default), so
 * the actor stalled for up to heartbeat + 60 s (fixed in f0e170d: supervise every third of it).
 */
export async function checkOrphanRecovery(
  db: Db,
  faults: { at: number; what: string }[],
  t: ChaosTimings,
  marginMs = 15_000,
): Promise<Violation[]> {
  const { rows } = await db.$client.query<{ event_id: string; rc: number; first_at: Date }>(
    `with d as (select event_id, job_retry_count as rc, min(created_at) as first_at from corral.deliveries group by 1, 2)
     select d2.event_id, d2.rc, d2.first_at from d d2
      where d2.rc > 0 and not exists (select 1 from d d1 where d1.event_id = d2.event_id and d1.rc = d2.rc - 1)
      order by d2.first_at`,
  );
  const boundMs = (t.jobHeartbeatS ?? 30) * 1000 + t.retryDelayMaxS * 1000 + marginMs;
  const slow: { eventId: string; orphanedAttempt: number; fault: string; recoveredAfterMs: number }[] = [];
  for (const r of rows) {
    const at = r.first_at.getTime();
    const fault = [...faults].reverse().find((f) => f.at <= at);
    if (!fault) continue;
    const latency = at - fault.at;
    if (latency > boundMs) slow.push({ eventId: r.event_id, orphanedAttempt: r.rc, fault: fault.what, recoveredAfterMs: latency });
  }
  if (slow.length === 0) return [];
  const worst = Math.max(...slow.map((x) => x.recoveredAfterMs));
  return [
    {
      invariant: 'expectation',
      code: 'slow_orphan_recovery',
      knownIssue: 'B2',
      message:
        `${slow.length} job attempt(s) fetched but never begun (no delivery row) held their actor for up to ${(worst / 1000).toFixed(1)} s ` +
        `after the fault; expected <= ${(boundMs / 1000).toFixed(0)} s (CORRAL_JOB_HEARTBEAT_S ${t.jobHeartbeatS ?? 30} + retry delay + margin)`,
      details: slow.slice(0, 10),
    },
  ];
}
