/** The Broker's public types (kept apart so src/fabric/broker.ts stays readable). */
import type { ResultMessage, TurnErrorBody, TurnRef } from './protocol.ts';

/**
 * What the broker hands to `onEvent`: one per valid worker message, and `invalid` for each
 * refused one (logged, counted, answered with `error`, then dropped).
 */
export type BrokerEvent =
  | {
      kind: 'worker_ready';
      workerId: string;
      capacity: number;
      reconnect: boolean;
      sdk?: string;
      instance?: string;
      /** The agents the worker's key may serve (src/agent-scope.ts); absent: every agent. */
      agents?: readonly string[];
    }
  | { kind: 'worker_heartbeat'; workerId: string; inFlight: number }
  | { kind: 'turn_accepted'; workerId: string; turnRef: TurnRef }
  | { kind: 'turn_progress'; workerId: string; turnRef: TurnRef; note?: string }
  | { kind: 'turn_result'; workerId: string; turnRef: TurnRef; messages: ResultMessage[]; output?: unknown; emit?: unknown[] }
  | { kind: 'turn_error'; workerId: string; turnRef: TurnRef; error: TurnErrorBody }
  | { kind: 'invalid'; routingId: string; reason: string }
  /** A worker RPC request (served off the broker loop, src/runtime/rpc.ts). */
  | { kind: 'rpc_request'; workerId: string; id: string; method: string; params: unknown; turnRef: TurnRef }
  /** The broker dropped a registered worker (revoked): its turns must go elsewhere. */
  | { kind: 'worker_gone'; workerId: string; reason: string };

/**
 * Why `Broker.send` did not queue a message. Nothing is retried by the broker:
 * - `unknown_route`: not registered, or libzmq has no connection for it (EHOSTUNREACH);
 * - `backpressure`: the worker's queue is at its high-water mark (EAGAIN): it is not reading;
 * - `closed`: the broker is not running;
 * - `too_large`: the encoded message exceeds `maxMessageBytes`.
 */
export type SendFailure = 'unknown_route' | 'backpressure' | 'closed' | 'too_large';
export type SendResult = { ok: true } | { ok: false; reason: SendFailure };

/** What the broker knows about one registered worker. */
export interface WorkerSession {
  workerId: string;
  capacity: number;
  sdk?: string;
  registeredAtMs: number;
  /** Last time any valid message arrived from this worker (local clock). */
  lastSeenMs: number;
  /** How many accepted `worker_ready`s this broker has seen from this id. */
  registrations: number;
}

export interface BrokerStats {
  state: BrokerState;
  workers: number;
  /** Live connections (accepted minus disconnected), registered or not. */
  connections: number;
  received: number;
  /** Frames over `maxMessageBytes` refused (larger ones make libzmq drop the connection). */
  oversize: number;
  /** `worker_ready` for an id live on another connection, without a valid proof. */
  takeoverRefused: number;
  registrationRefused: number;
  /** Refusals neither logged nor answered because the peer exceeded its rate. */
  refusalsSuppressed: number;
  /** Handshakes refused by the ZAP handler: over the connection cap / key not allowed. */
  connectionsRefused: number;
  keysRefused: number;
  sent: number;
  invalid: number;
  sendFailed: Record<SendFailure, number>;
  callbackErrors: number;
  sendQueueDepth: number;
}

export type BrokerState = 'idle' | 'starting' | 'running' | 'stopping' | 'stopped';
