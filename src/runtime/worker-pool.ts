/**
 * The in-memory view of the workers connected to this daemon's broker, and their free slots.
 * A projection only: rebuilt from `worker_ready` messages; the database keeps the record.
 *
 * Who gets a turn (`acquire`):
 *  P1 only a ready worker with a free slot whose key's scope covers the turn's agent
 *     (src/base/agent-scope.ts): a scoped key is never given a turn of another agent;
 *  P2 a worker that handed turns back is in back-off (`handBackBackoffMs`: doubling with each
 *     consecutive hand-back, reset by a committed turn) and is offered a turn only when no other
 *     worker able to take it is registered: its peers get first offer, and a worker that hands
 *     back everything gets fewer and fewer offers instead of seeing every turn (and its data);
 *  P3 a worker holds at most its window of turns: `initialWindow` (CORRAL_WORKER_INITIAL_TURNS)
 *     when it registers (a new run) or hands a turn back, one more for each turn it accepts or commits, up to its
 *     capacity. A worker has to show it takes turns before it is given its full capacity, so one
 *     that registers a large capacity and takes nothing cannot be offered a whole batch at once;
 *     an honest one opens its window within a round trip per doubling;
 *  P4 among the rest, the one with the most free slots in its window.
 */
import { agentInScope, type AgentScope } from '../base/agent-scope.ts';

/** First back-off after a hand-back, and the longest. */
export const HAND_BACK_BACKOFF_MIN_MS = 200;
export const HAND_BACK_BACKOFF_MAX_MS = 60_000;

/** P2: how long a worker waits behind its peers after `consecutive` hand-backs in a row (0: not at all). */
export function handBackBackoffMs(consecutive: number): number {
  if (consecutive <= 0) return 0;
  return Math.min(HAND_BACK_BACKOFF_MAX_MS, HAND_BACK_BACKOFF_MIN_MS * 2 ** Math.min(30, consecutive - 1));
}

export interface PooledWorker {
  id: string;
  /** The worker process run (from worker_ready), if it says. */
  instance: string | undefined;
  capacity: number;
  /** Event ids this daemon dispatched to the worker and has not seen settle. */
  inFlight: Set<string>;
  lastSeenMs: number;
  status: 'ready' | 'stale';
  /** The agents its key may serve; undefined: all. */
  agents: AgentScope;
  /** Turns handed back in a row since its last committed turn (P2). */
  handBacks: number;
  /** Until when it waits behind its peers (P2). */
  backoffUntilMs: number;
  /** The turns it may hold now (P3): up to `capacity`. */
  window: number;
  /**
   * Which registration this is, counted by the pool across all workers: a send that failed on the
   * route of an earlier registration says nothing about this one (`remove`'s `registration`).
   */
  registration: number;
}

const freeOf = (w: PooledWorker) => Math.min(w.capacity, w.window) - w.inFlight.size;

export class WorkerPool {
  private readonly workers = new Map<string, PooledWorker>();
  /** P3: the turns a worker may hold before it has accepted or committed any. */
  private readonly initialWindow: number;

  constructor(opts: { initialWindow: number }) {
    this.initialWindow = opts.initialWindow;
  }

  private readonly eventToWorker = new Map<string, string>();
  private registrations = 0;

  /**
   * (Re-)registers a worker. A registration from a new process run (a different `instance`, or
   * none given) means the old run's turns are lost: they are returned, and their slots freed. A
   * reconnect of the same run keeps its turns.
   */
  register(
    id: string,
    capacity: number,
    nowMs: number,
    instance?: string,
    agents?: AgentScope,
  ): { restarted: boolean; lostEvents: string[] } {
    const previous = this.workers.get(id);
    const sameRun = previous !== undefined && instance !== undefined && previous.instance === instance;
    if (previous && sameRun) {
      previous.registration = ++this.registrations;
      previous.capacity = capacity;
      previous.lastSeenMs = nowMs;
      previous.status = 'ready';
      previous.agents = agents;
      return { restarted: false, lostEvents: [] };
    }
    const lostEvents = previous ? [...previous.inFlight] : [];
    for (const ev of lostEvents) this.eventToWorker.delete(ev);
    // a restart does not wipe a record of handing turns back
    const handBacks = previous?.handBacks ?? 0;
    this.workers.set(id, {
      id,
      instance,
      capacity,
      inFlight: new Set(),
      lastSeenMs: nowMs,
      status: 'ready',
      agents,
      handBacks,
      backoffUntilMs: previous?.backoffUntilMs ?? 0,
      window: this.initialWindow,
      registration: ++this.registrations,
    });
    return { restarted: previous !== undefined, lostEvents };
  }

  /** The agents `id`'s key may serve (undefined: all, or not registered). */
  scopeOf(id: string): AgentScope {
    return this.workers.get(id)?.agents;
  }

  /** P2, P3: `id` handed a turn back; it waits behind its peers for longer each time in a row. */
  handedBack(id: string, nowMs: number): void {
    const w = this.workers.get(id);
    if (!w) return;
    w.handBacks++;
    w.backoffUntilMs = nowMs + handBackBackoffMs(w.handBacks);
    w.window = this.initialWindow;
  }

