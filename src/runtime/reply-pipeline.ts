/**
 * The reply pipeline: what workers say about their turns (accepted, progress, result, error),
 * judged by the fence and written by group commit (see group-writer.ts): replies that arrive
 * while a reply transaction runs go together in the next one. Each worker gets its own answer:
 * `turn_committed`, or `turn_rejected` with the reason its reply failed the fence.
 *
 * Invariants:
 *  1. A reply that fails the fence changes nothing and is answered `turn_rejected{reason}`.
 *  2. Results, errors and progress of one actor run one at a time on its SessionController.
 *  3. A reply about a delivery this process is not running costs a transaction only within the
 *     worker's budget; beyond it, it is refused at once (`unknown_delivery`).
 *  4. Every final message (result or error) is answered once it has been acted on: committed,
 *     failed, or refused — a result breaking the shape limits (`unstorable`, `emit_limit`) before
 *     any transaction, one whose commit failed for any reason but the fence or a lost database
 *     (`commit_failed`) after the commit — and a refused result's attempt is failed at once,
 *     before the answer, never left to its lease or the maximum turn time. (A database that stays
 *     away past the retry leaves it unanswered: the worker re-sends it after re-registering.)
 *  5. Only a result that passed the checks that need no database frees its worker's slot on
 *     arrival (`Dispatcher.workerFinished`), and this pipeline then settles its turn (invariant
 *     4), not the worker. A refused result, or a `turn_error`, keeps the slot until its attempt
 *     has failed: messages that are refused or fail their turn never get a worker more turns than
 *     its capacity.
 *  6. A result's sinks are looked up (src/effects/deliver.ts, X1, X4) only once the result is
 *     admitted (invariant 3): a result about a delivery this daemon does not run, naming sinks
 *     that do not exist, costs no query beyond the worker's budget. A result is admitted once:
 *     its refusal or commit does not take a second token.
 *  7. Refusals of results are logged at most once per worker per second; the line after a quiet
 *     spell counts what was left out (`suppressed`). Every refusal is still counted and answered.
 */
import { agentInScope } from '../base/agent-scope.ts';
import { FenceRejected, errorMessage, isConnectionError } from '../base/errors.ts';
import type { BrokerEvent } from '../fabric/broker.ts';
import { resultValuesProblem, type DaemonMessage } from '../fabric/protocol.ts';
import { storableText } from '../base/json-safety.ts';
import { traceLogFields } from '../base/trace-context.ts';
import type { Logger } from '../base/logger.ts';
import type { Dispatcher } from './dispatcher.ts';
import { fenceFields, fromWire, type Fence, type WireTurnRef } from './fence.ts';
import { GroupWriter } from './group-writer.ts';
import type { RuntimeParts } from './transport.ts';
import type { ReplyOutcome, ReplyRequest } from './turn-commit.ts';
import type { StartedTurn } from './turn-begin.ts';
import type { FailOutcome } from './attempt-failure.ts';
import { checkEmits, type EmitRequest } from '../effects/emit.ts';
import { checkDeliveries, type DeliverRequest, type SinkDirectory } from '../effects/deliver.ts';
import { WindowCounter } from '../base/rate-limits.ts';

/** turn_error codes meaning "the worker did not run this turn": it goes elsewhere, no retry is spent. */
const HANDED_BACK = new Set(['over_capacity', 'worker_stopping']);

type ResultEvent = Extract<BrokerEvent, { kind: 'turn_result' }>;
type ErrorEvent = Extract<BrokerEvent, { kind: 'turn_error' }>;

export interface ReplyPipelineOptions extends RuntimeParts {
  dispatcher: Dispatcher;
  /** Largest emitted event payload (CORRAL_MAX_EVENT_BYTES). */
  maxEventBytes: number;
  /** The stream relay's R7: the chunks of a delivery received before its result, once written (undefined: nothing to wait for). */
  chunksWritten?: (deliveryId: string) => Promise<void> | undefined;
  /** Which sinks a result's `deliver` names that do not exist, or do not take its agent (X1, X4 of src/effects/deliver.ts). */
  sinks: SinkDirectory;
}

export class ReplyPipeline {
  private readonly opts: ReplyPipelineOptions;
  private readonly log: Logger;
  /** Worker replies (results, accepts, progress) are written in groups. */
  private readonly writer: GroupWriter<ReplyRequest, ReplyOutcome>;
  /** turn_accepted messages not yet handed to the writer (see `accepted`). */
  private readonly pendingAccepts = new Map<string, { workerId: string; ref: WireTurnRef }>();
  private acceptsScheduled = false;
  /** Invariant 7: one refusal line per worker per second. */
  private readonly refusalLines: WindowCounter;

