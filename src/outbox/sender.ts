/**
 * The delivery loop: sends the outbox's messages (src/db/outbox/messages.ts) to their sinks as Standard
 * Webhooks (src/outbox/signature.ts). One per daemon, supervised; any number of daemons may
 * run it at once (O2: a message is held by one sender at a time).
 *
 *  S1 A message is POSTed with `webhook-id` (the same on every attempt), `webhook-timestamp` and
 *     `webhook-signature` over `id.timestamp.body` (by the sink's secret, and by its previous one
 *     too during a rotation's overlap, new first), plus `corral-actor` (the id's first two parts)
 *     and, for a keyed message, `corral-key`; the turn's trace context, when it had one, as W3C
 *     `traceparent` (and `tracestate`); redirects are not followed. It connects only to an
 *     address the sink may reach (src/outbox/http-post.ts, H1–H3): a refused address is retried
 *     as a connection error is.
 *  S2 2xx: delivered. 410: the sink is gone: the message is dead-lettered and the sink disabled
 *     (O4). 408, 425, 429, 5xx, a timeout or a connection error: retried after the events' backoff
 *     (`retryDelaySeconds`·2^(n−1) … ·2^n, capped at `retryDelayMaxSeconds`), or after the
 *     receiver's `Retry-After` within those bounds; after `retryLimit` retries, dead-lettered.
 *     Any other status: the receiver refused the message itself: dead-lettered at once.
 *  S3 Each request is bounded by its sink's timeout (and the response read by 64 KiB); per sink,
 *     at most its `concurrency` requests run at once in this sender, so a hanging receiver holds
 *     only its own sink's slots while the others keep delivering.
 *  S4 The loop claims when a commit notifies `corral_outbox`, when a send ends (the next message of
 *     that actor may now go), and otherwise when the next retry is due (at least every `pollMs`).
 *  S5 On stop, requests in flight are aborted and their messages handed back (due at once), so
 *     another daemon sends them without waiting for the claim to lapse.
 */
import type { Clock } from '../base/clock.ts';
import type { Db } from '../db/client.ts';
import {
  OUTBOX_CHANNEL,
  claimOutbox,
  nextOutboxDueMs,
  settleOutbox,
  type ClaimedMessage,
  type OutboxSettlement,
} from '../db/outbox/messages.ts';
import { backoffDelayMs, retryWindowSeconds } from '../base/backoff.ts';
import { errorMessage } from '../base/errors.ts';
import type { Logger } from '../base/logger.ts';
import { signatureHeader } from './signature.ts';
import { WebhookPoster, type AttemptResult } from './http-post.ts';
import type { Resolver } from './address-guard.ts';
import { databaseRetry, type DatabaseRetry } from '../base/db-retry.ts';
import type { TraceCarrier } from '../base/trace-context.ts';
import type { OutboxTrace, TurnTracer } from '../base/turn-tracer.ts';

/** The retry bounds of events (CORRAL_RETRY_DELAY_S, _DELAY_MAX_S) and the outbox's own limit. */
/** The delivery loop's metric hooks; the daemon binds them to Prometheus counters. */
export interface OutboxMetrics {
  /** An outbox message reached its sink, `seconds` after its turn committed. */
  outboxDelivered?(sink: string, seconds: number): void;
  /** An outbox attempt failed and will be retried. */
  outboxRetried?(sink: string): void;
  /** An outbox message was dead-lettered. */
  outboxDeadLettered?(sink: string): void;
}

export interface OutboxRetryPolicy {
  /** Retries after the first attempt (CORRAL_OUTBOX_RETRY_LIMIT). */
  limit: number;
  delayS: number;
  maxS: number;
}

export type { AttemptResult } from './http-post.ts';

const RETRYABLE_STATUS = new Set([408, 425, 429]);

/** S2: the delay of retry `n` (1-based), uniform in the events' window, or the receiver's Retry-After within the bounds. */
export function outboxRetryDelayMs(
  n: number,
  policy: Pick<OutboxRetryPolicy, 'delayS' | 'maxS'>,
  retryAfterMs: number | null,
  random: () => number = Math.random,
): number {
  const minMs = policy.delayS * 1000;
  const maxMs = Math.max(minMs, policy.maxS * 1000);
  if (retryAfterMs !== null) return Math.min(maxMs, Math.max(minMs, retryAfterMs));
  const window = retryWindowSeconds(n, policy.delayS, Math.max(policy.delayS, policy.maxS));
  return Math.round((window.min + (window.max - window.min) * random()) * 1000);
}

