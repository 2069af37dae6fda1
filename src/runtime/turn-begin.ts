/**
 * T2, the begin of fetched jobs (docs/failure-semantics.md): each job's actor gets an activation
 * (its warm one, else a new one under a higher epoch), and the job a delivery carrying the fence
 * and a `started` turn. Batched: the actors of a batch with a warm activation in one statement,
 * those with none live in another, the rest (a stale live activation to supersede) in one
 * transaction.
 */
import { formatActorKey, type ActorKey } from '../actor-key.ts';
import type { Db, Tx } from '../db/client.ts';
import { inTransaction } from '../db/tx.ts';
import * as activations from '../db/activations.ts';
import type { ActivationRow } from '../db/activations.ts';
import { nextEpochsMany } from '../db/actors.ts';
import { loadContextJsonMany, type ContextLimits } from '../db/history.ts';
import * as turnRows from '../db/turn-rows.ts';
import { CorralError, isConnectionError } from '../errors.ts';
import { fenceOf } from './fence.ts';
import type { Settlement } from './group-writer.ts';
import type { FetchedJob, StartedTurn } from './turns.ts';

/** A fetched job to begin, and the worker whose slot it holds (null: it waits for one). */
export interface BeginRequest {
  job: FetchedJob;
  workerId: string | null;
}

const keyOf = (job: FetchedJob): ActorKey => ({ agentUid: job.data.agentUid, sessionId: job.data.sessionId });

export interface TurnBeginnerDeps {
  db: Db;
  ownerId: string;
  leaseMs: number;
  /** Fails a live activation still holding an older attempt of an actor being begun (rare). */
  supersede(tx: Tx, stale: ActivationRow): Promise<unknown>;
  /** Told when a begun turn's context could not be read (it starts without). */
  onContextError?: (e: unknown) => void;
}

export class TurnBeginner {
  private readonly deps: TurnBeginnerDeps;

  constructor(deps: TurnBeginnerDeps) {
    this.deps = deps;
  }

  /**
   * T2 for a batch of fetched jobs (group begin), at most one per actor (pg-boss's key_strict_fifo
   * fetch gives no actor two jobs at once, and an actor's controller begins one at a time). Takes
   * each actor's activation (a warm one, else a new one under a higher epoch) and writes the
   * delivery and the `started` turn carrying the fence; with `context`, each turn also gets its
   * conversation's context for turn_start.
   *
   * The common cases take ONE statement each, its own transaction (`beginTurnsMany`): first the
   * actors with a warm activation, then those with none live (new actors, or ones whose
   * activation was stopped). The rest (an actor whose live activation still holds an older
   * attempt: rare; or all of them, when the second statement failed) go through one transaction
   * of a constant number of statements: live activations locked and superseded (per actor),
   * epochs taken, activations, deliveries and turns inserted; their context is read after it
   * commits. Once a statement committed, a failure of the rest settles only the members it
   * concerns (one by one, unless the connection was lost).
   */
  async beginMany(requests: readonly BeginRequest[], context?: ContextLimits): Promise<Settlement<StartedTurn>[]> {
    if (new Set(requests.map((r) => formatActorKey(keyOf(r.job)))).size !== requests.length) {
      throw new CorralError('internal', 'a begin batch holds two jobs of one actor');
    }
    const out: (Settlement<StartedTurn> | undefined)[] = requests.map(() => undefined);
    const pending = () => requests.flatMap((r, i) => (out[i] ? [] : [{ r, i }]));
    const beginBy = async (kind: 'warm' | 'new', members: { r: BeginRequest; i: number }[]): Promise<void> => {
      const begun = await turnRows.beginTurnsMany(
        this.deps.db,
        members.map(({ r }) => ({
          key: keyOf(r.job),
          eventId: r.job.id,
          jobRetryCount: r.job.retryCount,
          workerId: r.workerId,
          input: r.job.data.payload,
        })),
        { kind, leaseMs: this.deps.leaseMs, ownerId: this.deps.ownerId, context },
      );
      for (const { r, i } of members) {
        const b = begun.get(formatActorKey(keyOf(r.job)));
        if (b) out[i] = { ok: true, value: this.startedTurn(r.job, r.workerId, b.activation, b.deliveryId, b.contextJson) };
      }
    };
    await beginBy('warm', pending());
    if (pending().length > 0) {
      try {
        await beginBy('new', pending());
      } catch (e) {
        if (isConnectionError(e)) {
          for (const m of pending()) out[m.i] = { ok: false, error: e };
          return out as Settlement<StartedTurn>[];
        }
        // nothing was written: the transaction below sorts out what broke the statement
      }
    }
    const rest = requests.flatMap((r, i) => (out[i] ? [] : [{ r, i }]));
    if (rest.length === 0) return out as Settlement<StartedTurn>[];
    const settleRest = async (members: typeof rest): Promise<void> => {
      const started = await this.beginSupersedingMany(members.map((m) => m.r));
      await this.attachContext(started, context);
      members.forEach((m, k) => (out[m.i] = { ok: true, value: started[k]! }));
    };
    try {
      await settleRest(rest);
    } catch (e) {
      if (isConnectionError(e) || rest.length === 1) {
        for (const m of rest) out[m.i] = { ok: false, error: e };
      } else {
        // one poison job must not hold the others back
        for (const m of rest) {
          try {
            await settleRest([m]);
          } catch (err) {
            out[m.i] = { ok: false, error: err };
          }
        }
      }
    }
    return out as Settlement<StartedTurn>[];
  }

