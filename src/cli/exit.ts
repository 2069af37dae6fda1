/** Maps typed errors to messages and exit codes: 0 done, 1 error, 2 bad arguments, 3 nothing matched. */
import { CorralError, errorMessage, isConnectionError, toError } from '../errors.ts';

export const EXIT = { ok: 0, error: 1, usage: 2, nothingMatched: 3 } as const;

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
