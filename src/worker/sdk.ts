/**
 * The worker SDK: connects a DEALER to the daemon, registers, heartbeats, and runs turns
 * through a handler (see src/worker/turn.ts for one turn's life).
 *
 * Invariants:
 * 1. One DEALER per worker, with a fresh random routing id per connection: the daemon's ROUTER
 *    never hands a live route to a new connection, so a reconnect under the old id could be
 *    muted while the daemon still holds the old connection. The worker id travels in
 *    `worker_ready`, with the credentials (`auth`) issued with the worker's key; with CURVE the
 *    daemon answers a `worker_challenge`, and the worker proves its key over the challenge's
 *    nonce (src/fabric/proof.ts), once per nonce.
 * 2. All sends go through one SerialQueue (zeromq.js allows one send in flight per socket).
 * 3. Registration is re-established by the worker, never assumed: `worker_ready` is re-sent
 *    on `error{not_registered}` (the daemon restarted or forgot us), on every reconnect
 *    handshake, and on the heartbeat tick while no welcome has come back.
 * 4. At most `capacity` handlers run at once, or the lower capacity the daemon's welcome says it
 *    registered (an allow-list entry may cap it); an over-sent turn_start is refused with a
 *    retryable turn_error `over_capacity`, never queued (the daemon owns queueing).
 * 5. Results are kept until the daemon answers them (turn_committed / turn_rejected) and are
 *    re-sent after a re-registration: the fence makes a duplicate harmless, and a result
 *    sent into a restarting daemon is otherwise lost.
 * 6. Nothing escapes a timer or socket callback: errors are logged with the worker id.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { backoffDelayMs } from '../base/backoff.ts';
import { Dealer } from 'zeromq';
import { settlesWithin, systemClock, type Clock, type TimerHandle } from '../base/clock.ts';
import { CorralError, toError } from '../base/errors.ts';
import { silentLogger, type Logger } from '../base/logger.ts';
import type { WorkerAuth } from '../fabric/auth.ts';
import { workerProof } from '../fabric/proof.ts';
import {
  DEFAULT_HEARTBEAT_INTERVAL_MS,
  DEFAULT_MAX_MESSAGE_BYTES,
  DEFAULT_PROGRESS_INTERVAL_MS,
  MAX_CAPACITY,
  PROTOCOL_VERSION,
  encodeFrame,
  isValidWorkerId,
  parseDaemonMessage,
  type TurnRef,
  type TurnStart,
  type WorkerMessage,
} from '../fabric/protocol.ts';
import { SerialQueue } from '../base/serial-queue.ts';
import { DEFAULT_STREAM_CHUNK_BYTES } from '../base/defaults.ts';
import { runReceiveLoop } from '../fabric/receive-loop.ts';
import { RunningTurn, type TurnHandler } from './turn.ts';
import { registrationRefusal, watchHandshakes, type RefusalListener } from './refusals.ts';
import { applySendHooks, type WorkerHooks } from './hooks.ts';
import type { StopOptions, Worker } from './types.ts';
import { TracedFinals } from './tracing.ts';

export type { TurnContext, TurnHandler, TurnOutcome, SteerListener, HandlerError, HistoryPage, Emit, Deliver } from './turn.ts';

export type { WorkerHooks } from './hooks.ts';
export type { StopOptions, Worker } from './types.ts';

export interface WorkerOptions {
  /** The daemon's ROUTER, e.g. `tcp://127.0.0.1:5555`. */
  endpoint: string;
  /** 1..64 chars of [A-Za-z0-9._:-]; with CURVE, the id the key file was issued for. */
  workerId: string;
  /** Concurrent turns, 1..1024. Default 1. */
  capacity?: number;
  handler: TurnHandler;
  logger?: Logger;
  clock?: Clock;
  /** Until the welcome says otherwise. Default 2000. */
  heartbeatIntervalMs?: number;
  /** Until the welcome says otherwise. Default 10000 (DEFAULT_PROGRESS_INTERVAL_MS). */
  progressIntervalMs?: number;
  maxMessageBytes?: number;
  /**
   * Credentials sent in `worker_ready` (with CURVE: `{ scheme: 'key', credential: <token> }`, from
   * `workerCredentials`); the key proof a daemon's challenge asks for is made from `curve`.
   */
  auth?: WorkerAuth;
  /** CURVE keys (Z85): the daemon's public key and this worker's keypair. Absent = no CURVE. */
  curve?: { serverKey: string; publicKey: string; secretKey: string };
  /** Free-form SDK name/version sent in worker_ready. */
  sdk?: string;
  hooks?: WorkerHooks;
  /** How long `ctx.rpc` waits for the daemon's answer. Default 15000. */
  rpcTimeoutMs?: number;
  /** Each refusal by the daemon, typed (src/worker/refusals.ts); logged either way, and the worker goes on trying. */
  onRefused?: RefusalListener;
  /** Each welcome: the daemon registered this worker. */
  onRegistered?: () => void;
}

