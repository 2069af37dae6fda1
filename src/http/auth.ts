/**
 * Bearer tokens on every /v1 route (src/ops/api-tokens.ts makes and verifies them).
 *
 *  B1 Authorization runs first, in the route's `onRequest` hook: before the body is read, before
 *     any parameter is looked at, so a request without a valid token learns nothing but 401 (or
 *     403 without the scope), and its body, however large, is never parsed.
 *  B2 401 `unauthorized` for no `Authorization` header, one that is not `Bearer <token>`, and a
 *     token that is unknown or revoked: one message for the last two, so a caller cannot tell
 *     which. 403 `forbidden` for a valid token without the route's scope.
 *  B3 A token is never logged, nor any `Authorization` header: only the token's name, once verified.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { CorralError } from '../errors.ts';
import type { ApiTokenScope, TokenVerifier, VerifiedApiToken } from '../ops/api-tokens.ts';

const AuthorizationHeader = z.string().regex(/^Bearer +[\x21-\x7e]+ *$/i);

const verified = new WeakMap<FastifyRequest, VerifiedApiToken>();

/** The token that authorized `req` (B1 ran). */
export function tokenOf(req: FastifyRequest): VerifiedApiToken {
  const token = verified.get(req);
  if (!token) throw new CorralError('internal', 'a route ran without its authorization');
  return token;
}

/** B1, B2: the `onRequest` hook of a route that needs `scope`. */
export function requireScope(verifier: TokenVerifier, scope: ApiTokenScope) {
  return async (req: FastifyRequest, _reply: FastifyReply): Promise<void> => {
    const header = req.headers.authorization;
    if (header === undefined) {
      throw new CorralError('unauthorized', 'an API token is needed: Authorization: Bearer <token> (corral tokens create)', {
        details: { tokenGiven: false },
      });
    }
    const checked = AuthorizationHeader.safeParse(header);
    if (!checked.success) {
      throw new CorralError('unauthorized', 'the Authorization header must be "Bearer <token>"', { details: { tokenGiven: true } });
    }
    const token = await verifier.verify(checked.data.replace(/^Bearer +/i, '').trimEnd());
    if (!token) throw new CorralError('unauthorized', 'the token is not valid (unknown or revoked)', { details: { tokenGiven: true } });
    if (!token.scopes.includes(scope)) {
      throw new CorralError('forbidden', `the token ${token.name} has no scope ${scope} (its scopes: ${token.scopes.join(', ')})`, {
        details: { scope },
      });
    }
    verified.set(req, token);
  };
}
