/**
 * SessionController and ActorDirectory.
 *
 * A SessionController is the in-process home of one actor key. It owns the actor's in-flight
 * turn in this process (`turn`: its fence, worker and timings, from the begin transaction until
 * the attempt settles) and serialises the actor's runtime operations (begin and dispatch,
 * commit, failure, steering) so two of them never interleave here. It holds no durable state:
 * correctness across processes comes from the database fence, and a turn whose operation fails
 * is settled by its lease (the watchdog fails the attempt; pg-boss retries it).
 *
 * The ActorDirectory starts controllers on demand and idempotently (two concurrent wakes of one
 * actor get the same controller) and releases idle ones after a linger, so memory grows with
 * active actors only.
 */
import { formatActorKey, type ActorKey } from '../base/actor-key.ts';
import type { Clock, TimerHandle } from '../base/clock.ts';
import { toError } from '../base/errors.ts';
import { SerialQueue } from '../base/serial-queue.ts';
import type { Fence } from '../db/turns/fence.ts';
import type { StartedTurn } from './turn-begin.ts';
import type { AttemptTrace } from '../base/turn-tracer.ts';

/** An actor's turn in flight in this process: one attempt of one event. */
/**
 * Where an in-flight turn stands on the dispatch side. Only `dispatchTo` moves it:
 *  D1 `parked`: no worker holds it; it waits for a free slot. From any state.
 *  D2 `assigned`: a worker's slot is taken for it (a new worker, or the same one again): its
 *     `turn_start` is not known to have gone out. From any state.
 *  D3 `sent`: its `turn_start` went out to that worker (again, when it is sent again). Only from
 *     `assigned` or `sent`.
 *  D4 `accepted`: that worker said `turn_accepted`: it has the turn. Only from `assigned` or
 *     `sent`, and only for the worker holding it.
 */
export type DispatchState = { kind: 'parked' } | { kind: 'assigned' | 'sent' | 'accepted'; workerId: string };

/** A move of `dispatchTo`. */
export type DispatchMove = { to: 'parked' } | { to: 'assigned'; workerId: string } | { to: 'sent' } | { to: 'accepted'; workerId: string };

export interface InFlightTurn {
  fence: Fence;
  /** Where it stands (D1–D4); moved by `dispatchTo` only. */
  readonly dispatch: DispatchState;
  started: StartedTurn;
  /** When its turn_start was first sent (clock ms), for the commit-latency histogram. */
  readonly firstSentAtMs?: number;
  /** When this process began the attempt (clock ms), for the maximum turn duration. */
  startedAtMs: number;
  /** The attempt's spans, when the daemon traces. */
  trace?: AttemptTrace | undefined;
}

/**
 * Moves `turn` as `move` says (D1–D4); false, changing nothing, when its state does not allow
 * the move (an accept from another worker, a `sent` for a parked turn). `nowMs` is recorded as
 * the first send's time.
 */
export function dispatchTo(turn: InFlightTurn, move: DispatchMove, nowMs: number): boolean {
  const t = turn as { dispatch: DispatchState; firstSentAtMs?: number };
  const s = t.dispatch;
  switch (move.to) {
    case 'parked':
      t.dispatch = { kind: 'parked' };
      return true;
    case 'assigned':
      t.dispatch = { kind: 'assigned', workerId: move.workerId };
      return true;
    case 'sent':
      if (s.kind !== 'assigned' && s.kind !== 'sent') return false;
      t.dispatch = { kind: 'sent', workerId: s.workerId };
      t.firstSentAtMs ??= nowMs;
      return true;
    case 'accepted':
      if ((s.kind !== 'assigned' && s.kind !== 'sent') || s.workerId !== move.workerId) return false;
      t.dispatch = { kind: 'accepted', workerId: s.workerId };
      return true;
  }
}

/** The worker holding `turn`, or null while it is parked. */
export function workerOf(turn: InFlightTurn): string | null {
  return turn.dispatch.kind === 'parked' ? null : turn.dispatch.workerId;
}

/** A new turn's first state: its worker's slot taken, or parked. */
export function firstDispatch(workerId: string | null): DispatchState {
  return workerId === null ? { kind: 'parked' } : { kind: 'assigned', workerId };
}