export const SDK_NAME = 'corral-ts/0.1';
const MAX_UNSETTLED = 1000;

/** Build a worker. Nothing happens until `start()`. */
export function createWorker(opts: WorkerOptions): Worker {
  return new WorkerRuntime(opts);
}

type State = 'idle' | 'running' | 'stopping' | 'stopped';

class WorkerRuntime implements Worker {
  readonly workerId: string;
  /** One per process run: lets the daemon tell a reconnect from a restart. */
  private readonly instance = randomUUID();
  private readonly opts: WorkerOptions;
  /** The capacity asked for in every `worker_ready`. */
  private readonly requestedCapacity: number;
  /** The capacity the daemon registered (welcome), at most `requestedCapacity` (invariant 4). */
  private effectiveCapacity: number;
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly maxMessageBytes: number;
  private readonly queue = new SerialQueue();
  private readonly turns = new Map<string, RunningTurn>();
  /** delivery_id → final result awaiting turn_committed/turn_rejected (invariant 5). */
  private readonly unsettled = new Map<string, WorkerMessage>();
  /** The handler spans of traced turns whose final message awaits its answer. */
  private readonly tracedFinals = new TracedFinals();
  private state: State = 'idle';
  private socket: Dealer | null = null;
  private loopDone: Promise<void> = Promise.resolve();
  private heartbeatTimer: TimerHandle | null = null;
  private heartbeatMs: number;
  private progressMs: number;
  /** The largest turn_chunk frame the daemon relays (its welcome says; the default until then). */
  private streamChunkBytes = DEFAULT_STREAM_CHUNK_BYTES;
  /** The daemon's stream budget per attempt; undefined from a daemon older than the field. */
  private streamTurnBytes: number | undefined;
  private registered = false;
  private readySentAtMs: number | null = null;
  private heartbeatQueued = false;
  private handshakes = 0;
  private connected = false;
  private reconnects = 0;
  private handshakeLog: { succeeded(): void } | null = null;
  private reconnectTimer: TimerHandle | null = null;
  private stopPromise: Promise<void> | null = null;
  /** Open RPC requests by id. */
  private readonly rpcPending = new Map<string, { resolve(v: unknown): void; reject(e: Error): void; timer: TimerHandle }>();
  private rpcSeq = 0;
  /** The last challenge nonce answered: each is answered once (a repeated challenge is the same nonce). */
  private answeredNonce: string | null = null;

  constructor(opts: WorkerOptions) {
    if (!isValidWorkerId(opts.workerId)) {
      throw new CorralError('invalid_argument', `invalid worker id ${JSON.stringify(opts.workerId)}`);
    }
    const capacity = opts.capacity ?? 1;
    if (!Number.isInteger(capacity) || capacity < 1 || capacity > MAX_CAPACITY) {
      throw new CorralError('invalid_argument', `capacity must be an integer in 1..${MAX_CAPACITY}`);
    }
    this.opts = opts;
    this.workerId = opts.workerId;
    this.requestedCapacity = capacity;
    this.effectiveCapacity = capacity;
    this.clock = opts.clock ?? systemClock;
    this.log = (opts.logger ?? silentLogger).child({ component: 'worker', workerId: opts.workerId });
    this.maxMessageBytes = opts.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
    this.heartbeatMs = opts.heartbeatIntervalMs ?? DEFAULT_HEARTBEAT_INTERVAL_MS;
    this.progressMs = opts.progressIntervalMs ?? DEFAULT_PROGRESS_INTERVAL_MS;
  }

