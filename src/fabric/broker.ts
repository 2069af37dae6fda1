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
 * 5. No `handover`: a connection can never take over another connection's routing id. Workers
 *    connect with a fresh random routing id per connection; the worker id travels in
 *    `worker_ready`, so a reconnect is a new connection that registers again.
 * 6. A connection is a session only after an accepted `worker_ready` (allow-listed id, token and,
 *    with CURVE, the key proof over this connection's challenge: src/fabric/registration.ts).
 *    Only sessions receive turns. An unregistered connection gets nothing but `error` and
 *    `worker_challenge` answers, rate-limited per connection.
 * 7. One worker id, one live connection. A `worker_ready` for an id live on another connection
 *    moves the session only with a valid proof; without one it is a route takeover attempt:
 *    refused, logged and counted, and the live session is untouched.
 * 8. Everything a peer controls is bounded: frame size (libzmq drops a connection sending more
 *    than twice the limit; above the limit the broker refuses and counts), the frames libzmq reads
 *    ahead per connection (`receiveHighWaterMark`: a flood waits in the peer's own queue and TCP
 *    window, not in the daemon's memory), registered workers
 *    (`maxWorkers`), connections (`maxConnections` and `maxConnectionsPerKey`, enforced at the
 *    handshake: src/fabric/admission.ts), registrations (per key per second), outstanding
 *    challenges (one per connection), and log lines (per connection and per key, fields truncated).
 * 9. The ROUTER reports each connection's start (ZMQ_ROUTER_NOTIFY: an empty first message) and
 *    end (ZMQ_DISCONNECT_MSG: 32 random bytes chosen at start, which no peer knows); the
 *    broker consumes both, so neither is ever taken for a peer's message.
 */
import { Context, type Router } from 'zeromq';
import { settlesWithin, systemClock, type Clock } from '../base/clock.ts';
import { CorralError, toError } from '../base/errors.ts';
import type { Logger } from '../base/logger.ts';
import { randomBytes } from 'node:crypto';
import { AllowAll, type Authenticator } from './auth.ts';
import { ConnectionBook, NO_KEY } from './admission.ts';
import { Registrar, type Conn } from './registration.ts';
import {
  DEFAULT_HEARTBEAT_INTERVAL_MS,
  DEFAULT_MAX_MESSAGE_BYTES,
  DEFAULT_PROGRESS_INTERVAL_MS,
  DEFAULT_RECEIVE_HWM,
  PROTOCOL_VERSION,
  encodeFrame,
  frameBytesAbove,
  parseWorkerMessage,
  type DaemonMessage,
  type ProtocolErrorCode,
} from './protocol.ts';
import { SerialQueue } from '../base/serial-queue.ts';
import { ZapHandler, type ZapAnswer, type ZapRequest } from './zap.ts';
import { runReceiveLoop } from './receive-loop.ts';
import { openRouterSocket } from './router-socket.ts';
import { WindowCounter } from '../base/rate-limits.ts';
import type { BrokerEvent, BrokerOptions, BrokerState, BrokerStats, SendFailure, SendResult, WorkerSession } from './broker-types.ts';

export type { BrokerEvent, BrokerOptions, BrokerState, BrokerStats, SendFailure, SendResult, WorkerSession } from './broker-types.ts';

export class Broker {
  private readonly opts: BrokerOptions;
  private readonly log: Logger;
  private readonly clock: Clock;
  private readonly heartbeatIntervalMs: number;
  private readonly progressIntervalMs: number;
  private readonly maxMessageBytes: number;
  private readonly receiveHighWaterMark: number;
  private readonly authenticator: Authenticator;
  private readonly queue = new SerialQueue();
  /** Registered connections by routing id (hex). */
  private readonly conns = new Map<string, Conn>();
  /** worker id → routing id (hex) of its live connection. */
  private readonly byWorker = new Map<string, string>();
  /** Per-connection budget for refusal logs and `error` answers (invariant 8). */
  private readonly refusals: WindowCounter;
  private readonly maxWorkers: number;
  private readonly maxConnections: number;
  private readonly book: ConnectionBook;
  private readonly registrar: Registrar;
  /** The last message of every connection (invariant 9). */
  private readonly disconnectMsg = randomBytes(32);
  private zap: ZapHandler | null = null;
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
    oversize: 0,
    takeoverRefused: 0,
    registrationRefused: 0,
    refusalsSuppressed: 0,
    connectionsRefused: 0,
    keysRefused: 0,
    keyConnectionsRefused: 0,
    challenges: 0,
    registrationsRateLimited: 0,
    logsSuppressed: 0,
    sendFailed: { unknown_route: 0, backpressure: 0, closed: 0, too_large: 0 } as Record<SendFailure, number>,
  };

  constructor(opts: BrokerOptions) {
    this.opts = opts;
    this.log = opts.logger.child({ component: 'broker' });
    this.clock = opts.clock ?? systemClock;
    this.heartbeatIntervalMs = opts.heartbeatIntervalMs ?? DEFAULT_HEARTBEAT_INTERVAL_MS;
    this.progressIntervalMs = opts.progressIntervalMs ?? DEFAULT_PROGRESS_INTERVAL_MS;
    this.maxMessageBytes = opts.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
    this.receiveHighWaterMark = opts.receiveHighWaterMark ?? DEFAULT_RECEIVE_HWM;
    this.authenticator = opts.authenticator ?? new AllowAll();
    this.maxWorkers = opts.maxWorkers ?? 256;
    this.maxConnections = opts.maxConnections ?? 1024;
    const maxPerKey = opts.maxConnectionsPerKey ?? 4;
    const registrationsPerKeyPerS = opts.registrationsPerKeyPerS ?? 1;
    const attachWaitMs = opts.attachWaitMs ?? 1_000;
    for (const [name, val] of [
      ['maxWorkers', this.maxWorkers],
      ['maxConnections', this.maxConnections],
      ['maxConnectionsPerKey', maxPerKey],
      ['registrationsPerKeyPerS', registrationsPerKeyPerS],
      ['attachWaitMs', attachWaitMs],
      ['heartbeatIntervalMs', this.heartbeatIntervalMs],
      ['progressIntervalMs', this.progressIntervalMs],
      ['maxMessageBytes', this.maxMessageBytes],
      ['receiveHighWaterMark', this.receiveHighWaterMark],
    ] as const) {
      if (!Number.isInteger(val) || val < 1) throw new CorralError('invalid_config', `broker ${name} must be a positive integer`);
    }
    this.refusals = new WindowCounter(this.clock, REFUSALS_PER_SECOND, 1_000);
    const describeKey = opts.curve?.describeKey;
    this.book = new ConnectionBook({
      maxConnections: this.maxConnections,
      maxPerKey,
      attachWaitMs,
      clock: this.clock,
      log: this.log,
      ...(describeKey ? { describe: (k: string) => describeKey(k) } : {}),
    });
    this.registrar = new Registrar({
      log: this.log,
      clock: this.clock,
      authenticator: this.authenticator,
      maxWorkers: this.maxWorkers,
      maxChallenges: this.maxConnections,
      registrationsPerKeyPerS,
      conns: this.conns,
      byWorker: this.byWorker,
      counters: this.counters,
      welcome: (workerId, capacity) => this.welcome(workerId, capacity),
      send: (routing, rid, msg) => void this.sendFrames(routing, encodeFrame(msg), rid, msg.type),
      refuse: (routing, rid, code, reason) => this.invalid(routing, rid, code, reason),
      emit: (e) => this.emit(e),
    });
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
    // Off unless asked for: libzmq 4.3.5 aborts the process (`!_io_error`, stream_engine_base.cpp)
    // when a ZMTP ping comes due on a connection whose peer left while its input was stopped at
    // the receive high-water mark, so a peer that floods and disconnects could kill the daemon.
    // A frozen worker is found by the application heartbeat instead (its staleness, §6).
    const zmtp = this.opts.zmtpHeartbeatMs ?? 0;
    // One context per broker: the ZAP endpoint is per context, so two brokers in one process
    // (tests, a library user) each get their own handler.
    const context = new Context();
    const zap = new ZapHandler({ context, clock: this.clock, log: this.log, admit: (r, answer) => this.admit(r, answer) });
    await zap.start();
    this.zap = zap;
    const curve = this.opts.curve;
    let socket: Router;
    try {
      socket = await openRouterSocket({
        context,
        endpoint: this.opts.endpoint,
        maxMessageBytes: this.maxMessageBytes,
        receiveHighWaterMark: this.receiveHighWaterMark,
        handshakeIntervalMs: this.opts.handshakeIntervalMs ?? 5_000,
        zmtpHeartbeatMs: zmtp,
        curve,
        disconnectMsg: this.disconnectMsg,
      });
    } catch (e) {
      await zap.stop();
      throw e;
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
    this.log.info({ endpoint: this.boundEndpoint, curve: curve !== undefined }, 'broker bound');
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
    const rid = this.byWorker.get(workerId);
    const conn = rid === undefined ? undefined : this.conns.get(rid);
    if (!conn) return this.failed('unknown_route');
    const payload = encodeFrame(msg);
    const tooLarge = frameBytesAbove(payload, this.maxMessageBytes);
    if (tooLarge !== undefined) {
      this.log.warn({ workerId, type: msg.type, bytes: tooLarge }, 'message too large, not sent');
      return this.failed('too_large');
    }
    return this.sendFrames(conn.routing, payload, workerId, msg.type);
  }

  /** True when `workerId` has an accepted registration. */
  isRegistered(workerId: string): boolean {
    return this.byWorker.has(workerId);
  }

  /** Snapshot of the registered workers. */
  workers(): WorkerSession[] {
    return [...this.conns.values()].map((c) => ({ ...c.session }));
  }

  /**
   * Drop a worker's session (e.g. when the daemon declares it stale). Its next message is
   * answered `not_registered`, which makes a live worker register again.
   */
  forget(workerId: string): boolean {
    const rid = this.byWorker.get(workerId);
    if (rid === undefined) return false;
    this.byWorker.delete(workerId);
    this.conns.delete(rid);
    return true;
  }

  /**
   * Revoke a worker (its key left the allow-list): its session is dropped at once, it is told
   * `error{unauthorized}` once, and `worker_gone` is emitted so its turns go elsewhere. A ROUTER
   * cannot close one peer's connection; the connection stays open, is never sent a turn again,
   * and every message it sends is refused like an unregistered connection's (`unauthorized` for
   * a `worker_ready` of the revoked id, else `not_registered`); a reconnect fails the ZAP check.
   */
  revoke(workerId: string, reason: string): boolean {
    const rid = this.byWorker.get(workerId);
    const conn = rid === undefined ? undefined : this.conns.get(rid);
    if (rid === undefined || !conn) return false;
    this.forget(workerId);
    this.log.warn({ workerId, reason }, 'worker revoked');
    const reply = encodeFrame({ v: PROTOCOL_VERSION, type: 'error', code: 'unauthorized', message: `revoked: ${reason}` });
    void this.sendFrames(conn.routing, reply, rid, 'error');
    this.emit({ kind: 'worker_gone', workerId, reason });
    return true;
  }

  stats(): BrokerStats {
    const book = this.book.stats();
    return {
      state: this.state,
      workers: this.byWorker.size,
      connections: book.connections,
      connectionsUnattributed: book.unattributed,
      admissionsQueued: book.queued,
      oversize: this.counters.oversize,
      takeoverRefused: this.counters.takeoverRefused,
      registrationRefused: this.counters.registrationRefused,
      refusalsSuppressed: this.counters.refusalsSuppressed,
      connectionsRefused: this.counters.connectionsRefused,
      keysRefused: this.counters.keysRefused,
      keyConnectionsRefused: this.counters.keyConnectionsRefused,
      challenges: this.counters.challenges,
      challengesOutstanding: this.registrar.outstandingChallenges(),
      registrationsRateLimited: this.counters.registrationsRateLimited,
      logsSuppressed: this.counters.logsSuppressed,
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
      await settlesWithin(this.clock, 1000, this.listenerClosed);
    }
    await this.loopDone;
    this.book.stop();
    await this.zap?.stop().catch(() => undefined);
    this.zap = null;
    this.conns.clear();
    this.byWorker.clear();
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
    const routing = frames[0];
    if (!routing || routing.length === 0) {
      this.counters.received++;
      this.invalid(null, '(none)', 'invalid_message', 'message without routing id');
      return;
    }
    const rid = routing.toString('hex');
    // invariant 9: a connection's first and last messages are the ROUTER's, not the peer's
    if (frames.length === 2 && frames[1]!.equals(this.disconnectMsg)) {
      this.connectionEnded(rid);
      return;
    }
    if (!this.book.isLive(rid)) {
      this.book.connected(rid);
      if (frames.length === 2 && frames[1]!.length === 0) return;
      // a message without its connect notification first: libzmq gave the connection a routing
      // id of its own (the peer reused a live one); from now on it is an ordinary connection
    }
    this.counters.received++;
    if (frames.length !== 2) {
      this.invalid(routing, rid, 'invalid_message', `expected exactly 1 payload frame, got ${frames.length - 1}`);
      return;
    }
    if (frames[1]!.length > this.maxMessageBytes) {
      this.counters.oversize++;
      this.invalid(routing, rid, 'invalid_message', `frame of ${frames[1]!.length} bytes exceeds the limit of ${this.maxMessageBytes}`);
      return;
    }
    // invariant 6: an unregistered connection's frames are refused anyway, but for its worker_ready;
    // one larger than any worker_ready is refused unread, so a flood of them costs no parsing
    if (frames[1]!.length > MAX_UNREGISTERED_FRAME_BYTES && !this.conns.has(rid)) {
      this.invalid(routing, rid, 'not_registered', `a frame of ${frames[1]!.length} bytes from a connection that has not registered`);
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
      this.registrar.onReady(routing, rid, msg);
      return;
    }
    const conn = this.conns.get(rid);
    if (!conn) {
      this.invalid(routing, rid, 'not_registered', `${msg.type} from a connection that has not registered`);
      return;
    }
    const session = conn.session;
    session.lastSeenMs = this.clock.nowMs();
    const workerId = session.workerId;
    switch (msg.type) {
      case 'worker_heartbeat':
        if (msg.worker_id !== workerId) {
          this.invalid(routing, rid, 'identity_mismatch', `worker_id ${msg.worker_id} differs from the registered id`);
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
      case 'turn_chunk':
        this.emit({ kind: 'turn_chunk', workerId, turnRef: msg.turn_ref, seq: msg.seq, data: msg.data, bytes: frames[1]!.length });
        return;
      case 'turn_result':
        this.emit({
          kind: 'turn_result',
          workerId,
          turnRef: msg.turn_ref,
          messages: msg.messages,
          ...(msg.output === undefined ? {} : { output: msg.output }),
          ...(msg.emit === undefined ? {} : { emit: msg.emit }),
          ...(msg.deliver === undefined ? {} : { deliver: msg.deliver }),
        });
        return;
      case 'turn_error':
        this.emit({ kind: 'turn_error', workerId, turnRef: msg.turn_ref, error: msg.error });
        return;
      case 'rpc_request':
        this.emit({ kind: 'rpc_request', workerId, id: msg.id, method: msg.method, params: msg.params ?? null, turnRef: msg.turn_ref });
        return;
    }
  }

  private welcome(workerId: string, capacity: number): DaemonMessage {
    return {
      v: PROTOCOL_VERSION,
      type: 'worker_welcome',
      worker_id: workerId,
      capacity,
      heartbeat_interval_ms: this.heartbeatIntervalMs,
      progress_interval_ms: this.progressIntervalMs,
      ...(this.opts.welcome
        ? {
            lease_ms: this.opts.welcome.leaseMs,
            stale_ms: this.opts.welcome.staleMs,
            retry: this.opts.welcome.retry,
            ...(this.opts.welcome.streamChunkBytes === undefined ? {} : { stream_chunk_bytes: this.opts.welcome.streamChunkBytes }),
            ...(this.opts.welcome.streamTurnBytes === undefined ? {} : { stream_turn_bytes: this.opts.welcome.streamTurnBytes }),
          }
        : {}),
    };
  }

  /**
   * The connection `rid` ended (its disconnect message): its limits are released and its
   * challenge dropped. A session on it stays until it moves, goes stale or is revoked, as before:
   * a worker that reconnects at once keeps its turns; sends to it fail `unknown_route` meanwhile.
   */
  private connectionEnded(rid: string): void {
    this.book.disconnected(rid);
    this.registrar.connectionEnded(rid);
    this.refusals.delete(rid);
  }

  /**
   * ZAP admission (runs in the ZAP handler's loop, synchronously): the key allow-list, then the
   * connection limits, which may answer later (src/fabric/admission.ts).
   */
  private admit(req: ZapRequest, answer: ZapAnswer): void {
    const curve = this.opts.curve;
    if (curve && (req.mechanism !== 'CURVE' || !req.publicKey || !curve.isKeyAllowed(req.publicKey))) {
      this.counters.keysRefused++;
      this.logLimited(
        'zap',
        { address: req.address.slice(0, 64), mechanism: req.mechanism.slice(0, 16) },
        'connection refused: key not on the allow-list',
      );
      void answer({ ok: false, status: 400, reason: 'key not allowed' });
      return;
    }
    const key = curve ? req.publicKey! : NO_KEY;
    const refusal = this.book.request(key, answer);
    if (!refusal) return;
    if (refusal.perKey) this.counters.keyConnectionsRefused++;
    else this.counters.connectionsRefused++;
    const fields = { address: req.address.slice(0, 64), ...(curve ? { key: curve.describeKey?.(key) ?? key.slice(0, 40) } : {}) };
    this.logLimited(refusal.perKey ? `zap:${key}` : 'zap', fields, `connection refused: ${refusal.reason}`);
    void answer(refusal);
  }

  /** True when `key` may still log/answer in this one-second window (invariant 8). */
  private withinBudget(key: string): boolean {
    if (this.refusals.take(key).ok) return true;
    this.counters.refusalsSuppressed++;
    return false;
  }

  private logLimited(key: string, fields: Record<string, unknown>, msg: string): void {
    if (this.withinBudget(`log:${key}`)) this.log.warn(fields, msg);
  }

  /** Log, count, report and answer a refused message. */
  private invalid(routing: Buffer | null, rid: string, code: ProtocolErrorCode, reason: string): void {
    this.counters.invalid++;
    this.emit({ kind: 'invalid', routingId: rid.slice(0, 64), reason: `${code}: ${reason.slice(0, 200)}` });
    if (!this.withinBudget(rid)) return;
    this.log.warn({ routingId: rid.slice(0, 32), code, reason: reason.slice(0, 200) }, 'refused worker message');
    if (routing) {
      const reply = encodeFrame({ v: PROTOCOL_VERSION, type: 'error', code, message: reason.slice(0, 1000) });
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

  private sendFrames(routing: Buffer, payload: string, rid: string, type: string): Promise<SendResult> {
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

/** Log/answer at most this many refusals per connection per second; the rest are only counted. */
const REFUSALS_PER_SECOND = 10;
/** The largest frame read from a connection that has not registered: a worker_ready is under 2 KiB (docs/protocol.md §4). */
export const MAX_UNREGISTERED_FRAME_BYTES = 64 * 1024;
