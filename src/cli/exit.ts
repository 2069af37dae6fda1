/**
 * Maps typed errors to messages and exit codes: 0 done, 1 error, 2 bad arguments, 3 nothing
 * matched, 4 the actor is busy (a send its input policy `reject` refused); and keeps a closed pipe from turning into an error.
 */
import { CorralError, errorMessage, isConnectionError, toError } from '../base/errors.ts';

export const EXIT = { ok: 0, error: 1, usage: 2, nothingMatched: 3, actorBusy: 4 } as const;

export function exitCodeFor(e: unknown): number {
  if (e instanceof CorralError) {
    switch (e.code) {
      case 'invalid_actor_key':
      case 'invalid_argument':
      case 'payload_too_large':
      case 'invalid_config':
        return EXIT.usage;
      case 'nothing_matched':
      case 'not_found':
        return EXIT.nothingMatched;
      case 'actor_busy':
        return EXIT.actorBusy;
      default:
        return EXIT.error;
    }
  }
  return EXIT.error;
}

export function messageFor(e: unknown): string {
  // A CorralError's message is written for the operator already; its cause (a connection error,
  // say) is what it explains, not something to prefix again.
  if (e instanceof CorralError) return e.message;
  if (isConnectionError(e)) {
    return `cannot reach the database: ${toError(e).message} (is DATABASE_URL right and the server up?)`;
  }
  const err = toError(e);
  return err.message.startsWith('Failed query') ? `database error: ${errorMessage(err)}` : err.message;
}

let droppingOnClosedPipe = false;

/**
 * Output to a closed pipe (`corral status | head -1`) ends quietly: the reader has all it wanted,
 * so the rest of the output is dropped and the command finishes with its own exit code. Without
 * a listener, the stream's EPIPE error is an uncaught exception: a stack trace and exit 1.
 * For stdout and stderr, once per process (the CLI and the dlq:* scripts).
 */
export function dropOutputOnClosedPipe(): void {
  if (droppingOnClosedPipe) return;
  droppingOnClosedPipe = true;
  for (const stream of [process.stdout, process.stderr]) {
    stream.on('error', (e: NodeJS.ErrnoException) => {
      if (e.code !== 'EPIPE') throw e;
      // a destroyed stream drops later writes without raising another error
      stream.destroy();
    });
  }
}
