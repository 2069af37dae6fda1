/** How an actor's state reads to an operator (the queries are in src/db/operations/actor-views.ts). */
import { ACTIVATION_LIVE } from '../db/schema.ts';
import type { ActivationView } from '../db/operations/actor-views.ts';

export type { ActivationView, ActorRow, TurnView } from '../db/operations/actor-views.ts';
/** Every attempt of one event of an actor, oldest first (`corral turn`). */
export { attemptsOfEvent } from '../db/operations/actor-views.ts';

const LIVE: readonly string[] = ACTIVATION_LIVE;

/** One line for an activation: epoch, status, revision and the lease (live) or why it ended. */
export function describeActivation(a: ActivationView, fmt: (d: Date) => string): string {
  const live = LIVE.includes(a.status);
  const lease = live
    ? `lease ${a.leaseAlive ? 'until' : 'EXPIRED at'} ${fmt(a.leaseExpiresAt)}`
    : `ended${a.endReason ? ` (${a.endReason})` : ''}`;
  return `${a.activationUid} epoch ${a.epoch}, ${a.status}, revision ${a.revision}, ${lease}`;
}
