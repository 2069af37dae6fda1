/**
 * Group commit: many callers' writes in one transaction, the way a database groups its own log
 * writes. Used for worker replies (results, accepts, progress) and for the begins of fetched jobs.
 *
 * G1 No timer. A request that arrives while no transaction of this writer runs starts one at
 *    once (alone, on the single-request path); requests that arrive while one runs wait and go
 *    together in the next one, started as soon as it ends. Latency at low load is one
 *    transaction; batches grow only under load.
 * G2 Each request gets its own outcome (or its own error) from `many`, in request order.
 * G3 A batch whose transaction fails for any reason but a lost connection is retried member by
 *    member on the single-request path, so one poison request cannot block the others.
 * G4 A lost connection fails every member of the batch with that error: the callers' database
 *    retry submits them again.
 */
import { isConnectionError } from '../base/errors.ts';

/** A member's result from `many`: its value, or the error only that member gets. */
export type Settlement<O> = { ok: true; value: O } | { ok: false; error: unknown };

export interface GroupWriterDeps<R, O> {
  /** One transaction for the whole batch; one settlement per request, in order. */
  many(requests: readonly R[]): Promise<Settlement<O>[]>;
  /** One transaction for one request. */
  one(request: R): Promise<O>;
  /** Largest batch; more waiting requests go in the next transaction. */
  maxBatch?: number;
  onBatch?: (size: number, fellBack: boolean) => void;
}

interface Waiting<R, O> {
  request: R;
  resolve: (o: O) => void;
  reject: (e: unknown) => void;
}

export class GroupWriter<R, O> {
  private readonly deps: GroupWriterDeps<R, O>;
  private readonly maxBatch: number;
  private waiting: Waiting<R, O>[] = [];
  private flushing = false;

  constructor(deps: GroupWriterDeps<R, O>) {
    this.deps = deps;
    this.maxBatch = deps.maxBatch ?? 256;
  }

  /** Writes `request` with whatever else is waiting (G1). */
  submit(request: R): Promise<O> {
    return new Promise<O>((resolve, reject) => {
      this.waiting.push({ request, resolve, reject });
      if (!this.flushing) void this.flush();
    });
  }

  /**
   * Takes back the waiting requests `match` selects (not yet in a transaction): each settles with
   * `outcome` without being written. Returns how many.
   */
  withdraw(match: (request: R) => boolean, outcome: O): number {
    const keep: Waiting<R, O>[] = [];
    let n = 0;
    for (const w of this.waiting) {
      if (match(w.request)) {
        n++;
        w.resolve(outcome);
      } else keep.push(w);
    }
    this.waiting = keep;
    return n;
  }

  /** Requests waiting for the next transaction. */
  get pending(): number {
    return this.waiting.length;
  }

  private async flush(): Promise<void> {
    this.flushing = true;
    try {
      while (this.waiting.length > 0) {
        const batch = this.waiting.splice(0, this.maxBatch);
        await (batch.length === 1 ? this.runOne(batch[0]!) : this.runBatch(batch));
      }
    } finally {
      this.flushing = false;
    }
  }

  private async runOne(w: Waiting<R, O>): Promise<void> {
    try {
      w.resolve(await this.deps.one(w.request));
    } catch (e) {
      w.reject(e);
    }
  }

  private async runBatch(batch: Waiting<R, O>[]): Promise<void> {
    let settled: Settlement<O>[];
    try {
      settled = await this.deps.many(batch.map((w) => w.request));
    } catch (e) {
      if (isConnectionError(e)) {
        for (const w of batch) w.reject(e); // G4
        return;
      }
      this.deps.onBatch?.(batch.length, true);
      for (const w of batch) await this.runOne(w); // G3
      return;
    }
    this.deps.onBatch?.(batch.length, false);
    batch.forEach((w, i) => {
      const s = settled[i]!;
      if (s.ok) w.resolve(s.value);
      else w.reject(s.error);
    });
  }
}
