/** The Broker's public types (kept apart so src/fabric/broker.ts stays readable). */
import type { Clock } from '../base/clock.ts';
import type { Logger } from '../base/logger.ts';
import type { Authenticator } from './auth.ts';
import type { ResultMessage, RetryPolicy, TurnErrorBody, TurnRef } from './protocol.ts';

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
      /** The agents the worker's key may serve (src/base/agent-scope.ts); absent: every agent. */
      agents?: readonly string[];
    }
  | { kind: 'worker_heartbeat'; workerId: string; inFlight: number }
  | { kind: 'turn_accepted'; workerId: string; turnRef: TurnRef }
  | { kind: 'turn_progress'; workerId: string; turnRef: TurnRef; note?: string }
  /** `bytes`: the frame's size, which the relay bounds (src/runtime/stream-relay.ts). */
  | { kind: 'turn_chunk'; workerId: string; turnRef: TurnRef; seq: number; data: unknown; bytes: number }
  | {
      kind: 'turn_result';
      workerId: string;
      turnRef: TurnRef;
      messages: ResultMessage[];
      output?: unknown;
      emit?: unknown[];
      deliver?: unknown[];
    }
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
  /**
   * Connections counted against the limits, registered or not: live ones, admitted ones about to
   * appear, and unattributed ones (`connectionsUnattributed`), see src/fabric/admission.ts.
   */
  connections: number;
  /** Admitted connections that never appeared: each stays counted against its key (src/fabric/admission.ts). */
  connectionsUnattributed: number;
  /** Handshakes waiting for their turn to be admitted. */
  admissionsQueued: number;
  received: number;
  /** Frames over `maxMessageBytes` refused (larger ones make libzmq drop the connection). */
  oversize: number;
  /** `worker_ready` for an id live on another connection, without a valid proof. */
  takeoverRefused: number;
  registrationRefused: number;
  /** Refusals neither logged nor answered because the peer exceeded its rate. */
  refusalsSuppressed: number;
  /** Handshakes refused by the ZAP handler: over the connection cap / key not allowed / over its key's connection limit. */
  connectionsRefused: number;
  keysRefused: number;
  keyConnectionsRefused: number;
  /** `worker_challenge`s sent, and challenges outstanding now. */
  challenges: number;
  challengesOutstanding: number;
  /** Registrations refused `rate_limited` (the key's registrations per second). */
  registrationsRateLimited: number;
  /** Registration log lines left out (over the per-key budget). */
  logsSuppressed: number;
  sent: number;
  invalid: number;
  sendFailed: Record<SendFailure, number>;
  callbackErrors: number;
  sendQueueDepth: number;
}

export type BrokerState = 'idle' | 'starting' | 'running' | 'stopping' | 'stopped';

export interface BrokerOptions {
  /** Where to bind, e.g. `tcp://127.0.0.1:5555`; port 0 picks a free port (see `endpoint`). */
  endpoint: string;
  logger: Logger;
  clock?: Clock;
  /** Told to workers in `worker_welcome`; default 2000. */
  heartbeatIntervalMs?: number;
  /** Told to workers in `worker_welcome`; default 10000 (DEFAULT_PROGRESS_INTERVAL_MS). */
  progressIntervalMs?: number;
  /** Largest accepted frame; libzmq drops a connection that sends more. Default 1 MiB. */
  maxMessageBytes?: number;
  /**
   * Messages libzmq reads ahead of the broker per connection (ZMQ_RCVHWM); a peer that sends faster
   * than the broker handles waits (TCP pushes back), so what one connection can make the daemon
   * hold is about this many frames of up to twice `maxMessageBytes`. Default
   * DEFAULT_RECEIVE_HWM (32).
   */
  receiveHighWaterMark?: number;
  /**
   * ZMTP-level ping interval; a peer silent for 3 intervals is disconnected, so a frozen
   * worker's route disappears (sends then fail fast as `unknown_route`). 0 disables.
   * Default 0: with the receive high-water mark, libzmq 4.3.5 can abort the process when a ping
   * comes due on a connection a flooding peer left (src/fabric/broker.ts, `doStart`).
   */
  zmtpHeartbeatMs?: number;
  authenticator?: Authenticator;
  /**
   * CURVE: the broker's keypair (Z85) and the ZAP admission check. Absent = no encryption
   * (`--insecure`); the ZAP handler then still enforces the connection cap.
   */
  curve?: {
    publicKey: string;
    secretKey: string;
    isKeyAllowed: (publicKeyZ85: string) => boolean;
    /** Names a key in log lines (its worker ids). */
    describeKey?: (publicKeyZ85: string) => string;
  };
  /** Most worker ids registered at once; further new ids are refused. Default 256. */
  maxWorkers?: number;
  /** Most live connections; the ZAP handler refuses handshakes beyond it. Default 1024. */
  maxConnections?: number;
  /** Most live connections per CURVE key (not applied without CURVE). Default 4. */
  maxConnectionsPerKey?: number;
  /** Accepted registrations per key per second (bursts of 5×, at least 5); more are refused `rate_limited`. Default 1. */
  registrationsPerKeyPerS?: number;
  /** How long an admitted connection has to appear before it counts as unattributed (src/fabric/admission.ts). Default 1000. */
  attachWaitMs?: number;
  /** How long a peer may take to finish the ZMTP/CURVE handshake. Default 5000. */
  handshakeIntervalMs?: number;
  /** Told to workers in `worker_welcome` (lease, stale timeout, retry policy), so a worker can check its timings fit. */
  welcome?: { leaseMs: number; staleMs: number; retry: RetryPolicy; streamChunkBytes?: number; streamTurnBytes?: number };
  /** Receives every valid message (and every refusal as `invalid`). Called synchronously. */
  onEvent: (e: BrokerEvent) => void;
}
