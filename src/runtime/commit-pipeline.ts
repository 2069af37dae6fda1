/**
 * Group commit of worker replies (results, accepts, progress): many turns' replies in one
 * transaction, the way a database groups its own log writes.
 *
 * P1 No timer. A reply that arrives while no reply transaction runs starts one at once (alone,
 *    on the single-reply path); replies that arrive while one runs wait and go together in the
 *    next one, started as soon as it ends. Latency at low load is one transaction; batches grow
 *    only under load.
 * P2 Each reply gets its own outcome, or a `FenceRejected` with its reason. A reply that fails
 *    its fence changes nothing and does not disturb the others in its batch.
 * P3 A batch whose transaction fails for any reason but a lost connection is retried member by
 *    member on the single-reply path, so one poison reply cannot block other actors.
 * P4 A lost connection fails every member of the batch with that error: the caller's database
 *    retry submits them again.
 */
import { FenceRejected, isConnectionError } from '../errors.ts';
import type { ReplyOutcome, ReplyRequest } from './turns.ts';

type Settled = Exclude<ReplyOutcome, { outcome: 'rejected' }>;

export interface CommitPipelineDeps {
  /** One transaction for the whole batch (TurnStore.replyMany). */
  replyMany(requests: readonly ReplyRequest[]): Promise<ReplyOutcome[]>;
  /** One transaction for one reply (TurnStore.commit / accept / progress); throws `FenceRejected`. */
  replyOne(request: ReplyRequest): Promise<Settled>;
  /** Largest batch; more waiting results go in the next transaction. */
  maxBatch?: number;
  onBatch?: (size: number, fallback: boolean) => void;
}

interface Waiting {
  request: ReplyRequest;
  resolve: (o: Settled) => void;
  reject: (e: unknown) => void;
}

/** The outcome a reply of each kind settles with. */
export type OutcomeOf<R extends ReplyRequest> = R extends { kind: 'commit' }
  ? Extract<Settled, { outcome: 'committed' | 'duplicate' }>
  : R extends { kind: 'accept' }
    ? Extract<Settled, { outcome: 'accepted' }>
    : Extract<Settled, { outcome: 'extended' }>;

export class CommitPipeline {
  private readonly deps: CommitPipelineDeps;
  private readonly maxBatch: number;
  private waiting: Waiting[] = [];
  private flushing = false;

  constructor(deps: CommitPipelineDeps) {
    this.deps = deps;
    this.maxBatch = deps.maxBatch ?? 256;
  }

  /** Applies `request` with whatever else is waiting (P1); rejects with `FenceRejected` (P2). */
  submit<R extends ReplyRequest>(request: R): Promise<OutcomeOf<R>> {
    return new Promise<Settled>((resolve, reject) => {
      this.waiting.push({ request, resolve, reject });
      if (!this.flushing) void this.flush();
    }) as Promise<OutcomeOf<R>>;
  }

  /** Results waiting for the next transaction. */
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

  private async runOne(w: Waiting): Promise<void> {
    try {
      w.resolve(await this.deps.replyOne(w.request));
    } catch (e) {
      w.reject(e);
    }
  }

  private async runBatch(batch: Waiting[]): Promise<void> {
    let outcomes: ReplyOutcome[];
    try {
      outcomes = await this.deps.replyMany(batch.map((w) => w.request));
    } catch (e) {
      if (isConnectionError(e)) {
        for (const w of batch) w.reject(e); // P4
        return;
      }
      this.deps.onBatch?.(batch.length, true);
      for (const w of batch) await this.runOne(w); // P3
      return;
    }
    this.deps.onBatch?.(batch.length, false);
    batch.forEach((w, i) => {
      const o = outcomes[i]!;
      if (o.outcome === 'rejected') w.reject(new FenceRejected(o.reason));
      else w.resolve(o);
    });
  }
}
