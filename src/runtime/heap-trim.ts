/**
 * Idle heap trim. A burst of turns grows V8's heap, and V8 keeps what it grew to (committed, not in
 * use) long after the burst: a daemon that then idles for hours would hold hundreds of MB it does
 * not need. Once the daemon has been idle for `idleMs` after some activity (no job fetched, no turn
 * in flight), it runs ONE memory-reducing garbage collection, which gives the free pages back to
 * the system; then it waits for the next busy spell. The pause (tens of ms) falls when nothing runs.
 */
import v8 from 'node:v8';
import vm from 'node:vm';
import type { Clock } from '../base/clock.ts';
import type { Logger } from '../base/logger.ts';

export interface HeapTrimOptions {
  clock: Clock;
  logger: Logger;
  /** Idle time before a trim; 0 = never. */
  idleMs: number;
  /** Turns in flight in this daemon. */
  inFlight: () => number;
  /** The trim itself (default: a memory-reducing GC, see `memoryReducingGc`). */
  trim?: () => void;
}

export class HeapTrim {
  private readonly opts: HeapTrimOptions;
  private lastActivityMs: number;
  /** Something ran since the last trim (a trim with nothing to give back is skipped). */
  private dirty = false;

  constructor(opts: HeapTrimOptions) {
    this.opts = opts;
    this.lastActivityMs = opts.clock.nowMs();
  }

  /** Jobs were fetched (or a turn otherwise ran). */
  noteActivity(): void {
    this.lastActivityMs = this.opts.clock.nowMs();
    this.dirty = true;
  }

  /** One check: trims when due. Returns whether it trimmed. */
  pass(): boolean {
    const { idleMs, clock } = this.opts;
    if (idleMs <= 0 || !this.dirty) return false;
    if (this.opts.inFlight() > 0) {
      this.lastActivityMs = clock.nowMs();
      return false;
    }
    if (clock.nowMs() - this.lastActivityMs < idleMs) return false;
    this.dirty = false;
    const before = process.memoryUsage();
    const t0 = performance.now();
    (this.opts.trim ?? memoryReducingGc)();
    const after = process.memoryUsage();
    this.opts.logger.info(
      { ms: Math.round(performance.now() - t0), rssMiB: mib(before.rss, after.rss), heapTotalMiB: mib(before.heapTotal, after.heapTotal) },
      'idle: heap trimmed',
    );
    return true;
  }
}

const mib = (a: number, b: number) => `${(a / 2 ** 20).toFixed(0)} → ${(b / 2 ** 20).toFixed(0)}`;

type GcFunction = (options?: { type?: 'major' | 'minor'; execution?: 'sync' | 'async'; flavor?: 'regular' | 'last-resort' }) => void;

let gcFunction: GcFunction | null | undefined;

/**
 * A full, memory-reducing garbage collection (V8's "last resort" collection: it compacts and
 * releases free pages). V8 offers it only through its `gc` extension, which Node installs with
 * `--expose-gc`; the flag is set here, once, and the function taken from a fresh context (as
 * test runners do). Where that is not possible, nothing happens.
 */
export function memoryReducingGc(): void {
  if (gcFunction === undefined) {
    try {
      v8.setFlagsFromString('--expose-gc');
      gcFunction = vm.runInNewContext('gc') as GcFunction;
    } catch {
      gcFunction = null;
    }
  }
  gcFunction?.({ type: 'major', execution: 'sync', flavor: 'last-resort' });
}