  async start(): Promise<void> {
    if (this.state !== 'idle') return;
    this.state = 'running';
    const curve = this.opts.curve;
    const socket = new Dealer({
      routingId: freshRoutingId(),
      linger: 0,
      ...(curve ? { curveServerKey: curve.serverKey, curvePublicKey: curve.publicKey, curveSecretKey: curve.secretKey } : {}),
      maxMessageSize: this.maxMessageBytes,
      // ZMTP pings turn a dead daemon host (half-open TCP) into a reconnect.
      heartbeatInterval: this.heartbeatMs,
      heartbeatTimeout: this.heartbeatMs * 3,
      reconnectInterval: 100,
      reconnectMaxInterval: 5000,
    });
    this.socket = socket;
    this.handshakeLog = watchHandshakes(socket, this.log, { workerId: this.workerId, endpoint: this.opts.endpoint }, this.opts.onRefused);
    socket.events.on('handshake', () => {
      this.connected = true;
      this.handshakeLog?.succeeded();
      this.reconnects = 0;
      // The first handshake delivers the worker_ready queued in start(); a later one is a
      // reconnect, possibly to a restarted daemon that does not know us (invariant 3).
      if (++this.handshakes > 1) {
        this.log.info('reconnected to daemon; registering again');
        this.sendReady(true);
      }
    });
    socket.events.on('disconnect', () => {
      const wasConnected = this.connected;
      this.connected = false;
      if (wasConnected) this.log.warn('disconnected from daemon');
      this.scheduleReconnect(socket);
    });
    socket.connect(this.opts.endpoint);
    this.loopDone = this.receiveLoop(socket);
    this.sendReady(true);
    this.restartHeartbeat();
    this.log.info({ endpoint: this.opts.endpoint, capacity: this.requestedCapacity }, 'worker started');
  }

  /**
   * Invariant 1: reconnect under a new routing id, after a jittered backoff so a daemon that
   * refuses us (unknown key, connection cap) is not hammered.
   */
  private scheduleReconnect(socket: Dealer): void {
    if (this.state !== 'running' || this.reconnectTimer) return;
    const delay = backoffDelayMs(++this.reconnects, { baseMs: 100, maxMs: 5_000 });
    this.reconnectTimer = this.clock.setTimeout(() => {
      this.reconnectTimer = null;
      if (this.state !== 'running' || socket.closed) return;
      try {
        socket.disconnect(this.opts.endpoint);
      } catch {
        // already disconnected
      }
      try {
        socket.routingId = freshRoutingId();
        socket.connect(this.opts.endpoint);
        this.registered = false;
        this.sendReady(true);
      } catch (e) {
        this.log.error({ err: toError(e) }, 'reconnect failed');
        this.scheduleReconnect(socket);
      }
    }, delay);
  }

  inFlight(): number {
    return this.turns.size;
  }

  isRegistered(): boolean {
    return this.registered;
  }

  capacity(): number {
    return this.effectiveCapacity;
  }

  stop(opts: StopOptions = {}): Promise<void> {
    this.stopPromise ??= this.doStop(opts);
    return this.stopPromise;
  }