  /**
   * The rest of `beginMany`: new activations under a higher epoch, in one transaction, superseding
   * any live activation of the actors first.
   */
  private async beginSupersedingMany(requests: readonly BeginRequest[]): Promise<StartedTurn[]> {
    return inTransaction(this.deps.db, async (tx) => {
      const keys = requests.map((r) => keyOf(r.job));
      // A live activation still running an older attempt of such an actor is superseded first (rare).
      for (const stale of await activations.lockLiveActivationsMany(tx, keys)) {
        await this.deps.supersede(tx, stale);
      }
      const epochs = await nextEpochsMany(tx, keys);
      const created = await activations.insertActivationsMany(
        tx,
        requests.map((r) => ({ key: keyOf(r.job), epoch: epochs.get(formatActorKey(keyOf(r.job)))!, eventId: r.job.id })),
        { ownerId: this.deps.ownerId, leaseMs: this.deps.leaseMs },
      );
      const fresh = new Map(created.map((a) => [`${a.agentUid}/${a.sessionId}`, a]));
      const activationsOf = requests.map((r) => fresh.get(formatActorKey(keyOf(r.job)))!);
      const deliveryIds = await turnRows.insertTurnRowsMany(
        tx,
        requests.map((r, i) => ({
          activation: activationsOf[i]!,
          eventId: r.job.id,
          jobRetryCount: r.job.retryCount,
          workerId: r.workerId,
          input: r.job.data.payload,
        })),
      );
      return requests.map((r, i) => this.startedTurn(r.job, r.workerId, activationsOf[i]!, deliveryIds[i]!, undefined));
    });
  }

  /**
   * Reads the context of turns begun on new activations (one statement). Never throws: the turns
   * are begun (committed), and a failure here must not make the caller begin them again; without
   * context a worker can still read the history over RPC.
   */
  private async attachContext(turns: StartedTurn[], context: ContextLimits | undefined): Promise<void> {
    if (!context || context.maxMessages <= 0 || turns.length === 0) return;
    try {
      const found = await loadContextJsonMany(
        this.deps.db,
        turns.map((t) => t.fence),
        context,
      );
      for (const t of turns) t.contextJson = found.get(`${t.fence.agentUid}/${t.fence.sessionId}`);
    } catch (e) {
      this.deps.onContextError?.(e);
    }
  }

  private startedTurn(
    job: FetchedJob,
    workerId: string | null,
    activation: ActivationRow,
    deliveryId: string,
    contextJson: string | undefined,
  ): StartedTurn {
    return {
      fence: fenceOf({ ...activation, eventId: job.id, deliveryId }),
      payload: job.data.payload,
      enqueuedAt: job.data.enqueuedAt,
      attempt: job.retryCount + 1,
      leaseExpiresAt: activation.leaseExpiresAt,
      workerId,
      ...(contextJson === undefined ? {} : { contextJson }),
    };
  }
}