  /** P3: `id` accepted a turn: its window grows by one. */
  accepted(id: string): void {
    const w = this.workers.get(id);
    if (w) w.window = Math.min(w.capacity, w.window + 1);
  }

  /** P2, P3: `id` committed a turn: its back-off is over, its window grows by one. */
  committed(id: string): void {
    const w = this.workers.get(id);
    if (!w) return;
    w.window = Math.min(w.capacity, w.window + 1);
    w.handBacks = 0;
    w.backoffUntilMs = 0;
  }

  seen(id: string, nowMs: number): boolean {
    const w = this.workers.get(id);
    if (!w) return false;
    w.lastSeenMs = nowMs;
    w.status = 'ready';
    return true;
  }

  get size(): number {
    return this.workers.size;
  }

  isReady(id: string): boolean {
    return this.workers.get(id)?.status === 'ready';
  }

  /** Free slots over ready workers, leaving out those in back-off while a peer is ready (P2). */
  freeSlots(nowMs: number): number {
    const peerReady = [...this.workers.values()].some((w) => w.status === 'ready' && w.backoffUntilMs <= nowMs);
    let n = 0;
    for (const w of this.workers.values()) {
      if (w.status !== 'ready' || (peerReady && w.backoffUntilMs > nowMs)) continue;
      n += Math.max(0, freeOf(w));
    }
    return n;
  }

  /**
   * Reserves a slot for `eventId`, a turn of `agentUid`, on the worker P1–P4 choose, avoiding
   * `exclude`. Undefined: no worker may take it now.
   */
  acquire(eventId: string, agentUid: string, nowMs: number, exclude: ReadonlySet<string> = new Set()): string | undefined {
    this.release(eventId);
    let best: PooledWorker | undefined;
    let backedOff: PooledWorker | undefined;
    let peer = false;
    for (const w of this.workers.values()) {
      if (w.status !== 'ready' || exclude.has(w.id) || !agentInScope(w.agents, agentUid)) continue;
      const inBackoff = w.backoffUntilMs > nowMs;
      if (!inBackoff) peer = true;
      const free = freeOf(w);
      if (free <= 0) continue;
      if (inBackoff) {
        if (!backedOff || w.backoffUntilMs < backedOff.backoffUntilMs) backedOff = w;
      } else if (!best || free > freeOf(best)) best = w;
    }
    // P2: a worker in back-off is offered a turn only when no peer could take it at all
    const chosen = best ?? (peer ? undefined : backedOff);
    if (!chosen) return undefined;
    chosen.inFlight.add(eventId);
    this.eventToWorker.set(eventId, chosen.id);
    return chosen.id;
  }

  /** Frees the slot held for `eventId`, if any. Returns the worker it was on. */
  release(eventId: string): string | undefined {
    const id = this.eventToWorker.get(eventId);
    if (id === undefined) return undefined;
    this.eventToWorker.delete(eventId);
    this.workers.get(id)?.inFlight.delete(eventId);
    return id;
  }

  /** Moves the slot held for `from` to `to`, on the same worker. Returns that worker (undefined: `from` held none). */
  rekey(from: string, to: string): string | undefined {
    const id = this.eventToWorker.get(from);
    const w = id === undefined ? undefined : this.workers.get(id);
    this.release(from);
    if (!w) return undefined;
    this.release(to);
    w.inFlight.add(to);
    this.eventToWorker.set(to, w.id);
    return w.id;
  }

  workerOf(eventId: string): string | undefined {
    return this.eventToWorker.get(eventId);
  }

  /** The capacity `id` registered with (0 when it is not registered). */
  capacityOf(id: string): number {
    return this.workers.get(id)?.capacity ?? 0;
  }

  /** Ready workers not seen since `nowMs - staleMs`; they are marked stale and their events returned. */
  takeStale(nowMs: number, staleMs: number): { id: string; events: string[] }[] {
    const out: { id: string; events: string[] }[] = [];
    for (const w of this.workers.values()) {
      if (w.status === 'ready' && nowMs - w.lastSeenMs >= staleMs) {
        w.status = 'stale';
        out.push({ id: w.id, events: [...w.inFlight] });
      }
    }
    return out;
  }

  /** Forgets workers stale for longer than `forgetAfterMs` (they hold no slots; memory stays bounded). */
  pruneStale(nowMs: number, forgetAfterMs: number): string[] {
    const out: string[] = [];
    for (const w of this.workers.values()) {
      if (w.status === 'stale' && nowMs - w.lastSeenMs >= forgetAfterMs) out.push(w.id);
    }
    for (const id of out) this.remove(id);
    return out;
  }

  /** The registration `id` is in now (undefined: not registered). */
  registrationOf(id: string): number | undefined {
    return this.workers.get(id)?.registration;
  }

  /** Removes `id`, or, given `registration`, only while it is still in that registration. */
  remove(id: string, registration?: number): string[] {
    const w = this.workers.get(id);
    if (!w || (registration !== undefined && w.registration !== registration)) return [];
    this.workers.delete(id);
    const events = [...w.inFlight];
    for (const ev of events) this.eventToWorker.delete(ev);
    return events;
  }
}
