/**
 * A FIFO of async operations that run strictly one at a time; a failed operation does not stop
 * the ones after it.
 *
 * Used where two operations must never interleave: sends on one ZeroMQ socket (zeromq.js 6
 * allows one `send()` in flight; a second concurrent call throws "Socket is busy writing"), and
 * the operations of one actor on its SessionController.
 */
export class SerialQueue {
  private tail: Promise<void> = Promise.resolve();
  private queued = 0;

  /** Number of operations waiting or running. */
  get depth(): number {
    return this.queued;
  }

  /** Run `op` after every previously queued operation has settled; resolves with its result. */
  run<T>(op: () => Promise<T>): Promise<T> {
    this.queued++;
    const result = this.tail.then(op);
    // The chain must survive a rejected op, or one failure would wedge every later send.
    this.tail = result.then(
      () => void this.queued--,
      () => void this.queued--,
    );
    return result;
  }

  /** Resolves once everything queued so far has settled. */
  idle(): Promise<void> {
    return this.tail;
  }
}
