/**
 * Who may use the console, and how a write is protected (docs/console.md):
 *
 *  A1 Every console route but the sign-in page and the two static files needs an `admin` token:
 *     `Authorization: Bearer <token>` (as the /v1 routes take it, B1-B3 and B5 of ../auth.ts), or
 *     the console's session cookie (`corral_console`, `Path=/console`, HttpOnly,
 *     SameSite=Strict) that signing in sets. A token without `admin` is 403 `forbidden`, whatever
 *     else it may do; a session whose token was revoked is refused at once (C3).
 *  A2 CSRF: a write (POST) made with the cookie must carry the session's CSRF token (the `_csrf`
 *     field of the page's forms, or an `X-CSRF-Token` header); one made with a bearer header needs
 *     none, since no other site can make a browser send that header. Any POST whose `Origin`
 *     names another host than the request's (`Host`, or a proxy's `X-Forwarded-Host`), or that a
 *     browser marks `Sec-Fetch-Site: cross-site`, is refused first, the sign-in's too (no other
 *     site can sign a browser in as someone else).
 *  A3 Every action is logged with the token's name (`console action`), never the token.
 */
import type { FastifyRequest } from 'fastify';
import { CorralError } from '../../base/errors.ts';
import type { DbOrTx } from '../../db/client.ts';
import { csrfMatches, csrfTokenOf, sessionToken } from '../../ops/console-sessions.ts';
import type { TokenVerifier } from '../../ops/api-tokens.ts';
import { bearerToken, type AuthFailures } from '../auth.ts';

export const CONSOLE_COOKIE = 'corral_console';

export interface ConsolePrincipal {
  tokenName: string;
  via: 'bearer' | 'cookie';
  /** The session's secret (cookie callers). */
  secret?: string;
  expiresAt: Date | null;
}

const principals = new WeakMap<FastifyRequest, ConsolePrincipal>();

export function principalOf(req: FastifyRequest): ConsolePrincipal {
  const p = principals.get(req);
  if (!p) throw new CorralError('internal', 'a console route ran without its authorization');
  return p;
}

/** The CSRF token forms of this request's pages carry ('' for a bearer caller, who needs none). */
export const csrfOf = (p: ConsolePrincipal): string => (p.secret ? csrfTokenOf(p.secret) : '');

/** The value of cookie `name` in a `Cookie` header. */
export function cookieOf(header: string | undefined, name: string): string | undefined {
  if (header === undefined) return undefined;
  for (const pair of header.split(';')) {
    const eq = pair.indexOf('=');
    if (eq > 0 && pair.slice(0, eq).trim() === name) return pair.slice(eq + 1).trim();
  }
  return undefined;
}

/** The `Set-Cookie` of a session (`undefined`: clears it). */
export function consoleCookie(secret: string | undefined, maxAgeS: number, secure: boolean): string {
  return `${CONSOLE_COOKIE}=${secret ?? ''}; HttpOnly; SameSite=Strict; Path=/console; Max-Age=${secret ? Math.max(0, Math.floor(maxAgeS)) : 0}${secure ? '; Secure' : ''}`;
}

/** A2: refuses a POST another site made. */
export function requireSameOrigin(req: FastifyRequest): void {
  if (req.method === 'GET' || req.method === 'HEAD') return;
  const site = req.headers['sec-fetch-site'];
  if (site === 'cross-site')
    throw new CorralError('forbidden', 'a cross-site request may not act on the console', { details: { scope: 'admin' } });
  const origin = req.headers.origin;
  if (origin === undefined) return;
  if (origin === 'null') {
    // a browser that withholds the origin says where the request came from in Sec-Fetch-Site
    if (site === 'same-origin') return;
    throw new CorralError('forbidden', 'a request from an opaque origin may not act on the console', { details: { scope: 'admin' } });
  }
  let host: string;
  try {
    host = new URL(origin).host;
  } catch {
    throw new CorralError('forbidden', 'the Origin header is not a URL', { details: { scope: 'admin' } });
  }
  // behind a proxy that rewrites Host, the Host the browser used is in X-Forwarded-Host: no other
  // site can set that header on a browser's request (it is not one a form or a simple request sends)
  const forwarded = req.headers['x-forwarded-host'];
  const forwardedHost = (Array.isArray(forwarded) ? forwarded[0] : forwarded)?.split(',')[0]?.trim();
  if (host !== req.headers.host && host !== forwardedHost) {
    throw new CorralError('forbidden', `a request from ${origin} may not act on the console`, { details: { scope: 'admin' } });
  }
}

/** A1, B5 of ../auth.ts: the `onRequest` hook of every signed-in route. */
export function requireAdmin(db: DbOrTx, verifier: TokenVerifier, failures: AuthFailures) {
  return async (req: FastifyRequest): Promise<void> => {
    failures.check(req.ip);
    requireSameOrigin(req);
    try {
      principals.set(req, await authorize(req, db, verifier));
    } catch (e) {
      if (e instanceof CorralError && e.code === 'unauthorized') failures.failed(req.ip);
      throw e;
    }
  };
}

async function authorize(req: FastifyRequest, db: DbOrTx, verifier: TokenVerifier): Promise<ConsolePrincipal> {
  const header = req.headers.authorization;
  if (header !== undefined) {
    const text = bearerToken(header);
    if (text === undefined) {
      throw new CorralError('unauthorized', 'the Authorization header must be "Bearer <token>"', { details: { tokenGiven: true } });
    }
    const token = await verifier.verify(text);
    if (!token)
      throw new CorralError('unauthorized', 'the token is not valid (unknown, revoked or expired)', { details: { tokenGiven: true } });
    if (!token.scopes.includes('admin')) {
      throw new CorralError('forbidden', `the token ${token.name} has no scope admin (its scopes: ${token.scopes.join(', ')})`, {
        details: { scope: 'admin' },
      });
    }
    return { tokenName: token.name, via: 'bearer', expiresAt: token.expiresAt };
  }
  const secret = cookieOf(req.headers.cookie, CONSOLE_COOKIE);
  if (secret === undefined || secret === '') {
    throw new CorralError('unauthorized', 'sign in first (/console/sign-in), or send Authorization: Bearer <an admin token>', {
      details: { tokenGiven: false, signIn: true },
    });
  }
  const session = await sessionToken(db, secret);
  if (!session) {
    throw new CorralError('unauthorized', 'the console session has ended (signed out, expired, or its token revoked): sign in again', {
      details: { tokenGiven: true, signIn: true },
    });
  }
  return { tokenName: session.tokenName, via: 'cookie', secret, expiresAt: session.expiresAt };
}

/** A2: a cookie caller's write carries its session's CSRF token (`_csrf` in the body, or `X-CSRF-Token`). */
export function requireCsrf(req: FastifyRequest, bodyToken: unknown): void {
  const p = principalOf(req);
  if (p.via === 'bearer') return;
  const header = req.headers['x-csrf-token'];
  const given = typeof header === 'string' ? header : bodyToken;
  if (!csrfMatches(p.secret!, given)) {
    throw new CorralError('forbidden', 'the form has no valid CSRF token: reload the page and try again', { details: { scope: 'admin' } });
  }
}
