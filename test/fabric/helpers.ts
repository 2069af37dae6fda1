/** Shared helpers for the fabric and worker tests: polling and turn refs (the raw DEALER peer is test/helpers/raw-peer.ts). */
import { randomUUID } from 'node:crypto';
import { waitFor as sharedWaitFor } from '../helpers/wait.ts';
import { PROTOCOL_VERSION, type TurnRef, type TurnStart } from '../../src/fabric/protocol.ts';

/** The shared `waitFor` (test/helpers/wait.ts) with the positional form these tests use. */
export async function waitFor<T>(probe: () => T | undefined | null | false | 0 | '', what: string, timeoutMs = 5000): Promise<T> {
  return sharedWaitFor(() => probe() || undefined, { what, timeoutMs, intervalMs: 5 }) as Promise<T>;
}

export function makeTurnRef(over: Partial<TurnRef> = {}): TurnRef {
  return {
    agent_uid: 'agent-1',
    session_id: 'session-1',
    activation_uid: randomUUID(),
    actor_epoch: 1,
    event_id: randomUUID(),
    revision: 0,
    delivery_id: randomUUID(),
    ...over,
  };
}

export function makeTurnStart(data: unknown, ref: TurnRef = makeTurnRef()): TurnStart {
  return {
    v: PROTOCOL_VERSION,
    type: 'turn_start',
    turn_ref: ref,
    event: { id: ref.event_id, data: data as TurnStart['event']['data'], enqueued_at: new Date().toISOString() },
    attempt: 1,
    lease_expires_at: new Date(Date.now() + 60_000).toISOString(),
  };
}