  private async doStop(opts: StopOptions): Promise<void> {
    if (this.state === 'idle') {
      this.state = 'stopped';
      return;
    }
    this.state = 'stopping';
    const graceMs = opts.graceMs ?? 0;
    if (graceMs > 0 && this.turns.size > 0) await this.waitForTurns(graceMs);
    for (const t of this.turns.values()) t.abortForStop();
    if (this.turns.size > 0) await this.waitForTurns(opts.abortWaitMs ?? 5000);
    if (this.turns.size > 0) this.log.warn({ inFlight: this.turns.size }, 'handlers ignored abort; closing anyway');
    this.heartbeatTimer?.cancel();
    this.heartbeatTimer = null;
    for (const [id, p] of this.rpcPending) {
      p.timer.cancel();
      p.reject(rpcError('worker_stopping', 'worker stopped'));
      this.rpcPending.delete(id);
    }
    this.reconnectTimer?.cancel();
    this.reconnectTimer = null;
    const socket = this.socket;
    if (socket) {
      // Give the final results/errors a bounded chance to leave: if the daemon is down, a
      // queued send would otherwise wait forever (and linger would hold the process).
      // Not connected: nothing can flush, so don't hold the process open for it.
      const lingerMs = this.connected ? (opts.lingerMs ?? 500) : 0;
      socket.linger = lingerMs;
      await this.within(this.queue.idle(), lingerMs);
      socket.close();
      await this.loopDone;
    }
    this.registered = false;
    this.state = 'stopped';
    this.log.info('worker stopped');
  }

  private async waitForTurns(ms: number): Promise<void> {
    await this.within(Promise.allSettled([...this.turns.values()].map((t) => t.done)), ms);
  }

  /** Wait for `p`, at most `ms`. */
  private async within(p: Promise<unknown>, ms: number): Promise<void> {
    await settlesWithin(this.clock, ms, p);
  }

  // ---- receive path --------------------------------------------------------------------

  private receiveLoop(socket: Dealer): Promise<void> {
    return runReceiveLoop(socket, {
      clock: this.clock,
      log: this.log,
      what: 'worker',
      handle: (frames) => this.handleFrames(frames),
    });
  }

  private handleFrames(frames: Buffer[]): void {
    if (frames.length !== 1) {
      this.log.warn({ frames: frames.length }, 'ignoring daemon message with unexpected frame count');
      return;
    }
    const parsed = parseDaemonMessage(frames[0]!);
    if (!parsed.ok) {
      // A newer daemon may send types this SDK does not know: skip them (protocol rule 5).
      const level = parsed.code === 'unknown_type' ? 'debug' : 'warn';
      this.log[level]({ code: parsed.code, error: parsed.error }, 'ignoring daemon message');
      return;
    }
    const msg = parsed.msg;
    try {
      this.opts.hooks?.onReceive?.(msg);
    } catch (e) {
      this.log.error({ err: toError(e) }, 'onReceive hook threw');
    }
    switch (msg.type) {
      case 'worker_welcome':
        if (msg.lease_ms !== undefined && msg.progress_interval_ms * 2 > msg.lease_ms) {
          // one lost progress message would then cost the lease: say so, the daemon's config is off
          this.log.warn({ progressMs: msg.progress_interval_ms, leaseMs: msg.lease_ms }, 'progress interval is more than half the lease');
        }
        if (msg.stream_chunk_bytes !== undefined) this.streamChunkBytes = msg.stream_chunk_bytes;
        this.streamTurnBytes = msg.stream_turn_bytes;
        return this.onWelcome(msg.heartbeat_interval_ms, msg.progress_interval_ms, msg.capacity);
      case 'worker_challenge':
        return this.onChallenge(msg.worker_id, msg.nonce);
      case 'turn_start':
        return this.onTurnStart(msg);
      case 'turn_steer': {
        const turn = this.turns.get(msg.turn_ref.delivery_id);
        if (turn) turn.steer(msg.turn_ref, msg.input);
        else this.log.debug({ deliveryId: msg.turn_ref.delivery_id }, 'steer for a turn not running here');
        return;
      }
      case 'turn_stream_closed':
        this.turns.get(msg.turn_ref.delivery_id)?.closeStream(msg.reason, msg.limit_bytes);
        return;
      case 'turn_cancel': {
        const turn = this.turns.get(msg.turn_ref.delivery_id);
        if (turn) turn.cancel(msg.reason);
        this.unsettled.delete(msg.turn_ref.delivery_id);
        this.tracedFinals.answered(msg.turn_ref.delivery_id);
        return;
      }
      case 'turn_failed':
        // the daemon acted on our turn_error: stop re-sending it
        this.unsettled.delete(msg.turn_ref.delivery_id);
        this.tracedFinals.answered(msg.turn_ref.delivery_id);
        this.log.debug({ deliveryId: msg.turn_ref.delivery_id, retry: msg.retry, deadLettered: msg.dead_lettered }, 'turn failed');
        return;
      case 'rpc_response': {
        const pending = this.rpcPending.get(msg.id);
        if (!pending) return;
        this.rpcPending.delete(msg.id);
        pending.timer.cancel();
        if (msg.error) pending.reject(rpcError(msg.error.code, msg.error.message));
        else pending.resolve(msg.result ?? null);
        return;
      }
      case 'turn_committed':
        this.unsettled.delete(msg.turn_ref.delivery_id);
        this.tracedFinals.answered(msg.turn_ref.delivery_id);
        this.log.debug({ deliveryId: msg.turn_ref.delivery_id, revision: msg.turn_ref.revision }, 'turn committed');
        return;
      case 'turn_rejected':
        return this.onRejected(msg.turn_ref.delivery_id, msg.turn_ref.revision, msg.reason, msg.detail);
      case 'error':
        return this.onProtocolError(msg.code, msg.message);
    }
  }

