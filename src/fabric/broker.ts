/**
 * The Broker owns the daemon's one ROUTER socket: it decodes, validates, tracks worker
 * sessions and hands every valid message to `onEvent`, synchronously.
 *
 * Invariants:
 * 1. (design I5) The broker never touches the database and never awaits domain work: its
 *    receive loop awaits only `socket.receive()`. Whatever `onEvent` does must be scheduled by
 *    the callee; a throw from `onEvent` is caught and logged.
 * 2. The receive loop survives anything a peer can send (garbage bytes, wrong frame counts,
 *    unknown types, schema violations): each is logged, counted, reported as `invalid`, and
 *    answered with `error` to the sender. Only `stop()` ends the loop.
 * 3. All sends go through one SerialQueue: zeromq.js allows one send in flight per socket.
 * 4. `mandatory` + `sendTimeout: 0`: a send succeeds or fails at once (EHOSTUNREACH → the
 *    worker is not connected, EAGAIN → its queue is full). The broker never blocks on a peer.
 * 5. `handover: true`: a worker reconnecting with the same routing id takes the route over;
 *    without it the router would mute the new connection forever.
 * 6. A routing id is a session only after an accepted `worker_ready` whose `worker_id`
 *    equals the routing id; everything else from it is answered `not_registered`.
 */
import { Router } from 'zeromq';
import { systemClock, type Clock } from '../clock.ts';
import { CorralError, toError } from '../errors.ts';
import type { Logger } from '../logger.ts';
import { AllowAll, type AuthDecision, type Authenticator } from './auth.ts';
import {
  DEFAULT_HEARTBEAT_INTERVAL_MS,
  DEFAULT_MAX_MESSAGE_BYTES,
  DEFAULT_PROGRESS_INTERVAL_MS,
  PROTOCOL_VERSION,
  encodeMessage,
  isValidWorkerId,
  parseWorkerMessage,
  type DaemonMessage,
  type ProtocolErrorCode,
  type WorkerReady,
} from './protocol.ts';
import { SerialQueue } from './send-queue.ts';
import { runReceiveLoop } from './receive-loop.ts';
import type { BrokerEvent, BrokerState, BrokerStats, SendFailure, SendResult, WorkerSession } from './broker-types.ts';

export type { BrokerEvent, BrokerState, BrokerStats, SendFailure, SendResult, WorkerSession } from './broker-types.ts';

export interface BrokerOptions {
  /** Where to bind, e.g. `tcp://127.0.0.1:5555`; port 0 picks a free port (see `endpoint`). */
  endpoint: string;
  logger: Logger;
  clock?: Clock;
  /** Told to workers in `worker_welcome`; default 2000. */
  heartbeatIntervalMs?: number;
  /** Told to workers in `worker_welcome`; default 5000. */
  progressIntervalMs?: number;
  /** Largest accepted frame; libzmq drops a connection that sends more. Default 1 MiB. */
  maxMessageBytes?: number;
  /**
   * ZMTP-level ping interval; a peer silent for 3 intervals is disconnected, so a frozen
   * worker's route disappears (sends then fail fast as `unknown_route`). 0 disables.
   * Default: `heartbeatIntervalMs`.
   */
  zmtpHeartbeatMs?: number;
  authenticator?: Authenticator;
  /** Receives every valid message (and every refusal as `invalid`). Called synchronously. */
  onEvent: (e: BrokerEvent) => void;
}

export class Broker {
  private readonly opts: BrokerOptions;
  private readonly log: Logger;
  private readonly clock: Clock;
  private readonly heartbeatIntervalMs: number;
  private readonly progressIntervalMs: number;
  private readonly maxMessageBytes: number;
  private readonly authenticator: Authenticator;
  private readonly queue = new SerialQueue();
  private readonly sessions = new Map<string, WorkerSession>();
  private socket: Router | null = null;
  private boundEndpoint: string | null = null;
  private state: BrokerState = 'idle';
  private startPromise: Promise<string> | null = null;
  private stopPromise: Promise<void> | null = null;
  private loopDone: Promise<void> = Promise.resolve();
  private listenerClosed: Promise<void> = Promise.resolve();
  private readonly counters = {
    received: 0,
    sent: 0,
    invalid: 0,
    callbackErrors: 0,
    sendFailed: { unknown_route: 0, backpressure: 0, closed: 0, too_large: 0 } as Record<SendFailure, number>,
  };

