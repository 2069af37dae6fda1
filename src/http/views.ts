/**
 * What the HTTP API answers, in snake_case JSON: the client's results (src/client/api.ts) under
 * the names docs/http.md gives them. Timestamps are ISO 8601 text in UTC; absent values are null,
 * never left out, so every field of a response is always there.
 */
import { formatActorKey, type ActorKey } from '../base/actor-key.ts';
import type { EventStatus } from '../db/turns/event-status.ts';
import type { CommittedTurnView, EmittedEntry, TranscriptEntry } from '../db/views.ts';
import type { SendResult } from '../client/api.ts';

interface MessageJson {
  seq: number;
  role: string;
  content: unknown;
  created_at: string;
}

export interface SendJson {
  event_id: string;
  duplicate: boolean;
}

export interface TurnJson {
  turn_id: string;
  event_id: string;
  status: string;
  actor_epoch: number;
  revision: number;
  started_at: string;
  finished_at: string | null;
  cancel_reason: string | null;
  messages: MessageJson[];
  emitted: EmittedEntry[];
}

export interface TranscriptJson {
  actor: string;
  turns: TurnJson[];
}

export interface CommittedTurnJson {
  turn_id: string;
  actor_epoch: number;
  attempt: number;
  worker_id: string | null;
  started_at: string;
  finished_at: string;
  messages: MessageJson[];
  output: unknown;
  emitted: EmittedEntry[];
}

export interface EventJson {
  event_id: string;
  state: EventStatus['state'];
  actor: string | null;
  job_state: string | null;
  turn: CommittedTurnJson | null;
}

const iso = (d: Date): string => d.toISOString();

const messageOf = (m: { seq: number; role: string; content: unknown; createdAt: Date }): MessageJson => ({
  seq: m.seq,
  role: m.role,
  content: m.content,
  created_at: iso(m.createdAt),
});

export function sendJson(r: SendResult): SendJson {
  return { event_id: r.eventId, duplicate: r.duplicate };
}

export function transcriptJson(actor: ActorKey, entries: readonly TranscriptEntry[]): TranscriptJson {
  return {
    actor: formatActorKey(actor),
    turns: entries.map((t) => ({
      turn_id: t.turnId,
      event_id: t.eventId,
      status: t.status,
      actor_epoch: t.actorEpoch,
      revision: t.revision,
      started_at: iso(t.startedAt),
      finished_at: t.finishedAt ? iso(t.finishedAt) : null,
      cancel_reason: t.cancelReason ?? null,
      messages: t.messages.map(messageOf),
      emitted: t.emitted,
    })),
  };
}

export function eventJson(eventId: string, status: EventStatus, turn: CommittedTurnView | undefined): EventJson {
  return {
    event_id: eventId,
    state: status.state,
    actor: status.actor ?? null,
    job_state: status.jobState ?? null,
    turn: turn
      ? {
          turn_id: turn.turnId,
          actor_epoch: turn.actorEpoch,
          attempt: turn.attempt,
          worker_id: turn.workerId,
          started_at: iso(turn.startedAt),
          finished_at: iso(turn.finishedAt),
          messages: turn.messages.map(messageOf),
          output: turn.output ?? null,
          emitted: turn.emitted,
        }
      : null,
  };
}