  private onWelcome(heartbeatMs: number, progressMs: number, capacity: number | undefined): void {
    const wasRegistered = this.registered;
    // a daemon older than the field registered what we asked for
    const effective = Math.min(this.requestedCapacity, capacity ?? this.requestedCapacity);
    if (effective < this.requestedCapacity && effective !== this.effectiveCapacity) {
      this.log.warn(
        { requested: this.requestedCapacity, registered: effective },
        'the daemon registered a lower capacity (allow-list cap)',
      );
    }
    this.effectiveCapacity = effective;
    this.registered = true;
    this.readySentAtMs = null;
    this.progressMs = progressMs;
    if (heartbeatMs !== this.heartbeatMs) {
      this.heartbeatMs = heartbeatMs;
      this.restartHeartbeat();
    }
    this.log.info({ heartbeatMs, progressMs, wasRegistered }, 'registered with daemon');
    this.opts.onRegistered?.();
    // Invariant 5: results the daemon has not answered may have been lost with the old session.
    for (const msg of this.unsettled.values()) this.send(msg);
  }

  /** Proves this worker's key over the daemon's nonce: `worker_ready` again, with the proof. */
  private onChallenge(workerId: string, nonce: string): void {
    if (workerId !== this.workerId || nonce === this.answeredNonce || this.state !== 'running') return;
    const curve = this.opts.curve;
    if (!curve || !this.opts.auth) {
      this.log.error('the daemon asks for a key proof, but this worker has no CURVE keys and credentials (a key file)');
      return;
    }
    let proof: string;
    try {
      proof = workerProof(curve.secretKey, curve.serverKey, this.workerId, nonce);
    } catch (e) {
      this.log.error({ err: toError(e) }, 'cannot compute the key proof');
      return;
    }
    this.answeredNonce = nonce;
    this.sendReady(true, { ...this.opts.auth, nonce, proof });
  }

