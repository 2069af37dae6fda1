/**
 * The broker's handling of `worker_ready` (docs/protocol.md §6, §13): the key challenge, the
 * authenticator's decision, the registration rate limit and the session table it updates.
 *
 * Invariants:
 * 1. A connection has at most one outstanding challenge; its nonce is random, good for one
 *    attempt (taken by the first `worker_ready` that answers it, right or wrong), for one worker
 *    id, for `CHALLENGE_TTL_MS`, and only on the connection it was sent to. Challenges are
 *    dropped when their connection ends; there are never more than the connections allowed.
 * 2. Accepted registrations are limited per key (a token bucket): only a party that passed the
 *    authenticator (with CURVE: holds the id's secret key) spends its key's tokens, so nobody
 *    can use up another worker's registrations.
 * 3. Registration log lines (registered, moved, takeover refused, rate limited) are limited per
 *    key: at most `REGISTRATION_LOG_LINES` per `REGISTRATION_LOG_WINDOW_MS`; the rest are only
 *    counted, and the next line says how many were left out.
 * 4. One worker id, one live connection (broker invariant 7): a `worker_ready` for an id live on
 *    another connection moves the session only when the authenticator accepts it.
 */
import type { Clock } from '../base/clock.ts';
import { toError } from '../base/errors.ts';
import type { Logger } from '../base/logger.ts';
import type { AuthDecision, Authenticator } from './auth.ts';
import type { BrokerEvent, WorkerSession } from './broker-types.ts';
import { TokenBuckets, WindowCounter } from '../base/rate-limits.ts';
import { newNonce } from './proof.ts';
import { PROTOCOL_VERSION, type DaemonMessage, type ProtocolErrorCode, type WorkerReady } from './protocol.ts';

/** How long a challenge's nonce is good for. */
export const CHALLENGE_TTL_MS = 10_000;
/** Challenges sent per connection per second, at most (the rest are dropped and counted). */
const CHALLENGES_PER_SECOND = 5;
const REGISTRATION_LOG_LINES = 10;
const REGISTRATION_LOG_WINDOW_MS = 10_000;

export interface Conn {
  routing: Buffer;
  session: WorkerSession;
}

/** What the registrar needs from its broker. */
export interface RegistrarHost {
  readonly log: Logger;
  readonly clock: Clock;
  readonly authenticator: Authenticator;
  readonly maxWorkers: number;
  /** Most challenges outstanding at once (the connection cap). */
  readonly maxChallenges: number;
  readonly registrationsPerKeyPerS: number;
  /** Registered connections by routing id, and worker id → routing id. */
  readonly conns: Map<string, Conn>;
  readonly byWorker: Map<string, string>;
  readonly counters: {
    registrationRefused: number;
    takeoverRefused: number;
    challenges: number;
    registrationsRateLimited: number;
    logsSuppressed: number;
    refusalsSuppressed: number;
  };
  /** Fields of the welcome besides the worker's own. */
  welcome(workerId: string, capacity: number): DaemonMessage;
  send(routing: Buffer, rid: string, msg: DaemonMessage): void;
  /** Logs (rate-limited per connection), counts, reports and answers a refusal. */
  refuse(routing: Buffer, rid: string, code: ProtocolErrorCode, reason: string): void;
  emit(e: BrokerEvent): void;
}

export class Registrar {
  private readonly host: RegistrarHost;
  /** routing id → the challenge sent to that connection (invariant 1). */
  private readonly challenges = new Map<string, { nonce: string; workerId: string; expiresAtMs: number }>();
  private readonly challengeBudget: WindowCounter;
  private readonly buckets: TokenBuckets;
  private readonly logBudget: WindowCounter;

  constructor(host: RegistrarHost) {
    this.host = host;
    this.challengeBudget = new WindowCounter(host.clock, CHALLENGES_PER_SECOND, 1_000);
    const rate = host.registrationsPerKeyPerS;
    this.buckets = new TokenBuckets(host.clock, rate, Math.max(5, rate * 5));
    this.logBudget = new WindowCounter(host.clock, REGISTRATION_LOG_LINES, REGISTRATION_LOG_WINDOW_MS);
  }

  /** The connection `rid` ended: its challenge goes. */
  connectionEnded(rid: string): void {
    this.challenges.delete(rid);
    this.challengeBudget.delete(rid);
  }

  outstandingChallenges(): number {
    return this.challenges.size;
  }

