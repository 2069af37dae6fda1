/**
 * API tokens for operators and for the HTTP API (`corral tokens create | list | revoke`,
 * src/http/): the token text, its hash, and the checks of names and scopes.
 *
 *  K1 A token is `crl_` and 43 characters of base64url: 32 random bytes. Only its SHA-256 (hex)
 *     is stored (src/db/operations/api-tokens.ts); the text is returned once, by `createToken`, and nothing
 *     here logs or keeps it.
 *  K2 Verifying a token is a lookup of its hash in the unique index; text that is not a token's
 *     shape is refused before the database is asked. No comparison of secrets happens in this
 *     process, so none needs to be constant-time.
 *  K3 A verified token's use is recorded at most once a minute (`last_used_at`, A2 there): the
 *     verifier writes in the background, never on the request's path, and remembers when it
 *     last wrote, so a busy token costs no statement per request beyond its lookup.
 */
import { createHash, randomBytes } from 'node:crypto';
import type { DbOrTx } from '../db/client.ts';
import {
  API_TOKEN_NAME,
  API_TOKEN_SCOPES,
  insertApiToken,
  listApiTokens,
  revokeApiToken,
  TOUCH_INTERVAL_S,
  touchApiToken,
  verifyApiToken,
  type ApiTokenRow,
  type ApiTokenScope,
  type VerifiedApiToken,
} from '../db/operations/api-tokens.ts';
import { CorralError } from '../base/errors.ts';
import type { TokenView } from '../db/views.ts';

export type { TokenView };
import { parseDurationMs } from '../base/duration.ts';

export { API_TOKEN_SCOPES, type ApiTokenScope, type VerifiedApiToken } from '../db/operations/api-tokens.ts';

const TOKEN_PREFIX = 'crl_';
/** K1: the shape of a token's text. */
export const TOKEN_TEXT = /^crl_[A-Za-z0-9_-]{43}$/;

/** K1: a new token's text. */
export function generateToken(): string {
  return TOKEN_PREFIX + randomBytes(32).toString('base64url');
}

/** K1: what is stored of a token. */
export function hashToken(token: string): string {
  return createHash('sha256').update(token, 'utf8').digest('hex');
}

/** A token's name (1-64 characters of A-Z a-z 0-9 . _ -); `invalid_argument` otherwise. */
export function parseTokenName(text: string): string {
  if (typeof text === 'string' && API_TOKEN_NAME.test(text)) return text;
  throw new CorralError('invalid_argument', `invalid token name ${JSON.stringify(text)}: expected 1-64 characters of A-Z a-z 0-9 . _ -`);
}

/** The scopes given, each once, in their canonical order; at least one; `invalid_argument` otherwise. */
export function parseScopes(given: readonly string[]): ApiTokenScope[] {
  const unknown = given.filter((s) => !(API_TOKEN_SCOPES as readonly string[]).includes(s));
  if (unknown.length > 0) {
    throw new CorralError(
      'invalid_argument',
      `unknown scope ${JSON.stringify(unknown[0])}: a token's scopes are ${API_TOKEN_SCOPES.map((s) => JSON.stringify(s)).join(', ')}`,
    );
  }
  const scopes = API_TOKEN_SCOPES.filter((s) => given.includes(s));
  if (scopes.length === 0)
    throw new CorralError(
      'invalid_argument',
      'a token needs at least one scope: --scope read, --scope send, --scope admin (repeat for several)',
    );
  return scopes;
}

const viewOf = (r: ApiTokenRow): TokenView => ({
  name: r.name,
  scopes: r.scopes,
  actors: r.actors ?? null,
  expiresAt: r.expiresAt?.toISOString() ?? null,
  createdAt: r.createdAt.toISOString(),
  lastUsedAt: r.lastUsedAt?.toISOString() ?? null,
  revokedAt: r.revokedAt?.toISOString() ?? null,
});

/** The shortest and the longest life of a short-lived token. */
export const MIN_TOKEN_TTL_MS = 1_000;
export const MAX_TOKEN_TTL_MS = 10 * 365 * 86_400_000;