  constructor(opts: ReplyPipelineOptions) {
    this.opts = opts;
    this.log = opts.logger.child({ component: 'replies' });
    this.refusalLines = new WindowCounter(opts.clock, REFUSAL_LINES_PER_SECOND, 1_000);
    this.writer = new GroupWriter<ReplyRequest, ReplyOutcome>({
      many: async (requests) =>
        (await opts.commits.replyMany(requests)).map((o) =>
          o.outcome === 'rejected' ? { ok: false as const, error: new FenceRejected(o.reason) } : { ok: true as const, value: o },
        ),
      one: (r) => opts.commits.replyOne(r),
      onBatch: (size, fellBack) => this.log.debug({ size, fellBack }, fellBack ? 'reply batch failed; applied one by one' : 'reply batch'),
    });
  }

  /**
   * turn_accepted is written lazily: it waits until the end of this round of socket reads, and
   * is dropped when its turn's result (or error) arrives first, since the delivery then goes
   * straight to its end state. An accept changes no decision (every check treats the live
   * delivery states alike), so it does not queue on the actor's controller ahead of the result.
   */
  accepted(workerId: string, ref: WireTurnRef): void {
    if (!this.admit(workerId, ref)) return;
    this.opts.dispatcher.markAccepted(workerId, ref.event_id, ref.delivery_id);
    this.pendingAccepts.set(ref.delivery_id, { workerId, ref });
    if (this.acceptsScheduled) return;
    this.acceptsScheduled = true;
    setImmediate(() => this.writeAccepts());
  }

  progress(workerId: string, ref: WireTurnRef): void {
    this.opts.workers.seen(workerId);
    this.fenced(workerId, ref, 'progress', false, (fence) => this.writer.submit({ kind: 'progress', fence, workerId }));
  }

  result(e: ResultEvent): void {
    // the shape limits: each stored value is walked once, before any transaction
    const unstorable = resultValuesProblem({ messages: e.messages, output: e.output });
    if (unstorable) {
      this.refuse(e.workerId, e.turnRef, unstorable.why, 'unstorable');
      return;
    }
    // effects hook: a result whose `emit` breaks the limits is refused before any transaction
    const effects = checkEmits(e.emit, this.opts.maxEventBytes);
    if (!effects.ok) {
      this.refuse(e.workerId, e.turnRef, effects.detail, 'emit_limit');
      return;
    }
    // a key scoped to some agents may not reach the others through its effects either
    const scope = this.opts.workers.scopeOf(e.workerId);
    const outside = effects.emits.find((x) => !agentInScope(scope, x.key.agentUid));
    if (outside) {
      this.refuse(e.workerId, e.turnRef, `emit to agent ${outside.key.agentUid}: outside this worker key's scope`, 'emit_denied');
      return;
    }
    // outbox hook: the same for a result's `deliver` (X1 of src/effects/deliver.ts)
    const outbound = checkDeliveries(e.deliver, this.opts.maxEventBytes);
    if (!outbound.ok) {
      this.refuse(e.workerId, e.turnRef, outbound.detail, 'deliver_limit');
      return;
    }
    // invariant 6: admitted (the worker's budget for deliveries this daemon does not run) before
    // anything costs a query; admitted once for what follows
    if (!this.admit(e.workerId, e.turnRef)) return;
    if (outbound.deliveries.length === 0) {
      this.commitResult(e, effects.emits, [], true);
      return;
    }
    const names = outbound.deliveries.map((d) => d.sink);
    const agentUid = e.turnRef.agent_uid;
    this.opts.background.track(
      (async () => {
        const judged = await this.opts.retry(() => this.opts.sinks.judge(agentUid, names), { workerId: e.workerId, op: 'sinks' });
        if (judged.missing.length > 0) {
          this.refuse(e.workerId, e.turnRef, `deliver to ${judged.missing.join(', ')}: no such sink`, 'deliver_limit', true);
        } else if (judged.forbidden.length > 0) {
          const why = `deliver to ${judged.forbidden.join(', ')}: the sink does not take messages from agent ${agentUid} (its --agents)`;
          this.refuse(e.workerId, e.turnRef, why, 'deliver_forbidden', true);
        } else this.commitResult(e, effects.emits, outbound.deliveries, true);
      })(),
      { ...fenceFields(fromWire(e.turnRef)), workerId: e.workerId, op: 'sinks' },
    );
  }