  constructor(opts: BrokerOptions) {
    this.opts = opts;
    this.log = opts.logger.child({ component: 'broker' });
    this.clock = opts.clock ?? systemClock;
    this.heartbeatIntervalMs = opts.heartbeatIntervalMs ?? DEFAULT_HEARTBEAT_INTERVAL_MS;
    this.progressIntervalMs = opts.progressIntervalMs ?? DEFAULT_PROGRESS_INTERVAL_MS;
    this.maxMessageBytes = opts.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
    this.authenticator = opts.authenticator ?? new AllowAll();
    for (const [name, val] of [
      ['heartbeatIntervalMs', this.heartbeatIntervalMs],
      ['progressIntervalMs', this.progressIntervalMs],
      ['maxMessageBytes', this.maxMessageBytes],
    ] as const) {
      if (!Number.isInteger(val) || val < 1) throw new CorralError('invalid_config', `broker ${name} must be a positive integer`);
    }
  }

  /** Bind the ROUTER. Idempotent. Resolves with the actual endpoint once bound. */
  start(): Promise<string> {
    if (this.state === 'stopping' || this.state === 'stopped') {
      return Promise.reject(new CorralError('shutdown', 'broker was stopped; create a new one'));
    }
    this.startPromise ??= this.doStart().catch((e: unknown) => {
      this.startPromise = null;
      this.state = 'idle';
      throw e;
    });
    return this.startPromise;
  }

  private async doStart(): Promise<string> {
    this.state = 'starting';
    const zmtp = this.opts.zmtpHeartbeatMs ?? this.heartbeatIntervalMs;
    const socket = new Router({
      mandatory: true,
      sendTimeout: 0,
      handover: true,
      linger: 0,
      maxMessageSize: this.maxMessageBytes,
      ...(zmtp > 0 ? { heartbeatInterval: zmtp, heartbeatTimeout: zmtp * 3 } : {}),
    });
    try {
      await socket.bind(this.opts.endpoint);
    } catch (e) {
      socket.close();
      throw new CorralError('invalid_config', `broker cannot bind ${this.opts.endpoint}: ${toError(e).message}`, {
        cause: e,
      });
    }
    this.socket = socket;
    this.boundEndpoint = socket.lastEndpoint ?? this.opts.endpoint;
    const bound = this.boundEndpoint;
    // libzmq closes the listener asynchronously after close(); without waiting for it, a
    // broker restarted in-process on the same port fails with EADDRINUSE about half the time.
    this.listenerClosed = new Promise<void>((resolve) => {
      socket.events.on('close', (ev) => {
        if (ev.address === bound) resolve();
      });
    });
    this.state = 'running';
    this.loopDone = this.receiveLoop(socket);
    this.log.info({ endpoint: this.boundEndpoint }, 'broker bound');
    return this.boundEndpoint;
  }

  /** The bound endpoint (the real port when started on port 0). Throws before `start()`. */
  get endpoint(): string {
    if (this.boundEndpoint === null) throw new CorralError('invalid_argument', 'broker not started');
    return this.boundEndpoint;
  }

  /**
   * Queue one message to a registered worker. Never blocks on the peer and never rejects for
   * transport reasons: failures come back as `{ ok: false, reason }`. Unregistered ids are
   * `unknown_route` without touching the socket. Rejects only on a programming error (a
   * message that JSON cannot encode).
   */
  async send(workerId: string, msg: DaemonMessage): Promise<SendResult> {
    if (this.state !== 'running' || !this.socket) return this.failed('closed');
    if (!this.sessions.has(workerId)) return this.failed('unknown_route');
    const payload = encodeMessage(msg);
    if (payload.length > this.maxMessageBytes) {
      this.log.warn({ workerId, type: msg.type, bytes: payload.length }, 'message too large, not sent');
      return this.failed('too_large');
    }
    return this.sendFrames(Buffer.from(workerId, 'utf8'), payload, workerId, msg.type);
  }

  /** True when `workerId` has an accepted registration. */
  isRegistered(workerId: string): boolean {
    return this.sessions.has(workerId);
  }

  /** Snapshot of the registered workers. */
  workers(): WorkerSession[] {
    return [...this.sessions.values()].map((s) => ({ ...s }));
  }

