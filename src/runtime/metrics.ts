import type { OutboxMetrics } from '../outbox/sender.ts';

/** The runtime's metric hooks (the outbox's among them); the daemon binds them to Prometheus counters. */
export interface RuntimeMetrics extends OutboxMetrics {
  dispatched(): void;
  committed(): void;
  duplicate(): void;
  failed(deadLettered: boolean): void;
  rejected(reason: string): void;
  invalidMessage(): void;
  /** Seconds from an event's enqueue to its first turn_start being sent (first attempts only). */
  dispatchLatency?(seconds: number): void;
  /** Seconds from a turn's turn_start being sent to its fenced commit. */
  commitLatency?(seconds: number): void;
  /** A worker handed a turn back (it waits behind its peers for a while). */
  handedBack?(): void;
  /** A committed turn took `events` events after its own (a batch, input policy coalesce/interrupt). */
  coalesced?(events: number): void;
  /** A running turn was interrupted by a newer event (input policy interrupt). */
  interrupted?(): void;
  /** A turn began in the commit of its actor's previous turn (N1 of src/runtime/turn-commit.ts). */
  continued?(): void;
  /** A `turn_chunk`, by what became of it (src/runtime/stream-relay.ts). */
  streamChunk?(outcome: string): void;
  /** A worker RPC answered `busy`: over the worker's requests at once, or per second. */
  rpcRefused?(reason: 'concurrency' | 'rate'): void;
}

export const noopMetrics: RuntimeMetrics = {
  dispatched: () => undefined,
  committed: () => undefined,
  duplicate: () => undefined,
  failed: () => undefined,
  rejected: () => undefined,
  invalidMessage: () => undefined,
  handedBack: () => undefined,
  rpcRefused: () => undefined,
};