export class SessionController {
  readonly key: ActorKey;
  readonly name: string;
  /** The actor's turn in flight in this process, if any (see `hold` / `letGo`). */
  turn: InFlightTurn | undefined;
  private readonly operations = new SerialQueue();
  private readonly onIdle: () => void;

  constructor(key: ActorKey, onIdle: () => void) {
    this.key = key;
    this.name = formatActorKey(key);
    this.onIdle = onIdle;
  }

  /** Runs `fn` after every operation queued before it on this actor. */
  run<T>(fn: () => Promise<T>): Promise<T> {
    const result = this.operations.run(fn);
    result.then(
      () => this.settle(),
      () => this.settle(),
    );
    return result;
  }

  get idle(): boolean {
    return this.operations.depth === 0 && this.turn === undefined;
  }

  /** The actor's turn in flight here is `turn` (its begin transaction committed). */
  hold(turn: InFlightTurn): void {
    this.turn = turn;
  }

  /** The attempt of `eventId` is over in this process; the controller may be released when idle. */
  letGo(eventId: string): InFlightTurn | undefined {
    const turn = this.turn;
    if (turn?.fence.eventId !== eventId) return undefined;
    this.turn = undefined;
    if (this.idle) this.onIdle();
    return turn;
  }

  private settle(): void {
    if (this.idle) this.onIdle();
  }
}

/**
 * Where controllers live while they exist: the daemon makes each one a dynamic child of its
 * session-controller supervisor (so they appear in its event stream and stop with it).
 */
export interface ControllerHost {
  adopt(c: SessionController): void;
  release(c: SessionController): void;
}

export class ActorDirectory {
  private readonly controllers = new Map<string, SessionController>();
  private host: ControllerHost | undefined;
  private readonly releaseTimers = new Map<string, TimerHandle>();
  private stopped = false;
  private readonly clock: Clock;
  private readonly lingerMs: number;
  private readonly onError: (e: Error) => void;

  constructor(opts: { clock: Clock; lingerMs?: number; onError?: (e: Error) => void }) {
    this.clock = opts.clock;
    this.lingerMs = opts.lingerMs ?? 5_000;
    this.onError = opts.onError ?? (() => undefined);
  }

  /** The controller of `key`, started if needed. Idempotent and synchronous: no race can start two. */
  wake(key: ActorKey): SessionController {
    const name = formatActorKey(key);
    this.releaseTimers.get(name)?.cancel();
    this.releaseTimers.delete(name);
    let c = this.controllers.get(name);
    if (!c) {
      const controller = new SessionController(key, () => this.scheduleRelease(controller));
      this.controllers.set(name, controller);
      this.host?.adopt(controller);
      c = controller;
    }
    return c;
  }

  /** Attaches (or detaches) the host; existing controllers are adopted by the new host. */
  setHost(host: ControllerHost | undefined): void {
    this.host = host;
    if (host) for (const c of this.controllers.values()) host.adopt(c);
  }

  get(key: ActorKey): SessionController | undefined {
    return this.controllers.get(formatActorKey(key));
  }

  get size(): number {
    return this.controllers.size;
  }

  private scheduleRelease(c: SessionController): void {
    if (this.stopped || this.releaseTimers.has(c.name)) return;
    try {
      this.releaseTimers.set(
        c.name,
        this.clock.setTimeout(() => {
          this.releaseTimers.delete(c.name);
          if (c.idle && this.controllers.get(c.name) === c) this.release(c);
        }, this.lingerMs),
      );
    } catch (e) {
      this.onError(toError(e));
    }
  }

  /**
   * Shutdown: cancels the pending releases. Their timers (the linger, 5 s by default) would
   * otherwise keep a stopped daemon's process alive that long after everything else closed.
   */
  stop(): void {
    this.stopped = true;
    for (const t of this.releaseTimers.values()) t.cancel();
    this.releaseTimers.clear();
  }

  private release(c: SessionController): void {
    this.releaseTimers.get(c.name)?.cancel();
    this.releaseTimers.delete(c.name);
    this.controllers.delete(c.name);
    this.host?.release(c);
  }
}
