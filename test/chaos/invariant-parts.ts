/**
 * The pieces of the chaos invariants (invariants.ts): the shapes the checks take and give, and
 * the small readings of the rows they share (a turn's batch, live states, grouping).
 */
import { ACTIVATION_LIVE, DELIVERY_LIVE, type activations, type deliveries, type turns } from '../../src/db/schema.ts';
import { BATCHING_POLICIES, type InputPolicy } from '../../src/db/views.ts';
import { type Queues } from '../../src/queue/boss.ts';
import type { ActorRef } from './plan.ts';

export type TurnRow = typeof turns.$inferSelect;
export type DeliveryRow = typeof deliveries.$inferSelect;
export type ActivationRow = typeof activations.$inferSelect;

/** The unique indexes I1/I4 rely on (a migration that drops one is a violation). */
export const UNIQUE_INDEXES = ['activations_one_live', 'turns_one_success_per_event', 'deliveries_one_live_per_event'];

/** An enqueued event as the checks see it: its id, its actor, its place in the actor's order. */
export interface CheckedEvent {
  /** The event id the event queue returned (an event without one is a harness error). */
  id?: string;
  actor: ActorRef;
  /** Position within its actor (0-based, enqueue order). */
  ordinal: number;
  /** The payload; `fail: true` marks an event its handler fails when it heads a turn (it must dead-letter). */
  payload: Record<string, unknown> & { fail?: true };
}

export interface CheckOptions {
  /** Some non-failing events may legitimately exhaust their retries (e.g. under a fault). */
  allowUnexpectedDeadLetters?: boolean;
  /** Queue names (default: those of the default configuration). */
  queues?: Pick<Queues, 'events' | 'deadLetter'>;
  /**
   * Whether `content` is the assistant reply the handler writes for a turn that took `payloads`
   * (its batch, in order; one for a single-event turn). Default: the echo worker's.
   */
  replyMatches?: (payloads: CheckedEvent['payload'][], content: unknown) => boolean;
}

/** What the echo says of one event: its `text`, else its JSON (src/worker/example.ts). */
export const echoText = (payload: unknown): string => {
  const text = (payload as { text?: unknown } | null)?.text;
  return typeof text === 'string' ? text : JSON.stringify(payload);
};

/** The reply of `corral worker`'s echo handler: `echo: ` and each event's text, joined by ` | `. */
export const echoes = (payloads: CheckedEvent['payload'][], content: unknown) =>
  (content as { text?: unknown } | null)?.text === `echo: ${payloads.map(echoText).join(' | ')}`;

export type InvariantId = 'I1' | 'I2' | 'I3' | 'I4' | 'quiescence' | 'process' | 'expectation' | 'harness';

export interface Violation {
  invariant: InvariantId;
  code: string;
  message: string;
  details?: unknown;
  /** The bug this check caught before (see test/chaos/README.md): a regression if it fires again. */
  knownIssue?: string;
}

export interface CheckSummary {
  events: number;
  committed: number;
  deadLettered: number;
  /**
   * Events that had to dead-letter: the `fail` events not committed as a later member of a batch,
   * and the members of a dead-lettered `fail` head's batch (equals the `fail` events under `queue`).
   */
  expectedDeadLetters: number;
  turns: number;
  activations: number;
  maxEpoch: number;
  /** Batches (turns of several events, input policy `coalesce`). */
  batches: {
    /** Succeeded turns that took more than their own event. */
    committed: number;
    /** Events committed as a later member of a batch (not its head). */
    committedMembers: number;
    /** The most events one succeeded turn took. */
    largest: number;
    /** Heads whose batch ran more than once (retried) and then committed. */
    retriedThenCommitted: number;
    /** Dead-lettered heads whose last turn took a batch. */
    deadLettered: number;
  };
  /** Leftovers that are not violations by themselves (reported for inspection). */
  residue: { startedTurns: number; liveDeliveries: number; busyActivations: number; liveActivations: number };
}

export interface CheckResult {
  ok: boolean;
  violations: Violation[];
  summary: CheckSummary;
}

export const keyOf = (a: ActorRef) => `${a.agentUid}/${a.sessionId}`;
export const isLiveActivation = (a: Pick<ActivationRow, 'status'>) => (ACTIVATION_LIVE as readonly string[]).includes(a.status);
export const isLiveDelivery = (d: Pick<DeliveryRow, 'state'>) => (DELIVERY_LIVE as readonly string[]).includes(d.state);
export const isBatching = (p: InputPolicy) => (BATCHING_POLICIES as readonly string[]).includes(p);

export function groupBy<T, K>(xs: T[], key: (x: T) => K): Map<K, T[]> {
  const m = new Map<K, T[]>();
  for (const x of xs) {
    const k = key(x);
    const list = m.get(k);
    if (list) list.push(x);
    else m.set(k, [x]);
  }
  return m;
}

/** One event of a turn's batch as `turns.coalesced` records it. */
export interface RecordedMember {
  event_id: string;
  data: unknown;
  enqueued_at?: unknown;
}

/** A turn's batch: its events in order (the head first) and the recorded members; `malformed` when `coalesced` is not a list of members. */
export function batchOf(t: TurnRow): { ids: string[]; members: RecordedMember[]; malformed: boolean } {
  const c = t.coalesced;
  if (c === null || c === undefined) return { ids: [t.eventId], members: [], malformed: false };
  const ok =
    Array.isArray(c) &&
    c.length > 0 &&
    c.every((m) => m !== null && typeof m === 'object' && typeof (m as RecordedMember).event_id === 'string');
  const members = ok ? (c as RecordedMember[]) : [];
  return { ids: [t.eventId, ...members.map((m) => m.event_id)], members, malformed: !ok };
}

export const byStart = (a: TurnRow, b: TurnRow) => a.startedAt.getTime() - b.startedAt.getTime() || a.attempt - b.attempt;
