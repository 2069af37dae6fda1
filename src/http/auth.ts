/**
 * Bearer tokens on every /v1 route (src/ops/api-tokens.ts makes and verifies them), and the
 * session cookie a browser page uses where it cannot send a header (`EventSource`).
 *
 *  B1 Authorization runs first, in the route's `onRequest` hook: before the body is read, before
 *     any parameter is looked at, so a request without a valid token learns nothing but 401 (or
 *     403 without the scope), and its body, however large, is never parsed.
 *  B2 401 `unauthorized` for no credentials, an `Authorization` header that is not
 *     `Bearer <token>`, and a token that is unknown or revoked: one message for the last two, so
 *     a caller cannot tell which. 403 `forbidden` for a valid token without the route's scope.
 *  B3 A token is never logged, nor any `Authorization` or `Cookie` header: only the token's name,
 *     once verified.
 *  B4 The session cookie (`corral_session`, set by `POST /v1/session` from a valid bearer token)
 *     holds the token itself and is verified exactly as the header is, on every request: a
 *     revoked token's cookie is refused at once. It is taken on GET routes only, and only when
 *     there is no `Authorization` header (the header wins, and a bad header is not rescued by a
 *     cookie). A write never accepts it: a page on another site can make a browser send cookies
 *     with a POST, never an `Authorization` header, so no send can be forged (CSRF). The cookie
 *     itself is `HttpOnly` (no script reads it), `SameSite=Strict` (no other site's page or link
 *     makes the browser send it), `Path=/v1`, and `Secure` when the request came over HTTPS.
 *  B5 A client address that failed to authenticate `authFailuresPerMinute` times in a minute (no
 *     token, a malformed header, a token unknown, revoked or expired) is refused 429
 *     `rate_limited` until the minute is over, before its token is looked at: guessing tokens
 *     costs a minute per few dozen guesses, and the database nothing.
 *  B6 A token may be limited to some actors (src/base/actor-scope.ts) and may expire: a route
 *     that names an actor outside the token's answers 404 `not_found`, as for an actor that does
 *     not exist (`requireActor`); an expired token is refused as a revoked one is (B2).
 */
import type { TLSSocket } from 'node:tls';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { formatActorKey, type ActorKey } from '../base/actor-key.ts';
import { actorInScope } from '../base/actor-scope.ts';
import { systemClock, type Clock } from '../base/clock.ts';
import { CorralError } from '../base/errors.ts';
import { WindowCounter } from '../base/rate-limits.ts';
import type { ApiTokenScope, TokenVerifier, VerifiedApiToken } from '../ops/api-tokens.ts';

const AuthorizationHeader = z.string().regex(/^Bearer +[\x21-\x7e]+ *$/i);

/** B4: the session cookie's name, and how long a browser keeps it (the token's validity is its own: until revoked). */
export const SESSION_COOKIE = 'corral_session';
export const SESSION_MAX_AGE_S = 8 * 60 * 60;

const verified = new WeakMap<FastifyRequest, VerifiedApiToken>();

/** The token that authorized `req` (B1 ran). */
export function tokenOf(req: FastifyRequest): VerifiedApiToken {
  const token = verified.get(req);
  if (!token) throw new CorralError('internal', 'a route ran without its authorization');
  return token;
}

/** The token text of an `Authorization: Bearer <token>` header; `undefined` for any other header. */
export function bearerToken(header: string | undefined): string | undefined {
  if (header === undefined || !AuthorizationHeader.safeParse(header).success) return undefined;
  return header.replace(/^Bearer +/i, '').trimEnd();
}

/** B4: the first `corral_session` value of a `Cookie` header (the browser sends the most specific path first). */
export function sessionCookieOf(header: string | undefined): string | undefined {
  if (header === undefined) return undefined;
  for (const pair of header.split(';')) {
    const eq = pair.indexOf('=');
    if (eq > 0 && pair.slice(0, eq).trim() === SESSION_COOKIE) return pair.slice(eq + 1).trim();
  }
  return undefined;
}

export interface AccessRule {
  /** The scope the route needs; `undefined`: any valid token. */
  scope: ApiTokenScope | undefined;
  /** B4: whether the session cookie may stand in for the header (GET routes only). */
  cookie: boolean;
}

