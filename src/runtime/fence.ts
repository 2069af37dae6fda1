/** Conversions between the wire `turn_ref` (snake_case), the rows and the runtime `Fence`. */
import type { Fence } from '../db/turns/fence.ts';
import type { TurnRef } from '../fabric/protocol.ts';

export type { Fence };
export type WireTurnRef = TurnRef;

export function toWire(f: Fence): WireTurnRef {
  return {
    agent_uid: f.agentUid,
    session_id: f.sessionId,
    activation_uid: f.activationUid,
    actor_epoch: f.actorEpoch,
    event_id: f.eventId,
    revision: f.revision,
    delivery_id: f.deliveryId,
  };
}

export function fromWire(r: WireTurnRef): Fence {
  return {
    agentUid: r.agent_uid,
    sessionId: r.session_id,
    activationUid: r.activation_uid,
    actorEpoch: r.actor_epoch,
    eventId: r.event_id,
    revision: r.revision,
    deliveryId: r.delivery_id,
  };
}

/** One attempt of one event, as far as settling it is concerned (a Fence is one). */
export interface AttemptRef {
  agentUid: string;
  sessionId: string;
  activationUid: string;
  actorEpoch: number;
  eventId: string;
}

/** Log fields for an attempt: actor key, epoch and event id. */
export function attemptFields(a: AttemptRef): Record<string, unknown> {
  return { actor: `${a.agentUid}/${a.sessionId}`, epoch: a.actorEpoch, eventId: a.eventId };
}

/** Log fields for a fence: every live-path log line carries actor key, epoch and event id. */
export function fenceFields(f: Fence): Record<string, unknown> {
  return {
    actor: `${f.agentUid}/${f.sessionId}`,
    epoch: f.actorEpoch,
    eventId: f.eventId,
    revision: f.revision,
    deliveryId: f.deliveryId,
  };
}
