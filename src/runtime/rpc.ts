/**
 * The worker RPC server: `rpc_request {id, method, params, turn_ref}` → `rpc_response {id,
 * result | error}` on the worker's own connection (docs/protocol.md §15).
 *
 * Invariants:
 *  R1 served off the broker loop: `handle` only schedules (the broker calls it synchronously).
 *  R2 bounded per worker (so per key: an allow-listed key is one worker id): at most
 *     `concurrency` requests of one worker run at once, and at most `ratePerSecond` start per
 *     second (a token bucket holding one second's worth); more are answered `busy` at once,
 *     before any database work, and counted. A slot is freed only when its query has really
 *     ended, so a timed-out request still counts until then.
 *  R3 every request is answered exactly once: its result, an error, or `timeout` after
 *     `timeoutMs` (a late result is then dropped).
 *  R4 fenced by `turn_ref`: each method reads in one statement that returns nothing unless the
 *     ref names a live turn of the requesting worker (src/db/turns/history.ts, H1); otherwise
 *     `not_live`, and nothing was read.
 *  R5 `params` within the shape limits of src/base/json-safety.ts (nested at most MAX_JSON_DEPTH
 *     deep), else `invalid_params` at once, before any database work.
 */
import type { Clock } from '../base/clock.ts';
import type { DbOrTx } from '../db/client.ts';
import type { JobTable } from '../db/turns/fence.ts';
import { readActorStatus, readHistoryPage } from '../db/turns/history.ts';
import { errorMessage } from '../base/errors.ts';
import { unstorableReason } from '../base/json-safety.ts';
import type { BrokerEvent } from '../fabric/broker.ts';
import { RPC_METHODS, type DaemonMessage, type RpcErrorCode } from '../fabric/protocol.ts';
import type { Logger } from '../base/logger.ts';
import { fromWire } from './fence.ts';
import { noopMetrics, type RuntimeMetrics } from './metrics.ts';
import { TokenBuckets } from '../base/rate-limits.ts';
import type { Transport } from './transport.ts';

export type RpcRequestEvent = Extract<BrokerEvent, { kind: 'rpc_request' }>;

export interface RpcServerOptions {
  db: DbOrTx;
  /** Where the fence finds the events' jobs. */
  jobs: JobTable;
  transport: Transport;
  clock: Clock;
  logger: Logger;
  /** Requests served at once per worker (R2). */
  concurrency: number;
  /** Requests started per second per worker (R2). */
  ratePerSecond: number;
  metrics?: Pick<RuntimeMetrics, 'rpcRefused'>;
  timeoutMs: number;
  /** The wire limit: a history page is kept well under it. */
  maxMessageBytes: number;
}

/** Most messages one `history.read` returns. */
export const MAX_HISTORY_LIMIT = 500;
const DEFAULT_HISTORY_LIMIT = 100;

class RpcError extends Error {
  readonly code: RpcErrorCode;
  constructor(code: RpcErrorCode, message: string) {
    super(message);
    this.code = code;
  }
}

export class RpcServer {
  private readonly opts: RpcServerOptions;
  private readonly log: Logger;
  private readonly running = new Map<string, number>();
  /** R2's requests per second, one bucket per worker (bounded: full buckets are dropped first). */
  private readonly perSecond: TokenBuckets;
  private readonly background = new Set<Promise<void>>();

  constructor(opts: RpcServerOptions) {
    this.opts = opts;
    this.perSecond = new TokenBuckets(opts.clock, opts.ratePerSecond, opts.ratePerSecond);
    this.log = opts.logger.child({ component: 'rpc' });
  }

  /** Requests of `workerId` being served now. */
  runningOf(workerId: string): number {
    return this.running.get(workerId) ?? 0;
  }

  /** R1: schedules the request; never throws. */
  handle(e: RpcRequestEvent): void {
    const shape = unstorableReason(e.params, '$.params');
    if (shape) {
      this.track(this.answer(e, { error: { code: 'invalid_params', message: shape.slice(0, 500) } }));
      return;
    }
    const n = this.runningOf(e.workerId);
    if (n >= this.opts.concurrency) {
      (this.opts.metrics ?? noopMetrics).rpcRefused?.('concurrency');
      this.track(this.answer(e, { error: { code: 'busy', message: `at most ${this.opts.concurrency} requests at once per worker` } }));
      return;
    }
    if (!this.perSecond.take(e.workerId)) {
      (this.opts.metrics ?? noopMetrics).rpcRefused?.('rate');
      this.track(this.answer(e, { error: { code: 'busy', message: `at most ${this.opts.ratePerSecond} requests per second per worker` } }));
      return;
    }
    this.running.set(e.workerId, n + 1);
    const work = this.serve(e).finally(() => {
      const left = this.runningOf(e.workerId) - 1;
      if (left > 0) this.running.set(e.workerId, left);
      else this.running.delete(e.workerId);
    });
    this.track(this.answerWithin(e, work));
  }

