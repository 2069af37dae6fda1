/**
 * What a worker logs when its CURVE handshake fails (docs/protocol.md §13 "When the handshake
 * fails"): every refusal by the daemon, and the first other failure until a handshake succeeds
 * (a wrong daemon public key fails without detail, again on every retry; a NULL/CURVE mismatch
 * fails with a ZMTP protocol error).
 */
import type { Dealer } from 'zeromq';
import type { Logger } from '../logger.ts';

/** Watches `socket`'s handshake failures; `succeeded()` re-arms the once-only lines. */
export function logHandshakeFailures(socket: Dealer, log: Logger): { succeeded(): void } {
  let logged = false;
  socket.events.on('handshake:error:auth', (ev) => {
    log.error(
      { status: ev.error.message },
      "the daemon refused this worker's key (not on its allow-list, or at its connection limit per key or in all?)",
    );
  });
  socket.events.on('handshake:error:protocol', (ev) => {
    if (logged) return;
    logged = true;
    log.error({ err: ev.error.message }, 'handshake failed: the daemon and this worker disagree on CURVE (one of them insecure?)');
  });
  socket.events.on('handshake:error:other', (ev) => {
    if (logged) return;
    logged = true;
    log.error({ err: ev.error.message }, "handshake failed without detail (the daemon's public key, server_key, wrong?); retrying");
  });
  return { succeeded: () => void (logged = false) };
}
