/**
 * The in-memory view of the workers connected to this daemon's broker, and their free slots.
 * A projection only: rebuilt from `worker_ready` messages; the database keeps the record.
 */
export interface PooledWorker {
  id: string;
  /** The worker process run (from worker_ready), if it says. */
  instance: string | undefined;
  capacity: number;
  /** Event ids this daemon dispatched to the worker and has not seen settle. */
  inFlight: Set<string>;
  lastSeenMs: number;
  status: 'ready' | 'stale';
}

export class WorkerPool {
  private readonly workers = new Map<string, PooledWorker>();
  private readonly eventToWorker = new Map<string, string>();

  /**
   * (Re-)registers a worker. A registration from a new process run (a different `instance`, or
   * none given) means the old run's turns are lost: they are returned, and their slots freed. A
   * reconnect of the same run keeps its turns.
   */
  register(id: string, capacity: number, nowMs: number, instance?: string): { restarted: boolean; lostEvents: string[] } {
    const previous = this.workers.get(id);
    const sameRun = previous !== undefined && instance !== undefined && previous.instance === instance;
    if (previous && sameRun) {
      previous.capacity = capacity;
      previous.lastSeenMs = nowMs;
      previous.status = 'ready';
      return { restarted: false, lostEvents: [] };
    }
    const lostEvents = previous ? [...previous.inFlight] : [];
    for (const ev of lostEvents) this.eventToWorker.delete(ev);
    this.workers.set(id, { id, instance, capacity, inFlight: new Set(), lastSeenMs: nowMs, status: 'ready' });
    return { restarted: previous !== undefined, lostEvents };
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

  /** Total free slots over ready workers. */
  freeSlots(): number {
    let n = 0;
    for (const w of this.workers.values()) if (w.status === 'ready') n += Math.max(0, w.capacity - w.inFlight.size);
    return n;
  }

  /** Reserves a slot for `eventId` on the least loaded ready worker, avoiding `exclude`. */
  acquire(eventId: string, exclude: ReadonlySet<string> = new Set()): string | undefined {
    this.release(eventId);
    let best: PooledWorker | undefined;
    for (const w of this.workers.values()) {
      if (w.status !== 'ready' || exclude.has(w.id)) continue;
      const free = w.capacity - w.inFlight.size;
      if (free <= 0) continue;
      if (!best || free > best.capacity - best.inFlight.size) best = w;
    }
    if (!best) return undefined;
    best.inFlight.add(eventId);
    this.eventToWorker.set(eventId, best.id);
    return best.id;
  }

  /** Frees the slot held for `eventId`, if any. Returns the worker it was on. */
  release(eventId: string): string | undefined {
    const id = this.eventToWorker.get(eventId);
    if (id === undefined) return undefined;
    this.eventToWorker.delete(eventId);
    this.workers.get(id)?.inFlight.delete(eventId);
    return id;
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

  remove(id: string): string[] {
    const w = this.workers.get(id);
    if (!w) return [];
    this.workers.delete(id);
    const events = [...w.inFlight];
    for (const ev of events) this.eventToWorker.delete(ev);
    return events;
  }
}
