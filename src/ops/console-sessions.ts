/**
 * Signing in to the operator console (src/http/console/): one-time sign-in codes (`corral
 * console`), browser sessions, and their CSRF tokens.
 *
 *  S1 A code and a session secret are 32 random bytes (base64url); only their SHA-256 is stored
 *     (src/db/operations/console-sessions.ts, C1-C3 there). A code lives `SIGN_IN_TTL_S`, is used
 *     once, and opens a session of `SESSION_TTL_S` (never past its token's expiry).
 *  S2 A session's CSRF token is an HMAC of a fixed label under the session's secret: the page
 *     embeds it in every form, a write must carry it. The secret is in an HttpOnly, SameSite=Strict
 *     cookie, so no other page can read or derive it; and the check needs no stored state.
 */
import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { DbOrTx } from '../db/client.ts';
import {
  deleteConsoleSession,
  insertConsoleSecret,
  pruneConsoleSessions,
  takeSignInCode,
  verifyConsoleSession,
} from '../db/operations/console-sessions.ts';
import { CorralError } from '../base/errors.ts';
import { parseTokenName } from './api-tokens.ts';

export const SIGN_IN_TTL_S = 10 * 60;
export const SESSION_TTL_S = 8 * 60 * 60;
/** S1: the shape of a code's or a secret's text. */
export const CONSOLE_SECRET = /^[A-Za-z0-9_-]{43}$/;

const sha256 = (text: string) => createHash('sha256').update(text, 'utf8').digest('hex');
const newSecret = () => randomBytes(32).toString('base64url');

/** S1: a one-time sign-in code for the admin token `tokenName`; `not_found` when it is not a live admin token. */
export async function createSignInCode(db: DbOrTx, tokenName: string): Promise<{ code: string; expiresAt: Date }> {
  const name = parseTokenName(tokenName);
  const code = newSecret();
  const made = await insertConsoleSecret(db, { secretSha256: sha256(code), kind: 'sign_in', tokenName: name, ttlSeconds: SIGN_IN_TTL_S });
  if (!made) {
    throw new CorralError(
      'not_found',
      `no token ${name} with the admin scope that authorizes now (corral tokens create ${name} --scope admin makes one)`,
      { details: { name } },
    );
  }
  // a sign-in is rare: the moment to drop what expired
  await pruneConsoleSessions(db, 100);
  return { code, expiresAt: made.expiresAt };
}

/** S1: a session for the token `tokenName` (checked by the caller or by C1): its secret, or undefined. */
export async function openSession(db: DbOrTx, tokenName: string): Promise<{ secret: string; expiresAt: Date } | undefined> {
  const secret = newSecret();
  const made = await insertConsoleSecret(db, { secretSha256: sha256(secret), kind: 'session', tokenName, ttlSeconds: SESSION_TTL_S });
  return made && { secret, expiresAt: made.expiresAt };
}

/** C2: the token a sign-in code was made for, the code used up; undefined for a code that does not sign in. */
export async function useSignInCode(db: DbOrTx, code: string): Promise<string | undefined> {
  if (typeof code !== 'string' || !CONSOLE_SECRET.test(code)) return undefined;
  return takeSignInCode(db, sha256(code));
}

/** C3: the token name of a session secret that authorizes. */
export async function sessionToken(db: DbOrTx, secret: string): Promise<{ tokenName: string; expiresAt: Date } | undefined> {
  if (typeof secret !== 'string' || !CONSOLE_SECRET.test(secret)) return undefined;
  const s = await verifyConsoleSession(db, sha256(secret));
  return s && { tokenName: s.tokenName, expiresAt: s.expiresAt };
}

export async function closeSession(db: DbOrTx, secret: string): Promise<void> {
  if (typeof secret === 'string' && CONSOLE_SECRET.test(secret)) await deleteConsoleSession(db, sha256(secret));
}

/** S2 */
export function csrfTokenOf(secret: string): string {
  return createHmac('sha256', secret).update('corral-console-csrf/1').digest('base64url');
}

/** S2: whether `given` is the CSRF token of `secret` (compared in constant time). */
export function csrfMatches(secret: string, given: unknown): boolean {
  if (typeof given !== 'string' || given.length !== 43) return false;
  const want = Buffer.from(csrfTokenOf(secret));
  const got = Buffer.from(given);
  return got.length === want.length && timingSafeEqual(got, want);
}

/**
 * S2's HMAC over an action's notice, so that a page shows only the notices its own session's
 * actions made: a link someone else crafted (`?notice=Your session expired, sign in at …`) shows nothing.
 */
export function noticeSignature(secret: string, notice: string): string {
  return createHmac('sha256', secret).update(`corral-console-notice/1\n${notice}`).digest('base64url');
}
