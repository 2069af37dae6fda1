/**
 * A one-for-one supervisor: each child runs independently; only a child that ended is restarted,
 * according to its policy. Semantics and the daemon's tree: docs/supervision.md.
 *
 * Invariants:
 * 1. A child is in exactly one state (idle, running, stopping, restart-wait, ended); every
 *    transition happens here, on the event loop, so there are no partial states to race on.
 * 2. A stop request (removeChild, shutdown, parent cancellation, another child exceeding the
 *    restart intensity) moves a child to `stopping`; a child that ends from `stopping` is never
 *    restarted, whatever its policy or its result. Abort errors then count as a clean stop.
 * 3. Each generation gets its own AbortController and its own `ChildRun`; a late `markReady()`
 *    or end from an old generation cannot touch the current one.
 * 4. The supervisor ends exactly once, when no child is running, stopping or waiting to restart
 *    (and, with `keepAlive`, only after a stop request). `done` settles after the event stream
 *    is closed and the parent listener removed, so awaiting it means "fully cleaned up".
 * 5. Nothing the children do can make the supervisor throw from a callback: factory results and
 *    exceptions are classified, never rethrown.
 */
import { systemClock, type Clock, type TimerHandle } from '../base/clock.ts';
import { CorralError, toError } from '../base/errors.ts';
import { describeError } from './diagnostics.ts';
import { EventStream, MAX_TIMEOUT_MS } from './events.ts';
import { checkDelay, deferred, isAbortLike, newEntry, type Entry } from './entry.ts';
import { RestartWindow } from './intensity.ts';
import {
  isChildError,
  type ChildExit,
  type ChildFailure,
  type ChildRun,
  type ChildSpec,
  type ChildStatus,
  type EndOfEvents,
  type NextEventOptions,
  type ShutdownOptions,
  type ShutdownResult,
  type StopReason,
  type SupervisorEvent,
  type SupervisorHandle,
  type SupervisorOptions,
  type SupervisorState,
} from './types.ts';

/**
 * Usage:
 * ```ts
 * const sup = new Supervisor(ctx, { clock });
 * sup.register({ name: 'broker', policy: 'permanent', factory: async (ctx, signal) => { ... } });
 * const handle = sup.start();   // or: await sup.run()
 * const result = await handle.shutdown({ deadlineMs: 5_000 });
 * ```
 */
export class Supervisor<C> implements SupervisorHandle<C> {
  readonly name: string;
  readonly done: Promise<void>;
  private readonly ctx: C;
  private readonly clock: Clock;
  private readonly restartDelayMs: number;
  private readonly window: RestartWindow;
  private readonly stream: EventStream;
  private readonly parentSignal: AbortSignal | undefined;
  private readonly keepAlive: boolean;
  private readonly entries = new Map<string, Entry<C>>();
  private readonly recorded: ChildFailure[] = [];
  private fatal: ChildFailure | null = null;
  private current: SupervisorState = 'idle';
  private readonly outcome = deferred();
  /** Resolves when the supervisor ended; never rejects (shutdown() waits on it). */
  private readonly ended = deferred();
  private readonly onParentAbort = (): void => this.stopAll();

  constructor(ctx: C, opts: SupervisorOptions = {}) {
    this.ctx = ctx;
    this.name = opts.name ?? 'supervisor';
    this.clock = opts.clock ?? systemClock;
    this.restartDelayMs = checkDelay(opts.restartDelayMs ?? 10, 'restartDelayMs');
    this.window = new RestartWindow(opts.maxRestarts ?? 5, opts.withinMs ?? 10_000);
    this.stream = new EventStream(opts.eventBufferSize ?? 256, this.clock);
    this.parentSignal = opts.signal;
    this.keepAlive = opts.keepAlive ?? false;
    this.done = this.outcome.promise;
    // Dropping the handle must not crash the process: the outcome stays observable via
    // `done`, `shutdown()` and `failures()`.
    this.done.catch(() => {});
  }

  get state(): SupervisorState {
    return this.current;
  }

  /** Register a static child. Starts nothing; throws once the supervisor was started. */
  register(spec: ChildSpec<C>): void {
    if (this.current !== 'idle') {
      throw new CorralError('invalid_argument', `supervisor "${this.name}": registration is closed after start`);
    }
    this.add(spec, false);
  }

  /** Start every registered child (idempotent) and return the control handle. */
  start(): SupervisorHandle<C> {
    if (this.current !== 'idle') return this;
    this.current = 'running';
    if (this.parentSignal?.aborted) {
      this.stopAll();
      return this;
    }
    this.parentSignal?.addEventListener('abort', this.onParentAbort, { once: true });
    for (const entry of [...this.entries.values()]) this.launch(entry);
    this.maybeFinish();
    return this;
  }

  /** `start()`, then wait for the end: resolves when clean, rejects with the failure. */
  run(): Promise<void> {
    return this.start().done;
  }

