/**
 * The client of a deployment of several shards (docs/scaling.md, "Shards"): a `Corral` that holds
 * one client per shard (each on the shard's database, its statements naming the shard's schemas)
 * and sends every call about an actor to the client of the actor's shard.
 *
 *  K1 By key: `send`, `transcript`, `actor`, `steer`, `cancel`, `watch`, `watchTurns`, and an input
 *     policy of one actor go to the actor's shard: each is the one-shard call there, unchanged.
 *  K2 `sendMany` splits its events by shard and sends each shard's in one call, in their order;
 *     the results come back in the events' order. It is one transaction per shard, not one for
 *     all: a failure on one shard leaves the others' events sent (resend them with their
 *     idempotency keys). Given the caller's transaction (`opts.db`), it is one call on that
 *     connection: the shard of that database takes only its own actors (`wrong_shard`).
 *  K3 Settings every shard reads at its own commits or sends are written to every shard, in shard
 *     order: an agent's input policy, and the webhook sinks (one secret for all). Each write is
 *     idempotent, so a call that failed half-way is made again whole. Read back from shard 0.
 *  K4 The catalog's own: API tokens (the HTTP API checks them there).
 *  K5 `waitForTurn` asks every shard: the event is on one of them, and the others answer
 *     `not_found` at once.
 *  K6 The outbox's messages are each shard's own: listed and acted on per shard (`corral outbox`
 *     on the shard's database); this client refuses them rather than show one shard's as all.
 */
import { CorralError } from '../base/errors.ts';
import { shardOf } from '../base/shard-map.ts';
import { toActorKey, type ActorRef } from './actor-ref.ts';
import type {
  ActorOptions,
  CancelResult,
  ClientDiagnostics,
  CommittedTurn,
  Corral,
  EventInput,
  InputPolicySet,
  OutboxApi,
  PolicyTargetRef,
  SendOptions,
  SendResult,
  SinksApi,
  SteerResult,
  TokensApi,
  TurnWatch,
  WaitOptions,
  WatchOptions,
} from './api.ts';
import type { InputPolicy, InputPolicyOptions } from '../db/views.ts';
import type { LiveWatch, LiveWatchOptions } from '../live/events.ts';
import type { TranscriptEntry } from '../db/turns/transcript.ts';
import type { ActorStatus } from '../ops/status.ts';

/** K6 */
function perShardOnly(): Promise<never> {
  return Promise.reject(
    new CorralError(
      'invalid_argument',
      "the outbox's messages are each shard's own: use corral outbox with the shard's database (docs/scaling.md, \"Shards\")",
    ),
  );
}

export class ShardedCorral implements Corral {
  private readonly shards: readonly Corral[];
  readonly sinks: SinksApi;
  readonly outbox: OutboxApi;
  readonly tokens: TokensApi;

  /** `shards[k]`: the client of shard k; shard 0's database is the catalog. */
  constructor(shards: readonly Corral[]) {
    if (shards.length < 2) throw new CorralError('internal', 'a sharded client has at least two shards');
    this.shards = shards;
    const catalog = shards[0]!;
    this.tokens = catalog.tokens;
    this.outbox = { list: perShardOnly, show: perShardOnly, replay: perShardOnly, discard: perShardOnly };
    this.sinks = {
      add: async (input) => {
        const first = await catalog.sinks.add(input);
        for (const s of shards.slice(1)) await s.sinks.add({ ...input, secret: first.secret });
        return first;
      },
      list: () => catalog.sinks.list(),
      remove: async (name, opts) => {
        const removed = await catalog.sinks.remove(name, opts);
        for (const s of shards.slice(1)) await s.sinks.remove(name, opts).catch(ignoreNotFound);
        return removed;
      },
      enable: async (name) => {
        const enabled = await catalog.sinks.enable(name);
        for (const s of shards.slice(1)) await s.sinks.enable(name);
        return enabled;
      },
      rotateSecret: async (name, rotation = {}) => {
        const first = await catalog.sinks.rotateSecret(name, rotation);
        for (const s of shards.slice(1)) await s.sinks.rotateSecret(name, { ...rotation, secret: first.secret });
        return first;
      },
    };
  }

  get databaseUrl(): string {
    return this.shards[0]!.databaseUrl;
  }

  /** The client of `actor`'s shard. */
  private of(actor: ActorRef): Corral {
    return this.shards[shardOf(toActorKey(actor), this.shards.length)]!;
  }

  send(actor: ActorRef, data: unknown, opts?: SendOptions): Promise<SendResult> {
    return this.of(actor).send(actor, data, opts);
  }