  private onTurnStart(msg: TurnStart): void {
    const ref = msg.turn_ref;
    const existing = this.turns.get(ref.delivery_id);
    if (existing) {
      // A re-sent turn_start (our accept was lost): accept again, do not run twice.
      this.send({ v: PROTOCOL_VERSION, type: 'turn_accepted', turn_ref: existing.turnRef });
      return;
    }
    const refuse = (code: string, message: string): void =>
      this.send({ v: PROTOCOL_VERSION, type: 'turn_error', turn_ref: ref, error: { code, message, retryable: true } });
    if (this.state !== 'running') return refuse('worker_stopping', 'worker is stopping');
    if (this.turns.size >= this.effectiveCapacity) {
      this.log.warn({ deliveryId: ref.delivery_id, capacity: this.effectiveCapacity }, 'turn_start over capacity');
      return refuse('over_capacity', `worker ${this.workerId} is at capacity ${this.effectiveCapacity}`);
    }
    const turn = new RunningTurn(msg, {
      handler: this.opts.handler,
      workerId: this.workerId,
      clock: this.clock,
      logger: this.log,
      maxMessageBytes: this.maxMessageBytes,
      progressIntervalMs: () => this.progressMs,
      streamChunkBytes: () => Math.min(this.streamChunkBytes, this.maxMessageBytes),
      streamTurnBytes: () => this.streamTurnBytes,
      send: (m, frame) => this.sendFinalOrProgress(m, frame),
      rpc: (turnRef, method, params) => this.callRpc(turnRef, method, params),
      finished: (t) => void (this.turns.delete(t.deliveryId), this.tracedFinals.keep(t.deliveryId, t.tracedFinal)),
    });
    this.turns.set(ref.delivery_id, turn);
    this.log.debug(
      { actor: `${ref.agent_uid}/${ref.session_id}`, epoch: ref.actor_epoch, eventId: ref.event_id, deliveryId: ref.delivery_id },
      'turn started',
    );
    // Accept once this round of I/O is over, unless the handler has finished by then: its final
    // message implies the accept (docs/protocol.md §7 rule 1), and an instant turn then costs one
    // message each way instead of two.
    setImmediate(() => {
      if (this.turns.get(ref.delivery_id) === turn) this.send({ v: PROTOCOL_VERSION, type: 'turn_accepted', turn_ref: turn.turnRef });
    });
  }

  /** One RPC request for a turn; rejects with the daemon's error code, or `timeout`. */
  private callRpc(turnRef: TurnRef, method: string, params: unknown): Promise<unknown> {
    if (this.state !== 'running') return Promise.reject(rpcError('worker_stopping', 'worker is stopping'));
    const id = `${this.instance.slice(0, 8)}-${++this.rpcSeq}`;
    const timeoutMs = this.opts.rpcTimeoutMs ?? 15_000;
    return new Promise<unknown>((resolve, reject) => {
      const timer = this.clock.setTimeout(() => {
        this.rpcPending.delete(id);
        reject(rpcError('timeout', `no rpc_response within ${timeoutMs} ms`));
      }, timeoutMs);
      this.rpcPending.set(id, { resolve, reject, timer });
      this.send({ v: PROTOCOL_VERSION, type: 'rpc_request', id, method, params: (params ?? null) as never, turn_ref: turnRef });
    });
  }

  private sendFinalOrProgress(msg: WorkerMessage, frame?: string): void {
    if (msg.type === 'turn_result' || msg.type === 'turn_error') {
      if (this.unsettled.size >= MAX_UNSETTLED) {
        const oldest = this.unsettled.keys().next().value;
        if (oldest !== undefined) this.unsettled.delete(oldest);
      }
      this.unsettled.set(msg.turn_ref.delivery_id, msg);
    }
    this.send(msg, undefined, frame);
  }

  private onRejected(deliveryId: string, revision: number, reason: string, detail?: string): void {
    this.unsettled.delete(deliveryId);
    this.log.info({ deliveryId, revision, reason, detail }, 'turn rejected by daemon');
    const turn = this.turns.get(deliveryId);
    // stale_revision while running means a steer is on its way to us: keep going. Any other
    // rejection of the current ref means the daemon will never take this turn's result.
    if (turn && reason !== 'stale_revision' && turn.turnRef.revision === revision) turn.cancel(`rejected: ${reason}`, true);
    this.tracedFinals.rejected(deliveryId, reason, detail);
  }