  /**
   * Drop a worker's session (e.g. when the daemon declares it stale). Its next message is
   * answered `not_registered`, which makes a live worker register again.
   */
  forget(workerId: string): boolean {
    return this.sessions.delete(workerId);
  }

  stats(): BrokerStats {
    return {
      state: this.state,
      workers: this.sessions.size,
      received: this.counters.received,
      sent: this.counters.sent,
      invalid: this.counters.invalid,
      sendFailed: { ...this.counters.sendFailed },
      callbackErrors: this.counters.callbackErrors,
      sendQueueDepth: this.queue.depth,
    };
  }

  /** Close the socket and end the receive loop. Idempotent; later sends return `closed`. */
  stop(): Promise<void> {
    this.stopPromise ??= this.doStop();
    return this.stopPromise;
  }

  private async doStop(): Promise<void> {
    if (this.startPromise) await this.startPromise.catch(() => undefined);
    const socket = this.socket;
    this.state = 'stopping';
    // Sends are immediate (sendTimeout 0), so draining is quick; it lets queued replies go out.
    await this.queue.idle();
    if (socket) {
      socket.close();
      const timeout = new AbortController();
      await Promise.race([this.listenerClosed, this.clock.sleep(1000, timeout.signal).catch(() => undefined)]);
      timeout.abort();
    }
    await this.loopDone;
    this.sessions.clear();
    this.socket = null;
    this.state = 'stopped';
    this.log.info('broker stopped');
  }

  // ---- receive path --------------------------------------------------------------------

  private receiveLoop(socket: Router): Promise<void> {
    return runReceiveLoop(socket, {
      clock: this.clock,
      log: this.log,
      what: 'broker',
      stopping: () => this.state === 'stopping',
      handle: (frames) => this.handleFrames(frames),
    });
  }

  private handleFrames(frames: Buffer[]): void {
    this.counters.received++;
    const routing = frames[0];
    if (!routing || routing.length === 0) {
      this.invalid(null, '(none)', 'invalid_message', 'message without routing id');
      return;
    }
    const rid = describeRoutingId(routing);
    if (frames.length !== 2) {
      this.invalid(routing, rid, 'invalid_message', `expected exactly 1 payload frame, got ${frames.length - 1}`);
      return;
    }
    const parsed = parseWorkerMessage(frames[1]!);
    if (!parsed.ok) {
      const code: ProtocolErrorCode = parsed.code === 'unsupported_version' ? 'unsupported_version' : 'invalid_message';
      this.invalid(routing, rid, code, parsed.error);
      return;
    }
    const msg = parsed.msg;
    if (msg.type === 'worker_ready') {
      this.onReady(routing, rid, msg);
      return;
    }
    const session = this.sessions.get(rid);
    if (!session) {
      this.invalid(routing, rid, 'not_registered', `${msg.type} from a worker that has not sent worker_ready`);
      return;
    }
    session.lastSeenMs = this.clock.nowMs();
    const workerId = session.workerId;
    switch (msg.type) {
      case 'worker_heartbeat':
        if (msg.worker_id !== rid) {
          this.invalid(routing, rid, 'identity_mismatch', `worker_id ${msg.worker_id} differs from routing id`);
          return;
        }
        this.emit({ kind: 'worker_heartbeat', workerId, inFlight: msg.in_flight });
        return;
      case 'turn_accepted':
        this.emit({ kind: 'turn_accepted', workerId, turnRef: msg.turn_ref });
        return;
      case 'turn_progress':
        this.emit({
          kind: 'turn_progress',
          workerId,
          turnRef: msg.turn_ref,
          ...(msg.note === undefined ? {} : { note: msg.note }),
        });
        return;
      case 'turn_result':
        this.emit({
          kind: 'turn_result',
          workerId,
          turnRef: msg.turn_ref,
          messages: msg.messages,
          ...(msg.output === undefined ? {} : { output: msg.output }),
        });
        return;
      case 'turn_error':
        this.emit({ kind: 'turn_error', workerId, turnRef: msg.turn_ref, error: msg.error });
        return;
    }
  }