  onReady(routing: Buffer, rid: string, msg: WorkerReady): void {
    const { host } = this;
    const current = host.conns.get(rid);
    if (current && current.session.workerId !== msg.worker_id) {
      host.counters.registrationRefused++;
      host.refuse(routing, rid, 'identity_mismatch', `this connection is registered as ${current.session.workerId}`);
      return;
    }
    const liveRid = host.byWorker.get(msg.worker_id);
    const takeover = liveRid !== undefined && liveRid !== rid;
    if (liveRid === undefined && host.byWorker.size >= host.maxWorkers) {
      host.counters.registrationRefused++;
      host.refuse(routing, rid, 'unauthorized', `worker limit reached (${host.maxWorkers})`);
      return;
    }
    // invariant 1: a message answering a challenge takes it, whatever the outcome
    const answering = msg.auth?.nonce !== undefined || msg.auth?.proof !== undefined;
    const nonce = answering ? this.takeChallenge(rid, msg.worker_id) : undefined;
    let decision: AuthDecision;
    try {
      decision = host.authenticator.verify(msg.worker_id, msg.auth, { routingId: rid, ...(nonce === undefined ? {} : { nonce }) });
    } catch (e) {
      decision = { ok: false, reason: `authenticator failed: ${toError(e).message}` };
    }
    if (!decision.ok && decision.challenge) {
      this.challenge(routing, rid, msg.worker_id);
      return;
    }
    if (!decision.ok) {
      host.counters.registrationRefused++;
      if (takeover) {
        // invariant 4: the live session stays; logged apart from the per-connection refusals,
        // since it is what an operator must see (limited per worker id, invariant 3)
        host.counters.takeoverRefused++;
        this.logForKey(
          `id:${msg.worker_id}`,
          'warn',
          { workerId: msg.worker_id, routingId: rid.slice(0, 32), reason: decision.reason },
          'route takeover refused',
        );
      }
      host.refuse(routing, rid, 'unauthorized', decision.reason);
      return;
    }
    const key = decision.key ?? `id:${msg.worker_id}`;
    if (!this.buckets.take(key)) {
      host.counters.registrationsRateLimited++;
      this.logForKey(key, 'warn', { workerId: msg.worker_id, routingId: rid.slice(0, 32) }, 'registration rate-limited');
      host.refuse(
        routing,
        rid,
        'rate_limited',
        `too many registrations of this key (at most ${this.buckets.perSecond} per second, bursts of ${this.buckets.burst}); try again later`,
      );
      return;
    }
    this.accept(routing, rid, msg, decision, takeover ? liveRid : undefined, key);
  }

  private accept(
    routing: Buffer,
    rid: string,
    msg: WorkerReady,
    decision: Extract<AuthDecision, { ok: true }>,
    movedFrom: string | undefined,
    key: string,
  ): void {
    const { host } = this;
    const capacity = decision.maxCapacity === undefined ? msg.capacity : Math.min(msg.capacity, decision.maxCapacity);
    const now = host.clock.nowMs();
    const prev = movedFrom !== undefined ? host.conns.get(movedFrom)?.session : host.conns.get(rid)?.session;
    if (movedFrom !== undefined) {
      // The proven owner of the id moved to a new connection (a reconnect): the old one is dead
      // or about to be, and gets nothing more.
      host.conns.delete(movedFrom);
      this.logForKey(key, 'info', { workerId: msg.worker_id }, 'worker moved to a new connection');
    }
    const session: WorkerSession = {
      workerId: msg.worker_id,
      capacity,
      ...(msg.sdk === undefined ? {} : { sdk: msg.sdk }),
      registeredAtMs: now,
      lastSeenMs: now,
      registrations: (prev?.registrations ?? 0) + 1,
    };
    host.conns.set(rid, { routing: Buffer.from(routing), session });
    host.byWorker.set(msg.worker_id, rid);
    // Queue the welcome before telling anyone, so it precedes any turn_start that the event's
    // receiver might send synchronously.
    host.send(routing, rid, host.welcome(msg.worker_id, capacity));
    this.logForKey(
      key,
      'info',
      { workerId: msg.worker_id, capacity, sdk: msg.sdk?.slice(0, 64), reconnect: prev !== undefined, agents: decision.agents?.length },
      'worker registered',
    );
    host.emit({
      kind: 'worker_ready',
      workerId: msg.worker_id,
      capacity,
      reconnect: prev !== undefined,
      ...(msg.sdk === undefined ? {} : { sdk: msg.sdk }),
      ...(msg.instance === undefined ? {} : { instance: msg.instance }),
      ...(decision.agents === undefined ? {} : { agents: [...decision.agents] }),
    });
  }

  /** Sends this connection its challenge for `workerId`: the outstanding one again, or a new one. */
  private challenge(routing: Buffer, rid: string, workerId: string): void {
    const { host } = this;
    if (!this.challengeBudget.take(rid).ok) {
      host.counters.refusalsSuppressed++;
      return;
    }
    const now = host.clock.nowMs();
    let c = this.challenges.get(rid);
    if (!c || c.workerId !== workerId || c.expiresAtMs <= now) {
      if (!c && this.challenges.size >= host.maxChallenges) this.sweep(now);
      if (!c && this.challenges.size >= host.maxChallenges) {
        host.counters.registrationRefused++;
        host.refuse(routing, rid, 'unauthorized', 'too many registrations in progress; try again later');
        return;
      }
      c = { nonce: newNonce(), workerId, expiresAtMs: now + CHALLENGE_TTL_MS };
      this.challenges.set(rid, c);
    }
    host.counters.challenges++;
    host.send(routing, rid, { v: PROTOCOL_VERSION, type: 'worker_challenge', worker_id: workerId, nonce: c.nonce });
  }

  private takeChallenge(rid: string, workerId: string): string | undefined {
    const c = this.challenges.get(rid);
    if (!c) return undefined;
    this.challenges.delete(rid);
    return c.workerId === workerId && c.expiresAtMs > this.host.clock.nowMs() ? c.nonce : undefined;
  }

  private sweep(now: number): void {
    for (const [rid, c] of this.challenges) if (c.expiresAtMs <= now) this.challenges.delete(rid);
  }

  /** A registration log line, within its key's budget (invariant 3). */
  private logForKey(key: string, level: 'info' | 'warn', fields: Record<string, unknown>, line: string): void {
    const budget = this.logBudget.take(`log:${key}`);
    if (!budget.ok) {
      this.host.counters.logsSuppressed++;
      return;
    }
    this.host.log[level]({ ...fields, ...(budget.refusedBefore > 0 ? { suppressed: budget.refusedBefore } : {}) }, line);
  }
}