  addChild(spec: ChildSpec<C>): void {
    if (this.current === 'stopping' || this.current === 'ended') {
      throw new CorralError('shutdown', `supervisor "${this.name}" is ${this.current}; cannot add "${spec.name}"`);
    }
    const entry = this.add(spec, true);
    if (this.current === 'running') this.launch(entry);
  }

  async removeChild(name: string): Promise<boolean> {
    const entry = this.entries.get(name);
    if (!entry) return false;
    entry.forget = true;
    if (entry.state === 'ended') {
      this.entries.delete(name);
      return true;
    }
    const ended = new Promise<void>((resolve) => entry.endWaiters.push(resolve));
    this.stopChild(entry);
    await ended;
    return true;
  }

  async shutdown(opts: ShutdownOptions = {}): Promise<ShutdownResult> {
    const { deadlineMs } = opts;
    if (deadlineMs !== undefined && !(Number.isInteger(deadlineMs) && deadlineMs >= 0 && deadlineMs <= MAX_TIMEOUT_MS)) {
      throw new CorralError('invalid_timeout', `deadlineMs must be an integer in 0..${MAX_TIMEOUT_MS}, got ${deadlineMs}`);
    }
    this.stopAll();
    if (deadlineMs !== undefined && this.current !== 'ended') {
      let timer: TimerHandle | undefined;
      const deadline = new Promise<'deadline'>((resolve) => {
        timer = this.clock.setTimeout(() => resolve('deadline'), deadlineMs);
      });
      const first = await Promise.race([this.ended.promise.then(() => 'ended' as const), deadline]);
      timer?.cancel();
      if (first === 'deadline') {
        const stillRunning = [...this.entries.values()]
          .filter((e) => e.state === 'running' || e.state === 'stopping')
          .map((e) => e.spec.name);
        return { kind: 'deadline', stillRunning };
      }
    }
    await this.ended.promise;
    const failures = this.failures();
    return failures.length > 0 ? { kind: 'failed', failures } : { kind: 'clean' };
  }

  nextEvent(opts?: NextEventOptions): Promise<SupervisorEvent | EndOfEvents> {
    return this.stream.next(opts);
  }

  tryNextEvent(): SupervisorEvent | EndOfEvents | null {
    return this.stream.poll();
  }

  async *events(): AsyncGenerator<SupervisorEvent, void, undefined> {
    for (;;) {
      const event = await this.stream.next();
      if (event.type === 'end') return;
      yield event;
    }
  }

  children(): ChildStatus[] {
    return [...this.entries.values()].map((e) => ({
      name: e.spec.name,
      policy: e.spec.policy,
      state: e.state,
      generation: e.generation,
      ready: e.ready,
      dynamic: e.dynamic,
    }));
  }

  /** Recorded failures; the fatal one (restart intensity) first. */
  failures(): ChildFailure[] {
    return this.fatal ? [this.fatal, ...this.recorded] : [...this.recorded];
  }

  private add(spec: ChildSpec<C>, dynamic: boolean): Entry<C> {
    const entry = newEntry(spec, dynamic);
    if (this.entries.has(spec.name)) {
      throw new CorralError('invalid_argument', `supervisor "${this.name}" already has a child named "${spec.name}"`);
    }
    this.entries.set(spec.name, entry);
    return entry;
  }

  /** Start the next generation of `entry`: fresh signal, fresh state, factory called again. */
  private launch(entry: Entry<C>): void {
    if (this.current !== 'running') return;
    const generation = ++entry.generation;
    const controller = new AbortController();
    entry.state = 'running';
    entry.abort = controller;
    entry.ready = false;
    entry.restartTimer = null;
    const { name } = entry.spec;
    this.emit({ type: 'started', name, generation, atMs: this.clock.nowMs() });
    const run: ChildRun = { name, generation, clock: this.clock, markReady: () => this.markReady(entry, generation) };
    let result: Promise<ChildExit>;
    try {
      result = Promise.resolve(entry.spec.factory(this.ctx, controller.signal, run));
    } catch (e) {
      // A factory that throws synchronously (not an async function) is still a child failure.
      result = Promise.reject(e);
    }
    result
      .then(
        (value) => this.onChildEnd(entry, generation, controller.signal, isChildError(value) ? value : null),
        (error: unknown) => this.onChildEnd(entry, generation, controller.signal, { error }),
      )
      .catch((e: unknown) => this.onInternalError(e));
  }

