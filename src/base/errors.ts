/**
 * Typed errors with stable codes. Across process boundaries (wire, CLI exit codes) match on
 * `code`, never on `instanceof`.
 */
export type ErrorCode =
  | 'invalid_actor_key'
  | 'invalid_config'
  | 'invalid_argument'
  | 'payload_too_large'
  | 'not_found'
  | 'nothing_matched'
  | 'fence_rejected'
  | 'database_unavailable'
  | 'protocol_error'
  | 'send_failed'
  | 'timeout'
  | 'invalid_timeout'
  | 'restart_intensity'
  | 'shutdown'
  // a worker refused by its daemon (src/worker/refusals.ts): at the CURVE handshake, its key
  // (unknown, revoked, or at a connection limit), the daemon's public key, CURVE on one side only;
  // after it, its registration (`error{unauthorized}`: wrong id, token or key proof)
  | 'key_refused'
  | 'server_key_mismatch'
  | 'curve_mismatch'
  | 'registration_refused'
  | 'idempotency_conflict'
  // a send refused by the actor's input policy `reject`: a turn runs or events wait
  | 'actor_busy'
  // a name taken (an API token's: revoked ones keep theirs)
  | 'already_exists'
  // a shard count that can no longer change, or a shard's schema that is another shard (src/ops/shards.ts)
  | 'shard_count_fixed'
  // an event sent to a shard that does not hold its actor (E10 of src/db/enqueue/send-event.ts)
  | 'wrong_shard'
  // the HTTP API's own (src/http/errors.ts maps every code to one status): no valid bearer token,
  // a token without the scope a route needs, too many streams open, too many requests (a token's
  // stream opens, an address's failed authentications, connections), and requests it cannot read
  | 'unauthorized'
  | 'forbidden'
  | 'too_many_streams'
  | 'rate_limited'
  | 'invalid_json'
  | 'unsupported_media_type'
  | 'method_not_allowed'
  | 'dead_lettered'
  | 'cancelled'
  | 'aborted'
  | 'closed'
  | 'internal';

/** Codes whose errors may succeed when tried again later (the database back, a peer ready). */
const RETRYABLE_CODES: ReadonlySet<ErrorCode> = new Set([
  'database_unavailable',
  'send_failed',
  'timeout',
  'rate_limited',
  'too_many_streams',
]);

export class CorralError extends Error {
  readonly code: ErrorCode;
  /** Whether trying again later may succeed; by default from the code (`RETRYABLE_CODES`). */
  readonly retryable: boolean;
  readonly details: Record<string, unknown>;

  constructor(code: ErrorCode, message: string, opts: { retryable?: boolean; cause?: unknown; details?: Record<string, unknown> } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'CorralError';
    this.code = code;
    this.retryable = opts.retryable ?? RETRYABLE_CODES.has(code);
    this.details = opts.details ?? {};
  }
}

/**
 * Why a fenced operation refused to act: the one list. Stable strings: they travel on the wire
 * (`turn_rejected.reason`, see TURN_REJECTED_REASONS) and docs/protocol.md lists each (a test
 * keeps the table and this list equal).
 */
export const FENCE_REASONS = [
  'unknown_delivery',
  'unknown_activation',
  'wrong_actor',
  'wrong_worker',
  'stale_epoch',
  'stale_revision',
  'stale_event',
  'lease_expired',
  'activation_not_live',
  'delivery_superseded',
  'already_committed',
  'already_failed',
  'cancelled',
  'job_not_active',
] as const;
export type FenceReason = (typeof FENCE_REASONS)[number];

export class FenceRejected extends CorralError {
  readonly reason: FenceReason;
  constructor(reason: FenceReason, message?: string) {
    super('fence_rejected', message ?? `fence rejected: ${reason}`, { details: { reason } });
    this.name = 'FenceRejected';
    this.reason = reason;
  }
}

/** Normalise anything thrown into an Error with a message (never throws). */
export function toError(e: unknown): Error {
  if (e instanceof Error) return e;
  try {
    return new Error(typeof e === 'string' ? e : JSON.stringify(e));
  } catch {
    return new Error(String(e));
  }
}

/**
 * A one-line message for logs. Drizzle wraps driver errors as "Failed query: <the whole SQL>";
 * what went wrong is the cause's message.
 */
export function errorMessage(e: unknown): string {
  const err = toError(e);
  if (err.message.startsWith('Failed query') && err.cause !== undefined) return toError(err.cause).message;
  return err.message;
}

