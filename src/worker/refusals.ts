/**
 * A worker refused by its daemon: what it logs and the typed error it reports
 * (docs/protocol.md §13 "When the handshake fails", §10).
 *
 * A CURVE handshake that fails reaches the worker as a socket event only, never as a message:
 * - `handshake:error:auth`: the daemon's ZAP handler refused the worker's public key (not on the
 *   allow-list: unknown or revoked; or at a connection limit). libzmq does not retry it, the SDK
 *   does (after its reconnect backoff). Logged every time; reported `key_refused` at the
 *   `KEY_REFUSALS`th in a row: a daemon reads its allow-list again at most every 50 ms for
 *   unknown keys, so a key issued a moment ago (by `corral keys add-worker`, or under
 *   `CORRAL_HOME` by this very worker) may be refused once, and admitted on the next try.
 * - `handshake:error:protocol`: one side runs CURVE, the other not. Logged once until a handshake
 *   succeeds; reported `curve_mismatch`.
 * - `handshake:error:other` (EPIPE): the daemon could not read the greeting, which is what a wrong
 *   daemon public key (`server_key`) looks like; libzmq retries it forever, every ~100 ms. A
 *   mismatch of CURVE shows a few of these before its protocol error (five, on a loaded machine),
 *   so only `SERVER_KEY_FAILURES` in a row over `SERVER_KEY_WINDOW_MS`, with no handshake and no
 *   protocol error between, are reported `server_key_mismatch` (and logged again then, saying so).
 * After the handshake, `error{unauthorized | identity_mismatch}` answering `worker_ready` is a
 * refused registration (wrong id, token or key proof; the worker limit): `registration_refused`.
 * The refusals that say "try again later" (too many registrations in progress) or concern a
 * challenge's nonce (a reconnect crossed a challenge) are not reported: the SDK registers again
 * by itself and they pass.
 */
import type { Dealer } from 'zeromq';
import { CorralError, type ErrorCode } from '../base/errors.ts';
import type { Logger } from '../base/logger.ts';

/** Handshakes failing without detail in a row taken as a wrong daemon public key (~0.5 s of libzmq's retries)… */
export const SERVER_KEY_FAILURES = 5;
/**
 * …over at least this long: a CURVE mismatch on a loaded machine can show five of them before its
 * protocol error, never two seconds of them.
 */
export const SERVER_KEY_WINDOW_MS = 2_000;

/** Key refusals in a row taken as final (the SDK's reconnects between them take 150–300 ms). */
export const KEY_REFUSALS = 3;

export type RefusalListener = (error: CorralError) => void;

function refusal(code: ErrorCode, message: string, details: Record<string, unknown>): CorralError {
  return new CorralError(code, message, { retryable: false, details });
}

/**
 * Watches `socket`'s handshake failures: logs them and reports each refusal to `onRefused`.
 * `succeeded()` (on a handshake) re-arms the once-only lines and restarts the count.
 */
export function watchHandshakes(
  socket: Dealer,
  log: Logger,
  at: { workerId: string; endpoint: string },
  onRefused: RefusalListener = () => undefined,
  now: () => number = Date.now,
): { succeeded(): void } {
  let logged = false;
  let failedWithoutDetail = 0;
  let firstWithoutDetailAt = 0;
  let serverKeyReported = false;
  let keyRefused = 0;
  socket.events.on('handshake:error:auth', (ev) => {
    log.error(
      { status: ev.error.message },
      "the daemon refused this worker's key (not on its allow-list, or at its connection limit per key or in all?)",
    );
    if (++keyRefused !== KEY_REFUSALS) return;
    onRefused(
      refusal(
        'key_refused',
        `the daemon at ${at.endpoint} refused the key of worker ${at.workerId}: it is not on the daemon's allow-list ` +
          '(unknown, or revoked), or the key is at its connection limit',
        { ...at, status: ev.error.message, refusals: keyRefused },
      ),
    );
  });
  socket.events.on('handshake:error:protocol', (ev) => {
    failedWithoutDetail = 0; // the failures before it were this mismatch's greetings crossing
    serverKeyReported = false;
    if (!logged)
      log.error({ err: ev.error.message }, 'handshake failed: the daemon and this worker disagree on CURVE (one of them insecure?)');
    logged = true;
    onRefused(
      refusal(
        'curve_mismatch',
        `the daemon at ${at.endpoint} and worker ${at.workerId} disagree on CURVE: one of them runs without it (--insecure)`,
        { ...at, err: ev.error.message },
      ),
    );
  });
  socket.events.on('handshake:error:other', (ev) => {
    if (!logged)
      log.error({ err: ev.error.message }, "handshake failed without detail (the daemon's public key, server_key, wrong?); retrying");
    logged = true;
    if (failedWithoutDetail++ === 0) firstWithoutDetailAt = now();
    if (serverKeyReported || failedWithoutDetail < SERVER_KEY_FAILURES || now() - firstWithoutDetailAt < SERVER_KEY_WINDOW_MS) return;
    serverKeyReported = true;
    const message =
      `the CURVE handshake of worker ${at.workerId} with ${at.endpoint} failed ${failedWithoutDetail} times in a row without ` +
      "detail: the daemon's public key (server_key) is not the key of the daemon there";
    log.error({ failures: failedWithoutDetail }, message);
    onRefused(refusal('server_key_mismatch', message, { ...at, err: ev.error.message }));
  });
  return {
    succeeded: () => {
      logged = false;
      failedWithoutDetail = 0;
      serverKeyReported = false;
      keyRefused = 0;
    },
  };
}

/** The typed error of a refused `worker_ready`, or undefined for an answer that is no refusal or passes by itself. */
export function registrationRefusal(code: string, message: string, at: { workerId: string; endpoint: string }): CorralError | undefined {
  if (code !== 'unauthorized' && code !== 'identity_mismatch') return undefined;
  if (/try again later|nonce/i.test(message)) return undefined;
  return refusal('registration_refused', `the daemon at ${at.endpoint} refused to register worker ${at.workerId}: ${message}`, {
    ...at,
    protocolCode: code,
    reason: message,
  });
}