  private onChildEnd(entry: Entry<C>, generation: number, signal: AbortSignal, failure: { error: unknown } | null): void {
    if (entry.generation !== generation || (entry.state !== 'running' && entry.state !== 'stopping')) return;
    entry.abort = null;
    const { name, policy } = entry.spec;
    if (entry.state === 'stopping') {
      // Invariant 2: asked to stop, so never restarted; only a real error is worth recording.
      if (failure && !isAbortLike(failure.error, signal)) this.recordFailure(entry, failure.error);
      this.endChild(entry, 'stop');
      return;
    }
    const restart = policy === 'permanent' || (policy === 'transient' && failure !== null);
    let fatal: CorralError | null = null;
    if (restart) {
      const count = this.window.record(this.clock.nowMs());
      if (this.window.exceeded(count)) {
        fatal = new CorralError(
          'restart_intensity',
          `supervisor "${this.name}": child "${name}" exceeded the restart intensity: ${count} restarts within ` +
            `${this.window.withinMs} ms (max ${this.window.maxRestarts})`,
          { details: { child: name, restarts: count, maxRestarts: this.window.maxRestarts, withinMs: this.window.withinMs } },
        );
      }
    }
    if (failure) {
      this.emit({
        type: 'failed',
        name,
        generation,
        diagnostic: describeError(failure.error),
        willRestart: restart && !fatal,
        atMs: this.clock.nowMs(),
      });
    }
    if (fatal) {
      this.fatal = { name, generation, error: fatal, diagnostic: describeError(fatal) };
      this.endChild(entry, 'failure');
      this.stopAll();
    } else if (restart) {
      this.scheduleRestart(entry);
    } else if (failure) {
      this.recorded.push({ name, generation, error: failure.error, diagnostic: describeError(failure.error) });
      this.endChild(entry, 'failure');
    } else {
      this.endChild(entry, 'normal');
    }
  }

  private recordFailure(entry: Entry<C>, error: unknown): void {
    const diagnostic = describeError(error);
    const { name } = entry.spec;
    const generation = entry.generation;
    this.emit({ type: 'failed', name, generation, diagnostic, willRestart: false, atMs: this.clock.nowMs() });
    this.recorded.push({ name, generation, error, diagnostic });
  }

  private scheduleRestart(entry: Entry<C>): void {
    entry.state = 'restart-wait';
    const delay = entry.spec.restartDelayMs ?? this.restartDelayMs;
    entry.restartTimer = this.clock.setTimeout(() => {
      entry.restartTimer = null;
      if (entry.state !== 'restart-wait' || this.current !== 'running') return;
      this.emit({ type: 'restarted', name: entry.spec.name, generation: entry.generation + 1, atMs: this.clock.nowMs() });
      this.launch(entry);
    }, delay);
  }

  /** Ask one child to stop. Running children get their signal aborted and end later. */
  private stopChild(entry: Entry<C>): void {
    switch (entry.state) {
      case 'running':
        entry.state = 'stopping';
        entry.abort?.abort(new CorralError('shutdown', `supervisor "${this.name}" stopped child "${entry.spec.name}"`));
        return;
      case 'restart-wait':
        entry.restartTimer?.cancel();
        this.endChild(entry, 'stop');
        return;
      case 'idle':
        // Never started (stop before start): nothing ran, so nothing to report.
        this.settleEntry(entry);
        return;
      default:
        return;
    }
  }

  private endChild(entry: Entry<C>, reason: StopReason): void {
    this.emit({ type: 'stopped', name: entry.spec.name, generation: entry.generation, reason, atMs: this.clock.nowMs() });
    this.settleEntry(entry);
    this.maybeFinish();
  }

  private settleEntry(entry: Entry<C>): void {
    entry.state = 'ended';
    entry.abort = null;
    entry.restartTimer = null;
    entry.ready = false;
    // Dynamic children are forgotten so the same name (e.g. an actor key) can be added again.
    if ((entry.dynamic || entry.forget) && this.entries.get(entry.spec.name) === entry) {
      this.entries.delete(entry.spec.name);
    }
    for (const wake of entry.endWaiters.splice(0)) wake();
  }

  private markReady(entry: Entry<C>, generation: number): void {
    if (!entry.spec.readiness || entry.generation !== generation || entry.ready || entry.state !== 'running') return;
    entry.ready = true;
    this.emit({ type: 'ready', name: entry.spec.name, generation, atMs: this.clock.nowMs() });
  }

  private stopAll(): void {
    if (this.current === 'stopping' || this.current === 'ended') return;
    this.current = 'stopping';
    for (const entry of [...this.entries.values()]) this.stopChild(entry);
    this.maybeFinish();
  }

  private maybeFinish(): void {
    if (this.current === 'idle' || this.current === 'ended') return;
    for (const e of this.entries.values()) {
      if (e.state === 'running' || e.state === 'stopping' || e.state === 'restart-wait') return;
    }
    if (this.current === 'running' && this.keepAlive) return;
    this.finish();
  }

  private finish(): void {
    this.current = 'ended';
    this.parentSignal?.removeEventListener('abort', this.onParentAbort);
    this.stream.close();
    this.ended.resolve();
    const failure = this.failures()[0];
    if (failure) this.outcome.reject(toError(failure.error));
    else this.outcome.resolve();
  }

  /** A bug in this module: record it as fatal and stop, rather than leaving children orphaned. */
  private onInternalError(e: unknown): void {
    if (!this.fatal) {
      const error = new CorralError('internal', `supervisor "${this.name}": internal error`, { cause: e });
      this.fatal = { name: this.name, generation: 0, error, diagnostic: describeError(e) };
    }
    this.stopAll();
  }

  private emit(event: SupervisorEvent): void {
    this.stream.push(event);
  }
}