/** A token's life: a duration (`1h`, `30m`) or milliseconds, within the bounds; `invalid_argument` otherwise. */
export function parseTokenTtl(ttl: string | number): number {
  const ms = typeof ttl === 'number' ? ttl : parseDurationMs(ttl, 'token ttl');
  if (!Number.isFinite(ms) || ms < MIN_TOKEN_TTL_MS || ms > MAX_TOKEN_TTL_MS) {
    throw new CorralError('invalid_argument', `a token's ttl is 1 s to 10 years (got ${String(ttl)})`);
  }
  return ms;
}

export interface CreateTokenOptions {
  /** The actors it may touch (checked: `parseActorPatterns`); absent: every actor. */
  actors?: readonly string[];
  /** Its life in milliseconds (checked: `parseTokenTtl`); absent: until revoked. */
  ttlMs?: number;
}

/** A name for a token its maker did not name (one minted per end user, say). */
export function generatedTokenName(): string {
  return `tok_${randomBytes(9).toString('base64url')}`;
}

/**
 * Makes a token (checked input: `parseTokenName`, `parseScopes`, and the options' own parsers);
 * `already_exists` when the name is taken, by a revoked token too.
 */
export async function createToken(
  db: DbOrTx,
  name: string,
  scopes: readonly ApiTokenScope[],
  opts: CreateTokenOptions = {},
): Promise<TokenView & { token: string }> {
  const token = generateToken();
  const row = await insertApiToken(db, {
    name,
    tokenSha256: hashToken(token),
    scopes,
    ...(opts.actors ? { actors: opts.actors } : {}),
    ...(opts.ttlMs === undefined ? {} : { ttlSeconds: opts.ttlMs / 1000 }),
  });
  if (!row) {
    throw new CorralError(
      'already_exists',
      `a token named ${name} exists already (revoked tokens keep their names): choose another name, or revoke it and make a new one`,
      { details: { name } },
    );
  }
  return { ...viewOf(row), token };
}

/** Every token, revoked ones included, by name; never a token's text or hash. */
export async function listTokens(db: DbOrTx): Promise<TokenView[]> {
  return (await listApiTokens(db)).map(viewOf);
}

/** Revokes the token `name` (idempotent); `not_found` when there is none. */
export async function revokeToken(db: DbOrTx, name: string): Promise<{ name: string; revokedAt: string; alreadyRevoked: boolean }> {
  const r = await revokeApiToken(db, name);
  if (!r) throw new CorralError('not_found', `no token named ${name} (corral tokens list shows them)`, { details: { name } });
  return { name, revokedAt: r.revokedAt.toISOString(), alreadyRevoked: !r.now };
}

export interface TokenVerifier {
  /** The token `text` is, if it authorizes (K2); records its use (K3). */
  verify(text: string): Promise<VerifiedApiToken | undefined>;
}

/** Most tokens whose last recorded use is remembered; past it the memory starts again (a write or so more each). */
const MAX_REMEMBERED = 10_000;

/** K2, K3. `onTouchError` hears of a failed background write (the request it came from is not affected). */
export function tokenVerifier(db: DbOrTx, opts: { onTouchError?: (e: unknown) => void; nowMs?: () => number } = {}): TokenVerifier {
  const now = opts.nowMs ?? Date.now;
  const touched = new Map<string, number>();
  const intervalMs = TOUCH_INTERVAL_S * 1000;
  return {
    async verify(text) {
      if (typeof text !== 'string' || !TOKEN_TEXT.test(text)) return undefined;
      const token = await verifyApiToken(db, hashToken(text));
      if (!token) return undefined;
      const at = now();
      const last = Math.max(touched.get(token.name) ?? 0, token.lastUsedAt?.getTime() ?? 0);
      if (at - last >= intervalMs) {
        if (touched.size >= MAX_REMEMBERED) touched.clear();
        touched.set(token.name, at);
        touchApiToken(db, token.name).catch((e: unknown) => opts.onTouchError?.(e));
      }
      return token;
    },
  };
}