/** Longest message (and stack) of an error as logged. */
const LOGGED_ERROR_CHARS = 2_000;
/** Lines of a stack trace kept in a log line. */
const LOGGED_STACK_LINES = 12;

/**
 * An error as a log line holds it, bounded: its name, code, message and stack cut to a couple of
 * KiB, its cause's message. Drizzle's messages carry the whole statement and its parameters (a
 * worker's result, up to the frame limit) and enumerable fields repeat them: none of that is logged.
 */
export function loggableError(e: unknown): Record<string, unknown> {
  const err = toError(e);
  const out: Record<string, unknown> = { type: err.name, message: cut(err.message, LOGGED_ERROR_CHARS) };
  const code = (err as { code?: unknown }).code;
  if (typeof code === 'string' || typeof code === 'number') out.code = code;
  if (typeof err.stack === 'string') {
    const lines = err.stack.split('\n', LOGGED_STACK_LINES).map((l) => cut(l, 300));
    out.stack = cut(lines.join('\n'), LOGGED_ERROR_CHARS);
  }
  if (err.cause !== undefined) out.cause = cut(errorMessage(err.cause), LOGGED_ERROR_CHARS);
  return out;
}

function cut(s: string, max: number): string {
  return s.length <= max ? s : `${s.slice(0, max)}… (${s.length - max} more characters)`;
}

/**
 * The database errors corral tells apart, in one place. Drivers and Drizzle wrap errors (a
 * DrizzleQueryError's cause is the driver's error): every check looks through `cause`.
 */

/** The SQLSTATE of a database error, looking through wrappers; undefined for other errors. */
export function sqlState(e: unknown, depth = 0): string | undefined {
  const err = e as { code?: unknown; cause?: unknown } | null;
  if (!err || depth > 5) return undefined;
  if (typeof err.code === 'string' && /^[0-9A-Z]{5}$/.test(err.code)) return err.code;
  return err.cause !== undefined && err.cause !== err ? sqlState(err.cause, depth + 1) : undefined;
}

/** Serialization failure or deadlock (40001, 40P01): the transaction may simply be run again. */
export function isRetryableTransactionError(e: unknown): boolean {
  const state = sqlState(e);
  return state === '40001' || state === '40P01';
}

/**
 * The database cannot be used at all from here: unreachable (`isConnectionError`), no such
 * database (3D000) or wrong credentials (28P01). Commands report it as `database_unavailable`.
 */
export function isDatabaseUnavailable(e: unknown): boolean {
  const state = sqlState(e);
  return isConnectionError(e) || state === '3D000' || state === '28P01';
}

const CONNECTION_SQLSTATE_PREFIXES = ['08', '57P']; // connection exceptions, operator intervention (shutdown)
const CONNECTION_ERRNO = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'ENOTFOUND', 'EHOSTUNREACH']);

/** True when the error means "the database is not reachable right now": retry later, lose nothing. */
export function isConnectionError(e: unknown, depth = 0): boolean {
  const err = e as { code?: unknown; syscall?: unknown; message?: unknown; cause?: unknown } | null;
  if (!err || depth > 5) return false;
  // Drizzle wraps driver errors (DrizzleQueryError): the connection error is the cause.
  if (err.cause !== undefined && err.cause !== err && isConnectionError(err.cause, depth + 1)) return true;
  const code = typeof err.code === 'string' ? err.code : '';
  if (CONNECTION_ERRNO.has(code)) return true;
  // a Unix-domain socket whose server is down: the socket file is gone
  if (code === 'ENOENT' && err.syscall === 'connect') return true;
  if (CONNECTION_SQLSTATE_PREFIXES.some((p) => code.startsWith(p))) return true;
  const msg = typeof err.message === 'string' ? err.message : '';
  return /Connection terminated|connection timeout|terminating connection|Client has encountered a connection error|the database system is (starting up|shutting down)/i.test(
    msg,
  );
}

/** SQLSTATE 23505: unique violation. */
export function isUniqueViolation(e: unknown, constraint?: string, depth = 0): boolean {
  const err = e as { code?: unknown; constraint?: unknown; cause?: unknown } | null;
  if (!err || depth > 5) return false;
  if (err.code === '23505') return constraint === undefined || err.constraint === constraint;
  return err.cause !== undefined && err.cause !== err ? isUniqueViolation(err.cause, constraint, depth + 1) : false;
}
