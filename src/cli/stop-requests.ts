/**
 * What a request to stop means to the daemon command: the first starts the graceful stop (drain,
 * then stop the workers); a later one forces an exit only when it is a real second request.
 *
 * Two things look like a second request and are not:
 * - an echo of the first signal. A terminal's Ctrl-C (SIGINT) and `kill -- -PGID` (what a shell
 *   or a process manager sends) reach every process of the foreground group, and npm and npx
 *   forward the signal they got to their child too: under `npm start` the daemon gets the same
 *   Ctrl-C twice, a few milliseconds apart. Signals within `echoMs` of the first are one request.
 * - the launcher going away. `npx` exits at the first SIGTERM without waiting for the daemon, and
 *   the daemon notices its parent gone (parent-watch.ts) during its drain: that asks for the stop
 *   already under way.
 */

export type StopSource = 'signal' | 'parent-gone';

/** `stop`: begin the graceful stop; `ignore`: it is under way already; `force`: exit now. */
export type StopDecision = 'stop' | 'ignore' | 'force';

/** Signals this close to the first are its echo (npm forwards within milliseconds). */
export const SIGNAL_ECHO_MS = 1_000;

export class StopRequests {
  private stopping = false;
  private firstSignalAtMs: number | undefined;
  private readonly nowMs: () => number;
  private readonly echoMs: number;

  constructor(nowMs: () => number = Date.now, echoMs = SIGNAL_ECHO_MS) {
    this.nowMs = nowMs;
    this.echoMs = echoMs;
  }

  /** Whether a stop was requested (by a signal or the launcher's exit). */
  get requested(): boolean {
    return this.stopping;
  }

  next(source: StopSource): StopDecision {
    const now = this.nowMs();
    const firstSignal = source === 'signal' && this.firstSignalAtMs === undefined;
    if (firstSignal) this.firstSignalAtMs = now;
    if (!this.stopping) {
      this.stopping = true;
      return 'stop';
    }
    if (source === 'parent-gone' || firstSignal) return 'ignore';
    return now - this.firstSignalAtMs! < this.echoMs ? 'ignore' : 'force';
  }
}