/** A `Retry-After` header in milliseconds from `nowMs` (seconds or an HTTP date); null when absent or unreadable. */
export function parseRetryAfter(value: string | null, nowMs: number): number | null {
  if (value === null) return null;
  const text = value.trim();
  if (/^\d{1,10}$/.test(text)) return Number(text) * 1000;
  // an HTTP date names its day and month (Date.parse alone would read "-5" as a year)
  const at = /^[A-Za-z]{3}, /.test(text) ? Date.parse(text) : Number.NaN;
  return Number.isNaN(at) ? null : Math.max(0, at - nowMs);
}

/** S2: what becomes of a message after its `attempts`-th attempt got `result`. */
export function decideOutbox(
  result: AttemptResult,
  attempts: number,
  policy: OutboxRetryPolicy,
  ctx: { sink: string; nowMs: number; random?: () => number },
): OutboxSettlement {
  if (result.status !== null && result.status >= 200 && result.status < 300) return { kind: 'delivered', status: result.status };
  const said = result.status === null ? result.error : `HTTP ${result.status}${result.text ? `: ${result.text}` : ''}`;
  if (result.status === 410)
    return { kind: 'dead', status: 410, error: `the receiver said the sink is gone (${said})`, disableSink: ctx.sink };
  const retryable = result.status === null || result.status >= 500 || RETRYABLE_STATUS.has(result.status);
  if (!retryable) return { kind: 'dead', status: result.status, error: `refused by the receiver: ${said}` };
  if (attempts > policy.limit) return { kind: 'dead', status: result.status, error: `gave up after ${attempts} attempts: ${said}` };
  const retryAfter = result.status === null ? null : parseRetryAfter(result.retryAfter, ctx.nowMs);
  return { kind: 'retry', status: result.status, error: said, delayMs: outboxRetryDelayMs(attempts, policy, retryAfter, ctx.random) };
}

export interface OutboxSenderOptions {
  db: Db;
  /** LISTEN on a channel (pg-boss's connection); without it the loop polls. */
  listen?: (channel: string, onPayload: (payload: string) => void, onReconnect: () => void) => Promise<{ close(): Promise<void> }>;
  clock: Clock;
  logger: Logger;
  ownerId: string;
  retry: OutboxRetryPolicy;
  metrics?: OutboxMetrics;
  /** Longest wait between claims when nothing notifies (default 5 s). */
  pollMs?: number;
  /** Most requests in flight in this sender, all sinks together (default 256). */
  maxInFlight?: number;
  /** The resolver behind the address guard (default `dns.lookup`). */
  resolve?: Resolver;
  /** A span per POST (docs/observability.md); undefined: the daemon does not trace. */
  tracer?: TurnTracer | undefined;
}

/** Most messages one claim takes. */
const CLAIM_BATCH = 64;
/** Longest a busy loop sleeps without a send ending (a retry of another sink may fall due). */
const BUSY_RECHECK_MS = 1_000;

/** How long a claim outlives its request's timeout (S3 bounds the request; the claim must outlast it). */
const CLAIM_GRACE_MS = 5_000;

export class OutboxSender {
  private readonly opts: OutboxSenderOptions;
  private readonly log: Logger;
  private readonly bySink = new Map<string, number>();
  private inFlight = 0;
  private readonly sends = new Set<Promise<void>>();
  private woken = false;
  private wakeUp: (() => void) | undefined;
  private failures = 0;
  private readonly stop = new AbortController();

  private readonly retry: DatabaseRetry;
  private readonly poster: WebhookPoster;

  constructor(opts: OutboxSenderOptions) {
    this.opts = opts;
    this.log = opts.logger.child({ component: 'outbox' });
    this.poster = new WebhookPoster(opts.resolve ? { resolve: opts.resolve } : {});
    this.retry = databaseRetry({ clock: opts.clock, log: this.log, stopping: () => this.stop.signal.aborted });
  }