  /** Waits for every scheduled request (shutdown, tests). */
  async drain(): Promise<void> {
    while (this.background.size > 0) await Promise.allSettled([...this.background]);
  }

  private async answerWithin(e: RpcRequestEvent, work: Promise<unknown>): Promise<void> {
    const timer = new AbortController();
    const timedOut = Symbol('timeout');
    let outcome: { result: unknown } | { error: { code: string; message: string } };
    try {
      const r = await Promise.race([
        work,
        this.opts.clock.sleep(this.opts.timeoutMs, timer.signal).then(
          () => timedOut,
          () => undefined,
        ),
      ]);
      outcome =
        r === timedOut ? { error: { code: 'timeout', message: `not served within ${this.opts.timeoutMs} ms` } } : { result: r ?? null };
    } catch (err) {
      if (err instanceof RpcError) outcome = { error: { code: err.code, message: err.message } };
      else {
        this.log.warn({ workerId: e.workerId, method: e.method.slice(0, 64), err: errorMessage(err) }, 'rpc request failed');
        outcome = { error: { code: 'internal', message: 'the request failed; try again' } };
      }
    } finally {
      timer.abort();
    }
    // a timed-out query still ends; its rejection must not go unhandled
    work.catch(() => undefined);
    await this.answer(e, outcome);
  }

  private async serve(e: RpcRequestEvent): Promise<unknown> {
    const fence = fromWire(e.turnRef);
    const params = (e.params !== null && typeof e.params === 'object' && !Array.isArray(e.params) ? e.params : {}) as Record<
      string,
      unknown
    >;
    switch (e.method) {
      case 'history.read': {
        const beforeSeq = optionalInt(params, 'before_seq', 1, 2_147_483_647);
        const limit = optionalInt(params, 'limit', 1, MAX_HISTORY_LIMIT) ?? DEFAULT_HISTORY_LIMIT;
        const budget = Math.floor(this.opts.maxMessageBytes / 2);
        const maxBytes = Math.min(optionalInt(params, 'max_bytes', 1, budget) ?? budget, budget);
        const page = await readHistoryPage(this.opts.db, this.opts.jobs, fence, e.workerId, {
          ...(beforeSeq ? { beforeSeq } : {}),
          limit,
          maxBytes,
        });
        if (!page) throw notLive();
        return {
          conversation_id: page.conversationId,
          messages: page.messages,
          has_more: page.hasMore,
          total: page.total,
        };
      }
      case 'actor.status': {
        const s = await readActorStatus(this.opts.db, this.opts.jobs, fence, e.workerId);
        if (!s) throw notLive();
        return {
          actor: `${s.agentUid}/${s.sessionId}`,
          epoch_counter: s.epochCounter,
          blocked_by_event_id: s.blockedByEventId,
          messages: s.messages,
          activation: {
            activation_uid: s.activation.activationUid,
            epoch: s.activation.epoch,
            status: s.activation.status,
            revision: s.activation.revision,
            current_event_id: s.activation.currentEventId,
            lease_expires_at: s.activation.leaseExpiresAt,
          },
        };
      }
      default:
        throw new RpcError('unknown_method', `unknown method; known: ${RPC_METHODS.join(', ')}`);
    }
  }

  private async answer(e: RpcRequestEvent, outcome: { result: unknown } | { error: { code: string; message: string } }): Promise<void> {
    const msg: DaemonMessage = { v: 1, type: 'rpc_response', id: e.id, ...(outcome as object) } as DaemonMessage;
    let res = await this.opts.transport.send(e.workerId, msg);
    if (!res.ok && res.reason === 'too_large') {
      res = await this.opts.transport.send(e.workerId, {
        v: 1,
        type: 'rpc_response',
        id: e.id,
        error: { code: 'internal', message: 'the response exceeds the message size limit; ask for less' },
      });
    }
    if (!res.ok) this.log.debug({ workerId: e.workerId, reason: res.reason }, 'rpc response not delivered');
  }

  private track(p: Promise<void>): void {
    const tracked = p.catch((err: unknown) => this.log.error({ err: errorMessage(err) }, 'rpc answer failed'));
    this.background.add(tracked);
    void tracked.finally(() => this.background.delete(tracked));
  }
}

function notLive(): RpcError {
  return new RpcError(
    'not_live',
    "turn_ref does not name a live turn of this worker (lease expired, steered, settled or another worker's)",
  );
}

function optionalInt(params: Record<string, unknown>, name: string, min: number, max: number): number | undefined {
  const v = params[name];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) {
    throw new RpcError('invalid_params', `${name} must be an integer in ${min}..${max}`);
  }
  return v;
}