  private onProtocolError(code: string, message: string): void {
    if (code === 'not_registered') {
      this.log.info({ message }, 'daemon does not know this worker; registering again');
      this.registered = false;
      this.sendReady(false);
      return;
    }
    if (code === 'rate_limited') {
      // a registration this connection has stands; without one, the heartbeat tick asks again
      // once per interval, within the daemon's rate
      this.log.warn({ message }, 'the daemon refused a registration for now: too many of this key');
      return;
    }
    if (code === 'unauthorized' || code === 'identity_mismatch') this.registered = false;
    this.log.error({ code, message }, 'daemon reported a protocol error');
    const refused = registrationRefusal(code, message, { workerId: this.workerId, endpoint: this.opts.endpoint });
    if (refused) this.opts.onRefused?.(refused);
  }

  // ---- send path -----------------------------------------------------------------------

  /** Send worker_ready unless one is already awaiting its welcome (debounce bursts of errors). */
  private sendReady(force: boolean, auth: WorkerAuth | undefined = this.opts.auth): void {
    if (this.state !== 'running') return;
    const now = this.clock.nowMs();
    if (!force && this.readySentAtMs !== null && now - this.readySentAtMs < this.heartbeatMs) return;
    this.readySentAtMs = now;
    this.send({
      v: PROTOCOL_VERSION,
      type: 'worker_ready',
      worker_id: this.workerId,
      capacity: this.requestedCapacity,
      sdk: this.opts.sdk ?? SDK_NAME,
      instance: this.instance,
      ...(auth ? { auth } : {}),
    });
  }

  private restartHeartbeat(): void {
    this.heartbeatTimer?.cancel();
    this.heartbeatTimer = this.clock.setInterval(() => this.heartbeatTick(), this.heartbeatMs);
  }

  private heartbeatTick(): void {
    try {
      // a draining worker keeps beating: the daemon must not declare it stale while its turns finish
      if (this.state !== 'running' && this.state !== 'stopping') return;
      if (!this.registered) return this.state === 'running' ? this.sendReady(false) : undefined;
      // Skip if the last one has not left yet (daemon unreachable): don't pile them up.
      if (this.heartbeatQueued) return;
      this.heartbeatQueued = true;
      this.send(
        { v: PROTOCOL_VERSION, type: 'worker_heartbeat', worker_id: this.workerId, in_flight: this.turns.size },
        () => void (this.heartbeatQueued = false),
      );
    } catch (e) {
      this.log.error({ err: toError(e) }, 'heartbeat tick failed');
    }
  }

  /**
   * Apply hooks, then queue each resulting frame. `frame` is `msg` already encoded, used when no
   * hook applies. Never throws, never rejects.
   */
  private send(msg: WorkerMessage, onSent?: () => void, frame?: string): void {
    const out = applySendHooks(this.opts.hooks, msg, this.log);
    if (out === undefined) this.queueFrames([frame === undefined ? msg : { type: msg.type, encoded: frame }], onSent);
    else if (out.length === 0) onSent?.();
    else this.queueFrames(out, onSent);
  }

  /** Queues each message, or its frame when already encoded; a message is encoded in its turn (a failure is logged). */
  private queueFrames(items: (WorkerMessage | { type: string; encoded: string })[], onSent?: () => void): void {
    items.forEach((m, i) => {
      const last = i === items.length - 1;
      void this.queue.run(async () => {
        try {
          const socket = this.socket;
          if (!socket || socket.closed) return;
          await socket.send('encoded' in m ? m.encoded : encodeFrame(m));
        } catch (e) {
          if (!this.socket?.closed) this.log.warn({ err: toError(e), type: m.type }, 'send to daemon failed');
        } finally {
          if (last) onSent?.();
        }
      });
    });
  }
}

/** An RPC failure: `code` is the daemon's (`not_live`, `busy`, `timeout`, …). */
function rpcError(code: string, message: string): Error & { code: string } {
  const err = new Error(`rpc ${code}: ${message}`) as Error & { code: string };
  err.code = code;
  return err;
}

/** 128 random bits as hex: unguessable, and never starting with the zero byte libzmq reserves. */
function freshRoutingId(): string {
  return `c${randomBytes(16).toString('hex')}`;
}
