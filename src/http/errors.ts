/**
 * Every failure of the HTTP API as one JSON shape, `{ "error": { "code", "message" } }`, with the
 * status of its code from one table (`STATUS_OF`).
 *
 *  E1 What a handler throws, and what Fastify reports (a body too large, a media type it has no
 *     parser for), becomes a `CorralError` first (`corralErrorOf`); the status is then its
 *     code's, and only its code's.
 *  E2 A client error (4xx) carries its message, written for the caller. A server error (5xx) never
 *     does: its message may name hosts, users or statements, so the response says only what kind
 *     of failure it is, and the log has the rest.
 *  E3 A database that cannot be reached is 503 `database_unavailable`, retryable; anything that is
 *     not a `CorralError` or a known Fastify error is 500 `internal`.
 */
import { CorralError, isDatabaseUnavailable, type ErrorCode } from '../base/errors.ts';

/** E1: the one table. Every code has a row, so a new code cannot reach a response unmapped. */
export const STATUS_OF: Readonly<Record<ErrorCode, number>> = {
  invalid_actor_key: 400,
  invalid_argument: 400,
  invalid_json: 400,
  invalid_timeout: 400,
  unauthorized: 401,
  forbidden: 403,
  not_found: 404,
  nothing_matched: 404,
  method_not_allowed: 405,
  actor_busy: 409,
  idempotency_conflict: 409,
  already_exists: 409,
  shard_count_fixed: 409,
  wrong_shard: 421,
  dead_lettered: 409,
  cancelled: 409,
  fence_rejected: 409,
  payload_too_large: 413,
  unsupported_media_type: 415,
  too_many_streams: 429,
  rate_limited: 429,
  internal: 500,
  invalid_config: 500,
  protocol_error: 500,
  restart_intensity: 500,
  key_refused: 500,
  server_key_mismatch: 500,
  curve_mismatch: 500,
  registration_refused: 500,
  aborted: 500,
  database_unavailable: 503,
  send_failed: 503,
  closed: 503,
  shutdown: 503,
  timeout: 504,
};

/** E2: what a server error says, by code. */
const SERVER_MESSAGES: Partial<Record<ErrorCode, string>> = {
  database_unavailable: 'the database is unavailable: try again shortly',
  send_failed: 'the event could not be written: try again shortly',
  closed: 'the server is shutting down',
  shutdown: 'the server is shutting down',
  timeout: 'the request took too long',
};

/** Seconds a client should wait before trying a 429 or 503 again (`Retry-After`). */
const RETRY_AFTER_S: Partial<Record<number, number>> = { 429: 5, 503: 2 };

export interface HttpError {
  status: number;
  headers: Record<string, string>;
  body: { error: { code: ErrorCode; message: string } };
  /** The error to log: every server error, and nothing of a client's. */
  log: CorralError | undefined;
}

const FASTIFY_CODES: Readonly<Record<string, ErrorCode>> = {
  FST_ERR_CTP_BODY_TOO_LARGE: 'payload_too_large',
  FST_ERR_CTP_INVALID_MEDIA_TYPE: 'unsupported_media_type',
  FST_ERR_CTP_EMPTY_JSON_BODY: 'invalid_json',
  FST_ERR_CTP_INVALID_JSON_BODY: 'invalid_json',
  FST_ERR_CTP_INVALID_CONTENT_LENGTH: 'invalid_argument',
  FST_ERR_BAD_URL: 'invalid_argument',
};

/** E1, E3: `e` as a `CorralError`. `bodyLimit` words the message of a body too large. */
export function corralErrorOf(e: unknown, bodyLimit?: number): CorralError {
  if (e instanceof CorralError) return e;
  const err = e as { code?: unknown; statusCode?: unknown; message?: unknown } | null;
  const fastifyCode = typeof err?.code === 'string' ? FASTIFY_CODES[err.code] : undefined;
  if (fastifyCode === 'payload_too_large') {
    return new CorralError('payload_too_large', `the request body is over ${bodyLimit ?? 'the limit of'} bytes (CORRAL_MAX_EVENT_BYTES)`);
  }
  if (fastifyCode === 'unsupported_media_type') {
    return new CorralError('unsupported_media_type', 'the body must be JSON, sent with Content-Type: application/json');
  }
  if (fastifyCode === 'invalid_json')
    return new CorralError('invalid_json', 'the request body is empty: the event is a JSON value (null is one)');
  if (fastifyCode) return new CorralError(fastifyCode, typeof err?.message === 'string' ? err.message : 'a malformed request');
  if (isDatabaseUnavailable(e)) return new CorralError('database_unavailable', 'the database is unavailable', { cause: e });
  return new CorralError('internal', 'internal error', { cause: e });
}

/** E1, E2: the response for `e`. */
export function httpErrorOf(e: unknown, bodyLimit?: number): HttpError {
  const error = corralErrorOf(e, bodyLimit);
  const status = STATUS_OF[error.code] ?? 500;
  const server = status >= 500;
  const message = server ? (SERVER_MESSAGES[error.code] ?? 'internal error') : error.message;
  // a limit that knows when it lifts says so (`details.retryAfterS`); else the status's default
  const given = error.details.retryAfterS;
  const retryAfter = typeof given === 'number' && Number.isFinite(given) && given > 0 ? Math.ceil(given) : RETRY_AFTER_S[status];
  return {
    status,
    headers: {
      ...(retryAfter === undefined ? {} : { 'retry-after': String(retryAfter) }),
      ...(error.code === 'unauthorized' || error.code === 'forbidden' ? { 'www-authenticate': bearerChallenge(error) } : {}),
    },
    body: { error: { code: server && !(error.code in SERVER_MESSAGES) ? 'internal' : error.code, message } },
    log: server ? error : undefined,
  };
}

/**
 * RFC 6750's challenge: a missing token gets the bare scheme; a token refused says
 * `invalid_token`; one without the route's scope says `insufficient_scope` and the scope.
 */
function bearerChallenge(error: CorralError): string {
  if (error.code === 'forbidden') return `Bearer realm="corral", error="insufficient_scope", scope="${String(error.details.scope)}"`;
  return error.details.tokenGiven === true ? 'Bearer realm="corral", error="invalid_token"' : 'Bearer realm="corral"';
}