  private onReady(routing: Buffer, rid: string, msg: WorkerReady): void {
    if (msg.worker_id !== rid) {
      this.invalid(routing, rid, 'identity_mismatch', `worker_id ${msg.worker_id} differs from routing id ${rid}`);
      return;
    }
    let decision: AuthDecision;
    try {
      decision = this.authenticator.verify(msg.worker_id, msg.auth, rid);
    } catch (e) {
      decision = { ok: false, reason: `authenticator failed: ${toError(e).message}` };
    }
    if (!decision.ok) {
      // With handover the refused connection now owns this routing id: the old session, if
      // any, is unreachable, so drop it rather than keep routing turns into the void.
      this.sessions.delete(rid);
      this.invalid(routing, rid, 'unauthorized', decision.reason);
      return;
    }
    const now = this.clock.nowMs();
    const prev = this.sessions.get(rid);
    const session: WorkerSession = {
      workerId: rid,
      capacity: msg.capacity,
      ...(msg.sdk === undefined ? {} : { sdk: msg.sdk }),
      registeredAtMs: now,
      lastSeenMs: now,
      registrations: (prev?.registrations ?? 0) + 1,
    };
    this.sessions.set(rid, session);
    // Queue the welcome before telling anyone, so it precedes any turn_start that onEvent
    // might send synchronously.
    void this.sendFrames(
      routing,
      encodeMessage({
        v: PROTOCOL_VERSION,
        type: 'worker_welcome',
        worker_id: rid,
        heartbeat_interval_ms: this.heartbeatIntervalMs,
        progress_interval_ms: this.progressIntervalMs,
      }),
      rid,
      'worker_welcome',
    );
    this.log.info({ workerId: rid, capacity: msg.capacity, sdk: msg.sdk, reconnect: prev !== undefined }, 'worker registered');
    this.emit({
      kind: 'worker_ready',
      workerId: rid,
      capacity: msg.capacity,
      reconnect: prev !== undefined,
      ...(msg.sdk === undefined ? {} : { sdk: msg.sdk }),
      ...(msg.instance === undefined ? {} : { instance: msg.instance }),
    });
  }

  /** Log, count, report and answer a refused message. */
  private invalid(routing: Buffer | null, rid: string, code: ProtocolErrorCode, reason: string): void {
    this.counters.invalid++;
    this.log.warn({ routingId: rid, code, reason }, 'refused worker message');
    this.emit({ kind: 'invalid', routingId: rid, reason: `${code}: ${reason}` });
    if (routing) {
      const reply = encodeMessage({ v: PROTOCOL_VERSION, type: 'error', code, message: reason.slice(0, 1000) });
      void this.sendFrames(routing, reply, rid, 'error');
    }
  }

  private emit(e: BrokerEvent): void {
    try {
      this.opts.onEvent(e);
    } catch (err) {
      this.counters.callbackErrors++;
      this.log.error({ err: toError(err), kind: e.kind }, 'broker onEvent callback threw');
    }
  }

  // ---- send path -----------------------------------------------------------------------

  private sendFrames(routing: Buffer, payload: Buffer, rid: string, type: string): Promise<SendResult> {
    return this.queue.run(async (): Promise<SendResult> => {
      const socket = this.socket;
      if (!socket || socket.closed) return this.failed('closed');
      try {
        await socket.send([routing, payload]);
        this.counters.sent++;
        return { ok: true };
      } catch (e) {
        const code = (e as { code?: unknown }).code;
        if (code === 'EHOSTUNREACH') return this.failed('unknown_route');
        if (code === 'EAGAIN') {
          this.log.warn({ workerId: rid, type }, 'worker queue full, message not sent');
          return this.failed('backpressure');
        }
        if (socket.closed) return this.failed('closed');
        // Unexpected: treat the route as unusable; the caller re-dispatches elsewhere.
        this.log.error({ err: toError(e), workerId: rid, type }, 'broker send failed');
        return this.failed('unknown_route');
      }
    });
  }

  private failed(reason: SendFailure): SendResult {
    this.counters.sendFailed[reason]++;
    return { ok: false, reason };
  }
}

/**
 * Printable form of a routing id. Ids that are not valid worker ids (e.g. the 5 binary bytes
 * libzmq assigns to a DEALER without one) become `#<hex>`; `#` is outside the worker-id
 * alphabet, so such a peer can never collide with a registered worker's session.
 */
export function describeRoutingId(routing: Buffer): string {
  const text = routing.toString('utf8');
  return isValidWorkerId(text) ? text : `#${routing.toString('hex').slice(0, 128)}`;
}
