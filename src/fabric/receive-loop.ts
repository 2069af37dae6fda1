/**
 * The receive loop both ends of the fabric run on their one socket: receive, hand the frames to a
 * total handler, repeat until the socket closes. It survives anything: a receive error backs off
 * (so a persistent one cannot become a hot loop) and a throwing handler is logged, never fatal.
 *
 * It shares its process: a `receive()` with a message already queued resolves at once, so a peer
 * that keeps the socket full would keep this loop in microtasks, and no timer, database answer
 * or other socket of the process would run. After SLICE_MS of handling without a pause, the loop
 * yields to the event loop once.
 */
import { backoffDelayMs } from '../base/backoff.ts';
import type { Clock } from '../base/clock.ts';
import { toError } from '../base/errors.ts';
import type { Logger } from '../base/logger.ts';

export interface ReceivingSocket {
  readonly closed: boolean;
  receive(): Promise<Buffer[]>;
}

export async function runReceiveLoop(
  socket: ReceivingSocket,
  opts: { clock: Clock; log: Logger; what: string; stopping?: () => boolean; handle: (frames: Buffer[]) => void },
): Promise<void> {
  let errors = 0;
  let sliceStart = performance.now();
  while (!socket.closed) {
    if (performance.now() - sliceStart >= SLICE_MS) {
      await new Promise<void>((resolve) => setImmediate(resolve));
      sliceStart = performance.now();
    }
    let frames: Buffer[];
    try {
      frames = await socket.receive();
      errors = 0;
    } catch (e) {
      if (socket.closed || opts.stopping?.()) break;
      errors++;
      opts.log.error({ err: toError(e), errors }, `${opts.what} receive failed`);
      await opts.clock.sleep(backoffDelayMs(errors, { baseMs: 10, maxMs: 1_000 })).catch(() => undefined);
      continue;
    }
    try {
      opts.handle(frames);
    } catch (e) {
      // the handler is meant to be total; a throw here is a bug, but must not end the loop
      opts.log.error({ err: toError(e) }, `${opts.what} failed to handle a message`);
    }
  }
}

/** Longest the loop handles messages before it lets the rest of the process run. */
const SLICE_MS = 10;