  /** A result that passed every check that needs no fence: committed on its actor's controller. */
  private commitResult(e: ResultEvent, emits: readonly EmitRequest[], deliver: readonly DeliverRequest[], admitted: boolean): void {
    // invariant 5: the pipeline settles the turn from here on, so its slot may go to the next one
    // (invariant 8: or is kept for the actor's next turn, begun in this commit)
    let continuation = this.opts.dispatcher.workerFinished(e.workerId, fromWire(e.turnRef), true);
    this.dropAccept(e.turnRef.delivery_id);
    this.fenced(e.workerId, e.turnRef, 'commit', admitted, async (fence) => {
      // once: a retried commit (a lost database) goes without it, the slot freed by the first try
      const keep = continuation;
      continuation = undefined;
      let next: StartedTurn | undefined;
      try {
        next = await this.commitChecked(e, emits, deliver, fence, keep);
      } finally {
        if (keep !== undefined) await this.opts.dispatcher.continued(this.opts.directory.wake(fence), fence.eventId, next);
      }
    });
  }

  /** The commit of a checked result, its settlement and its answer; the next turn it began, if any (invariant 8). */
  private async commitChecked(
    e: ResultEvent,
    emits: readonly EmitRequest[],
    deliver: readonly DeliverRequest[],
    fence: Fence,
    continuation: string | undefined,
  ): Promise<StartedTurn | undefined> {
    let outcome: ReplyOutcome;
    const chunks = this.opts.chunksWritten?.(fence.deliveryId);
    if (chunks) await chunks;
    const held = this.opts.dispatcher.turnOf(fence.eventId);
    const trace = held?.started.trace;
    const commitEnded = held?.trace?.commit(e.workerId);
    try {
      outcome = await this.writer.submit({
        kind: 'commit',
        fence,
        workerId: e.workerId,
        ...(trace ? { trace } : {}),
        messages: e.messages,
        ...(e.output === undefined ? {} : { output: e.output }),
        ...(emits.length > 0 ? { emit: [...emits] } : {}),
        ...(deliver.length > 0 ? { deliver: [...deliver] } : {}),
        ...(continuation !== undefined ? { continuation: { workerId: continuation } } : {}),
      });
    } catch (err) {
      commitEnded?.(err instanceof FenceRejected ? 'rejected' : 'failed', errorMessage(err));
      // the fence is answered by `judged`; a lost database is retried there
      if (err instanceof FenceRejected || isConnectionError(err)) throw err;
      await this.commitFailed(e.workerId, e.turnRef, fence, err);
      return undefined;
    }
    commitEnded?.(outcome.outcome === 'committed' ? 'committed' : 'duplicate');
    if (outcome.outcome === 'committed') {
      this.opts.metrics.committed();
      this.opts.workers.committed(e.workerId);
      if (held?.started.batch) this.opts.metrics.coalesced?.(held.started.batch.length);
      const sentAtMs = held?.firstSentAtMs;
      if (sentAtMs !== undefined) this.opts.metrics.commitLatency?.((this.opts.clock.nowMs() - sentAtMs) / 1000);
      this.log.info({ ...fenceFields(fence), workerId: e.workerId, ...traceLogFields(trace) }, 'turn committed');
    } else {
      this.opts.metrics.duplicate();
      this.log.info({ ...fenceFields(fence), workerId: e.workerId }, 'duplicate result: already committed');
    }
    // a slot kept for the actor's next turn wakes no fetch: that turn was begun here, or `continued` frees the slot
    this.opts.dispatcher.settle(
      fence,
      { outcome: outcome.outcome === 'committed' ? 'committed' : 'duplicate' },
      continuation !== undefined,
    );
    await this.answer(e.workerId, { v: 1, type: 'turn_committed', turn_ref: e.turnRef });
    return outcome.outcome === 'committed' ? outcome.next : undefined;
  }