/** B5: the failed authentications of each client address, per minute. */
export class AuthFailures {
  private readonly counter: WindowCounter;

  constructor(perMinute: number, clock: Clock = systemClock) {
    this.counter = new WindowCounter(clock, perMinute, 60_000);
  }

  /** Refuses `address` while it is at its limit (429 with when to try again). */
  check(address: string): void {
    const ms = this.counter.blockedFor(address);
    if (ms !== undefined) {
      throw new CorralError('rate_limited', 'too many failed authentications from this address: try again in a minute', {
        details: { retryAfterS: ms / 1000 },
      });
    }
  }

  failed(address: string): void {
    this.counter.take(address);
  }
}

/** B1, B2, B4, B5: the `onRequest` hook of a route with `rule`. */
export function requireToken(verifier: TokenVerifier, rule: AccessRule, failures: AuthFailures) {
  return async (req: FastifyRequest, _reply: FastifyReply): Promise<void> => {
    failures.check(req.ip);
    try {
      verified.set(req, await authorize(req, verifier, rule));
    } catch (e) {
      if (e instanceof CorralError && e.code === 'unauthorized') failures.failed(req.ip);
      throw e;
    }
  };
}

/** B6: refuses `actor` when `req`'s token may not touch it, as for an actor that does not exist. */
export function requireActor(req: FastifyRequest, actor: ActorKey): void {
  if (actorInScope(tokenOf(req).actors, actor)) return;
  throw new CorralError('not_found', `no actor ${formatActorKey(actor)} (or not one this token may touch)`, {
    details: { actor: formatActorKey(actor) },
  });
}

/** B1, B2, B4: the token of `req`, checked; `unauthorized` or `forbidden` otherwise. */
async function authorize(req: FastifyRequest, verifier: TokenVerifier, rule: AccessRule): Promise<VerifiedApiToken> {
  const header = req.headers.authorization;
  let text: string;
  if (header !== undefined) {
    const fromHeader = bearerToken(header);
    if (fromHeader === undefined) {
      throw new CorralError('unauthorized', 'the Authorization header must be "Bearer <token>"', { details: { tokenGiven: true } });
    }
    text = fromHeader;
  } else {
    // B4: checked on the request's own method too, whatever the route was registered with
    const cookie = rule.cookie && req.method === 'GET' ? sessionCookieOf(req.headers.cookie) : undefined;
    if (cookie === undefined) {
      const also = rule.cookie ? ', or the session cookie of POST /v1/session' : '; a session cookie is taken by GET routes only';
      throw new CorralError('unauthorized', `an API token is needed: Authorization: Bearer <token> (corral tokens create)${also}`, {
        details: { tokenGiven: false },
      });
    }
    text = cookie;
  }
  const token = await verifier.verify(text);
  if (!token) {
    throw new CorralError('unauthorized', 'the token is not valid (unknown, revoked or expired)', { details: { tokenGiven: true } });
  }
  if (rule.scope !== undefined && !token.scopes.includes(rule.scope)) {
    throw new CorralError('forbidden', `the token ${token.name} has no scope ${rule.scope} (its scopes: ${token.scopes.join(', ')})`, {
      details: { scope: rule.scope },
    });
  }
  return token;
}

/**
 * Whether `req` came over HTTPS: to the server itself, or to a proxy in front of it that says so
 * (`X-Forwarded-Proto`, its first value). The header is taken on trust because all it can do is
 * make the cookie stricter (`Secure`).
 */
export function cameOverHttps(req: FastifyRequest): boolean {
  if ((req.raw.socket as Partial<TLSSocket>).encrypted === true) return true;
  const proto = req.headers['x-forwarded-proto'];
  const first = (Array.isArray(proto) ? proto[0] : proto)?.split(',')[0]?.trim().toLowerCase();
  return first === 'https';
}

/** B4: the `Set-Cookie` value that gives the browser `token` (`undefined`: clears it). */
export function sessionCookie(token: string | undefined, secure: boolean): string {
  const value = token ?? '';
  const maxAge = token === undefined ? 0 : SESSION_MAX_AGE_S;
  return `${SESSION_COOKIE}=${value}; HttpOnly; SameSite=Strict; Path=/v1; Max-Age=${maxAge}${secure ? '; Secure' : ''}`;
}
