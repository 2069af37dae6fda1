/**
 * A FIFO of async operations that run strictly one at a time.
 *
 * Why: a zeromq.js socket allows only one `send()` in flight; a second concurrent call throws
 * "Socket is busy writing" synchronously (zeromq.js 6 with libzmq 4.3). Every send on a
 * socket goes through one of these, so callers may call `send` from anywhere, concurrently.
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