  error(e: ErrorEvent): void {
    if (HANDED_BACK.has(e.error.code)) {
      this.log.info({ ...fenceFields(fromWire(e.turnRef)), workerId: e.workerId, code: e.error.code }, 'turn handed back');
      this.opts.workers.handedBack(e.workerId);
      this.opts.metrics.handedBack?.();
      this.opts.dispatcher.reassign(e.turnRef.event_id, `handed back by ${e.workerId}: ${e.error.code}`, e.workerId);
      this.opts.background.track(
        this.answer(e.workerId, { v: 1, type: 'turn_failed', turn_ref: e.turnRef, retry: true, dead_lettered: false, handed_back: true }),
        { workerId: e.workerId },
      );
      return;
    }
    // invariant 5: the slot is freed when the attempt has failed (`attemptFailed` settles it)
    this.opts.dispatcher.workerFinished(e.workerId, fromWire(e.turnRef), false);
    this.dropAccept(e.turnRef.delivery_id);
    this.fenced(e.workerId, e.turnRef, 'fail', false, async (fence) => {
      let outcome: FailOutcome;
      try {
        // an error text is diagnostic: make it storable rather than lose the failure
        outcome = await this.opts.commits.fail(fence, e.workerId, {
          ...e.error,
          code: storableText(e.error.code),
          message: storableText(e.error.message),
        });
      } catch (err) {
        if (err instanceof FenceRejected || isConnectionError(err)) throw err;
        // invariant 4: answered even so; the attempt ends with its lease
        await this.answer(e.workerId, this.rejection(e.turnRef, 'commit_failed', `the error could not be written: ${errorMessage(err)}`));
        throw err;
      }
      this.opts.dispatcher.attemptFailed(fence, outcome, `turn_error: ${e.error.code}: ${e.error.message.slice(0, 200)}`);
      // answered, so the worker knows it may stop re-sending the error
      await this.answer(e.workerId, {
        v: 1,
        type: 'turn_failed',
        turn_ref: e.turnRef,
        retry: !outcome.deadLettered,
        dead_lettered: outcome.deadLettered,
      });
    });
  }

  private writeAccepts(): void {
    this.acceptsScheduled = false;
    const accepts = [...this.pendingAccepts.values()];
    this.pendingAccepts.clear();
    for (const { workerId, ref } of accepts) {
      const fence = fromWire(ref);
      this.opts.background.track(
        this.judged(workerId, ref, 'accept', () => this.writer.submit({ kind: 'accept', fence, workerId })),
        { ...fenceFields(fence), workerId, op: 'accept' },
      );
    }
  }

  /** The turn's result or error arrived: its accept, if not yet written, need not be. */
  private dropAccept(deliveryId: string): void {
    this.pendingAccepts.delete(deliveryId);
    this.writer.withdraw((r) => r.kind === 'accept' && r.fence.deliveryId === deliveryId, { outcome: 'accepted' });
  }

  /**
   * A result breaking the shape limits (nested too deep, holding what PostgreSQL cannot store, an
   * `emit` over the limits): its attempt is failed at once (retried per the retry policy), which
   * frees the worker's slot, then it is answered `turn_rejected{reason}` (invariants 4, 5). A
   * fence that does not hold is answered with its own reason instead.
   */
  private refuse(
    workerId: string,
    ref: WireTurnRef,
    why: string,
    reason: 'unstorable' | 'emit_limit' | 'emit_denied' | 'deliver_limit' | 'deliver_forbidden',
    admitted = false,
  ): void {
    this.opts.metrics.rejected(reason);
    this.logRefusal(workerId, { ...fenceFields(fromWire(ref)), reason, why: why.slice(0, 200) }, 'result refused');
    // invariant 5: the slot stays taken until the attempt has failed
    this.opts.dispatcher.workerFinished(workerId, fromWire(ref), false);
    this.dropAccept(ref.delivery_id);
    this.fenced(workerId, ref, 'fail', admitted, async (fence) => {
      const code = reason === 'unstorable' ? 'unstorable_result' : reason;
      try {
        const outcome = await this.opts.commits.fail(
          fence,
          workerId,
          { code, message: storableText(why.slice(0, 1000)) },
          { lateSteer: true },
        );
        this.opts.dispatcher.attemptFailed(fence, outcome, `${reason} result: ${why.slice(0, 200)}`);
      } catch (err) {
        if (err instanceof FenceRejected || isConnectionError(err)) throw err;
        await this.answer(workerId, this.rejection(ref, reason, why));
        throw err;
      }
      await this.answer(workerId, this.rejection(ref, reason, why));
    });
  }