  /** K2 */
  async sendMany(events: readonly EventInput[], opts: Pick<SendOptions, 'db'> = {}): Promise<SendResult[]> {
    if (opts.db !== undefined || !Array.isArray(events)) return this.shards[0]!.sendMany(events, opts);
    const byShard = new Map<number, { index: number; event: EventInput }[]>();
    events.forEach((event, index) => {
      // a malformed event is refused by the shard's own checks, with its position
      const shard = event !== null && typeof event === 'object' ? shardOf(toActorKey(event.actor), this.shards.length) : 0;
      const list = byShard.get(shard) ?? [];
      list.push({ index, event });
      byShard.set(shard, list);
    });
    const out = new Array<SendResult>(events.length);
    for (const [shard, list] of [...byShard].sort((a, b) => a[0] - b[0])) {
      const sent = await this.shards[shard]!.sendMany(list.map((l) => l.event));
      sent.forEach((r, i) => (out[list[i]!.index] = r));
    }
    return out;
  }

  transcript(actor: ActorRef): Promise<TranscriptEntry[]> {
    return this.of(actor).transcript(actor);
  }

  actor(actor: ActorRef, opts?: ActorOptions): Promise<ActorStatus> {
    return this.of(actor).actor(actor, opts);
  }

  /** K1 for one actor, K3 for an agent. */
  async setInputPolicy(target: PolicyTargetRef, policy: InputPolicy, options?: InputPolicyOptions): Promise<InputPolicySet> {
    const actor = actorOfTarget(target);
    if (actor) return this.of(actor).setInputPolicy(target, policy, options);
    const results: InputPolicySet[] = [];
    for (const s of this.shards) results.push(await s.setInputPolicy(target, policy, options));
    return results[0]!;
  }

  async clearInputPolicy(target: PolicyTargetRef): Promise<InputPolicy> {
    const actor = actorOfTarget(target);
    if (actor) return this.of(actor).clearInputPolicy(target);
    let first: InputPolicy | undefined;
    let error: unknown;
    for (const s of this.shards) {
      try {
        const had = await s.clearInputPolicy(target);
        first ??= had;
      } catch (e) {
        // a shard that had none (a half-done earlier clear) is no failure of this one
        if (!(e instanceof CorralError && e.code === 'nothing_matched')) throw e;
        error ??= e;
      }
    }
    if (first === undefined) throw error as Error;
    return first;
  }

  steer(actor: ActorRef, data: unknown): Promise<SteerResult> {
    return this.of(actor).steer(actor, data);
  }

  cancel(actor: ActorRef, reason?: string): Promise<CancelResult> {
    return this.of(actor).cancel(actor, reason);
  }

  /** K5 */
  async waitForTurn(eventId: string, opts?: WaitOptions): Promise<CommittedTurn> {
    try {
      return await Promise.any(this.shards.map((s) => s.waitForTurn(eventId, opts)));
    } catch (e) {
      // every shard refused: the most telling refusal (not `not_found`, when one shard said more)
      const errors = e instanceof AggregateError ? (e.errors as unknown[]) : [e];
      throw (errors.find((x) => !(x instanceof CorralError && x.code === 'not_found')) ?? errors[0]) as Error;
    }
  }

  watch(actor: ActorRef, opts?: LiveWatchOptions): Promise<LiveWatch> {
    return this.of(actor).watch(actor, opts);
  }

  watchTurns(actor: ActorRef, opts?: WatchOptions): Promise<TurnWatch> {
    return this.of(actor).watchTurns(actor, opts);
  }

  diagnostics(): ClientDiagnostics {
    const all = this.shards.map((s) => s.diagnostics());
    const sum = (k: keyof ClientDiagnostics) => all.reduce((n, d) => n + d[k], 0);
    return {
      databaseCalls: sum('databaseCalls'),
      listening: sum('listening'),
      reconnects: sum('reconnects'),
      watches: sum('watches'),
      waits: sum('waits'),
    };
  }

  async close(): Promise<void> {
    await Promise.all(this.shards.map((s) => s.close()));
  }
}

function ignoreNotFound(e: unknown): void {
  if (!(e instanceof CorralError && e.code === 'not_found')) throw e;
}

/** The actor a policy target names (`agent/session`), or undefined for an agent. */
function actorOfTarget(target: PolicyTargetRef): ActorRef | undefined {
  if (typeof target === 'string') return target.includes('/') ? target : undefined;
  if (target !== null && typeof target === 'object' && typeof target.sessionId === 'string') {
    return { agentUid: target.agentUid, sessionId: target.sessionId };
  }
  return undefined;
}