  /** Claim passes so far (diagnostics and tests: an idle or blocked outbox makes few). */
  passes = 0;

  /** S4: claim again now. */
  wake(): void {
    this.woken = true;
    this.wakeUp?.();
  }

  /** Runs until `signal` aborts; then aborts its requests and hands their messages back (S5). */
  async run(signal: AbortSignal): Promise<void> {
    const onAbort = () => {
      this.stop.abort();
      this.wake();
    };
    signal.addEventListener('abort', onAbort, { once: true });
    const listener = await this.opts
      .listen?.(
        OUTBOX_CHANNEL,
        () => this.wake(),
        () => this.wake(),
      )
      .catch((e: unknown) => {
        this.log.warn({ err: errorMessage(e) }, 'LISTEN unavailable; the outbox polls');
        return undefined;
      });
    try {
      while (!signal.aborted) {
        this.woken = false;
        let waitMs: number;
        try {
          this.passes++;
          const room = (this.opts.maxInFlight ?? 256) - this.inFlight;
          const asked = Math.min(room, CLAIM_BATCH);
          const claimed = asked > 0 ? await this.claim(asked) : 0;
          if (this.failures > 0) this.log.info({ after: this.failures }, 'outbox reachable again');
          this.failures = 0;
          // a full batch: more may be claimable now
          if (claimed > 0 && claimed >= asked) continue;
          // while sends are in flight, each one's end wakes the loop: a retry falling due meanwhile
          // waits at most BUSY_RECHECK_MS, and the next-due query is not run once per message
          const due = this.inFlight > 0 ? BUSY_RECHECK_MS : room > 0 ? await nextOutboxDueMs(this.opts.db) : null;
          waitMs = Math.min(this.opts.pollMs ?? 5_000, due ?? Infinity);
        } catch (e) {
          this.failures++;
          waitMs = backoffDelayMs(this.failures, { baseMs: 200, maxMs: 10_000 });
          this.log.warn({ err: errorMessage(e), retryInMs: waitMs }, 'outbox claim failed');
        }
        if (!this.woken && waitMs > 0) await this.pause(waitMs, signal);
      }
    } finally {
      signal.removeEventListener('abort', onAbort);
      this.stop.abort();
      await Promise.allSettled([...this.sends]);
      this.poster.close();
      await listener?.close().catch(() => undefined);
    }
  }

  private async pause(ms: number, signal: AbortSignal): Promise<void> {
    const timer = new AbortController();
    const done = new Promise<void>((resolve) => {
      this.wakeUp = resolve;
    });
    await Promise.race([this.opts.clock.sleep(ms, AbortSignal.any([signal, timer.signal])).catch(() => undefined), done]);
    timer.abort();
    this.wakeUp = undefined;
  }

  /** Claims what may go now (O2) and starts sending it; how many it claimed. */
  private async claim(room: number): Promise<number> {
    const free: Record<string, number> = {};
    for (const [sink, n] of this.bySink) free[sink] = Math.max(0, (this.concurrencyOf.get(sink) ?? 0) - n);
    const claimed = await claimOutbox(this.opts.db, { owner: this.opts.ownerId, limit: room, free, graceMs: CLAIM_GRACE_MS });
    for (const m of claimed) this.start(m);
    return claimed.length;
  }

  /** Each sink's concurrency, as its last claimed message said. */
  private readonly concurrencyOf = new Map<string, number>();

  private start(m: ClaimedMessage): void {
    this.concurrencyOf.set(m.sink, m.concurrency);
    this.bySink.set(m.sink, (this.bySink.get(m.sink) ?? 0) + 1);
    this.inFlight++;
    const p = this.deliver(m)
      .catch((e: unknown) => this.log.error({ ...this.fields(m), err: errorMessage(e) }, 'outbox send failed'))
      .finally(() => {
        const left = (this.bySink.get(m.sink) ?? 1) - 1;
        if (left > 0) this.bySink.set(m.sink, left);
        else this.bySink.delete(m.sink);
        this.inFlight--;
        this.sends.delete(p);
        // S4: the next message of this actor and sink may go now
        this.wake();
      });
    this.sends.add(p);
  }