  /**
   * The commit of a checked result failed for a reason that is neither the fence nor a lost
   * database (the statement, an effect, the job's settlement): the attempt is failed at once
   * (retried per the retry policy) and the worker told `turn_rejected{commit_failed}` (invariant 4).
   */
  private async commitFailed(workerId: string, ref: WireTurnRef, fence: Fence, err: unknown): Promise<void> {
    const why = errorMessage(err).slice(0, 300);
    this.opts.metrics.rejected('commit_failed');
    this.log.error({ ...fenceFields(fence), workerId, err }, 'commit failed; failing the attempt');
    try {
      const outcome = await this.opts.retry(
        () => this.opts.commits.fail(fence, workerId, { code: 'commit_failed', message: storableText(why) }, { lateSteer: true }),
        { ...fenceFields(fence), workerId, op: 'fail' },
      );
      this.opts.dispatcher.attemptFailed(fence, outcome, `commit failed: ${why}`);
    } catch (e) {
      // the attempt is over already (the fence says so), or cannot be failed now: its lease ends it
      this.log.warn({ ...fenceFields(fence), workerId, err: errorMessage(e).slice(0, 300) }, 'attempt not failed after a failed commit');
    }
    await this.answer(workerId, this.rejection(ref, 'commit_failed', `the result could not be written: ${why}`));
  }

  private rejection(ref: WireTurnRef, reason: string, detail: string): DaemonMessage {
    return { v: 1, type: 'turn_rejected', turn_ref: ref, reason, detail: detail.slice(0, 500) };
  }

  /** Invariant 3: false when the reply was refused at once. */
  private admit(workerId: string, ref: WireTurnRef): boolean {
    const known = this.opts.dispatcher.turnOf(ref.event_id);
    if ((known && known.fence.deliveryId === ref.delivery_id) || this.opts.workers.takeUnknownReplyToken(workerId)) return true;
    this.opts.metrics.rejected('unknown_delivery');
    this.opts.background.track(
      this.answer(workerId, {
        v: 1,
        type: 'turn_rejected',
        turn_ref: ref,
        reason: 'unknown_delivery',
        detail: 'not dispatched by this daemon',
      }),
      { workerId },
    );
    return false;
  }

  /** Invariant 7: a refusal's log line, within the worker's budget of lines. */
  private logRefusal(workerId: string, fields: Record<string, unknown>, line: string): void {
    const budget = this.refusalLines.take(workerId);
    if (!budget.ok) return;
    this.log.warn({ ...fields, workerId, ...(budget.refusedBefore > 0 ? { suppressed: budget.refusedBefore } : {}) }, line);
  }

  /** Runs a fenced operation on the actor's controller (invariant 2); `admitted`: invariant 3 was checked already (invariant 6). */
  private fenced(workerId: string, ref: WireTurnRef, op: string, admitted: boolean, fn: (fence: Fence) => Promise<unknown>): void {
    if (!admitted && !this.admit(workerId, ref)) return;
    const fence = fromWire(ref);
    this.opts.background.track(
      this.opts.directory.wake(fence).run(() => this.judged(workerId, ref, op, () => fn(fence))),
      { ...fenceFields(fence), workerId, op },
    );
  }

  /** Runs `fn` with the database retry; a fence rejection is answered to the worker (invariant 1). */
  private async judged(workerId: string, ref: WireTurnRef, op: string, fn: () => Promise<unknown>): Promise<void> {
    const fence = fromWire(ref);
    try {
      await this.opts.retry(fn, { ...fenceFields(fence), workerId, op });
    } catch (e) {
      if (!(e instanceof FenceRejected)) throw e;
      this.opts.metrics.rejected(e.reason);
      const fields = { ...fenceFields(fence), op, reason: e.reason };
      // invariant 7 for results; accepts and progress keep their own lines
      if (op === 'commit') this.logRefusal(workerId, fields, 'fence rejected');
      else this.log.warn({ ...fields, workerId }, 'fence rejected');
      await this.answer(workerId, { v: 1, type: 'turn_rejected', turn_ref: ref, reason: e.reason });
    }
  }

  private async answer(workerId: string, msg: DaemonMessage): Promise<void> {
    const res = await this.opts.transport.send(workerId, msg);
    if (!res.ok) this.log.debug({ workerId, type: msg.type, reason: res.reason }, 'reply not delivered');
  }
}

/** Invariant 7: refusal lines one worker may cause per second. */
const REFUSAL_LINES_PER_SECOND = 1;