  private fields(m: ClaimedMessage) {
    return { agentUid: m.agentUid, sessionId: m.sessionId, eventId: m.eventId, sink: m.sink, webhookId: m.webhookId, attempt: m.attempts };
  }

  /** S1–S3, S5: one attempt of one message, and its outcome recorded. */
  private async deliver(m: ClaimedMessage): Promise<void> {
    const trace = this.opts.tracer ? this.postTrace(m, this.opts.tracer) : undefined;
    const result = await this.post(m, trace?.carrier);
    const nowMs = this.opts.clock.nowMs();
    const outcome: OutboxSettlement =
      this.stop.signal.aborted && result.status === null
        ? { kind: 'retry', status: result.status, error: 'the sending daemon stopped', delayMs: 0 }
        : decideOutbox(result, m.attempt, this.opts.retry, { sink: m.sink, nowMs });
    trace?.end({
      status: result.status ?? undefined,
      outcome: outcome.kind,
      error: outcome.kind === 'delivered' ? undefined : outcome.error,
    });
    // the answer is worth keeping through a database blip: without it the message is sent again
    const settled = await this.retry(() => settleOutbox(this.opts.db, m, outcome), this.fields(m));
    const fields = { ...this.fields(m), status: result.status };
    if (!settled.applied) {
      this.log.warn(fields, 'outbox claim lapsed before the answer; the message is another sender’s now');
      return;
    }
    if (outcome.kind === 'delivered') {
      this.opts.metrics?.outboxDelivered?.(m.sink, settled.sinceCommitS ?? 0);
      this.log.debug(fields, 'message delivered');
    } else if (outcome.kind === 'retry') {
      if (!this.stop.signal.aborted) this.opts.metrics?.outboxRetried?.(m.sink);
      this.log.info({ ...fields, why: outcome.error, retryInMs: outcome.delayMs }, 'message not delivered; will retry');
    } else {
      this.opts.metrics?.outboxDeadLettered?.(m.sink);
      this.log.warn({ ...fields, why: outcome.error, sinkDisabled: outcome.disableSink !== undefined }, 'message dead-lettered');
    }
  }

  /** The POST's span, a child of the context the message was stored with. */
  private postTrace(m: ClaimedMessage, tracer: TurnTracer): OutboxTrace | undefined {
    let url: URL;
    try {
      url = new URL(m.url);
    } catch {
      return undefined;
    }
    return tracer.outboxAttempt({
      parent: m.traceparent === null ? undefined : { traceparent: m.traceparent, tracestate: m.tracestate ?? undefined },
      sink: m.sink,
      url,
      messageId: String(m.id),
      attempt: m.attempt,
      key: { agentUid: m.agentUid, sessionId: m.sessionId },
    });
  }

  /** One POST; `trace`, when traced, is the POST's own span context (else the stored one is sent). */
  private async post(m: ClaimedMessage, trace?: TraceCarrier): Promise<AttemptResult> {
    const timestampS = Math.floor(this.opts.clock.nowMs() / 1000);
    const secrets = m.previousSecret === null ? [m.secret] : [m.secret, m.previousSecret];
    const result = await this.poster.post(
      {
        url: m.url,
        timeoutMs: m.timeoutMs,
        allowPrivate: m.allowPrivate,
        body: m.body,
        headers: {
          'content-type': 'application/json',
          'user-agent': 'corral-outbox',
          'webhook-id': m.webhookId,
          'webhook-timestamp': String(timestampS),
          'webhook-signature': signatureHeader(secrets, m.webhookId, timestampS, m.body),
          'corral-actor': `${m.agentUid}/${m.sessionId}`,
          ...(m.key === null ? {} : { 'corral-key': m.key }),
          ...traceHeaders(
            trace ?? (m.traceparent === null ? undefined : { traceparent: m.traceparent, tracestate: m.tracestate ?? undefined }),
          ),
        },
      },
      this.stop.signal,
    );
    if (result.status === null && result.refused) this.log.warn({ ...this.fields(m), why: result.error }, 'sink address refused');
    return result;
  }
}

function traceHeaders(carrier: TraceCarrier | undefined): Record<string, string> {
  if (!carrier) return {};
  return carrier.tracestate ? { traceparent: carrier.traceparent, tracestate: carrier.tracestate } : { traceparent: carrier.traceparent };
}
