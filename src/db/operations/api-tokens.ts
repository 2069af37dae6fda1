/**
 * Bearer tokens of the HTTP API (`corral.api_tokens`, `corral tokens`). Only a token's SHA-256
 * is stored: the token itself is shown once, when it is made (src/ops/api-tokens.ts), and a
 * lookup is by its hash, through the unique index `api_tokens_sha256`.
 *
 *  A1 A revoked token stays, with `revoked_at` set, so that its name is never given to another
 *     token by mistake; no statement here ever clears `revoked_at`, and `verifyApiToken` finds
 *     only tokens without it.
 *  A2 `last_used_at` is written at most once per `TOUCH_INTERVAL_S` per token, whichever
 *     processes use it: the update's own condition refuses a recent one, so a burst of requests
 *     makes no burst of writes.
 */
import type { DbOrTx } from '../client.ts';
import { asc, sql } from '../orm.ts';
import { apiTokens } from '../schema.ts';

/** What a token may do: `read` (transcripts, event states, streams), `send` (events). */
export const API_TOKEN_SCOPES = ['read', 'send'] as const;
export type ApiTokenScope = (typeof API_TOKEN_SCOPES)[number];

/** A token's name, as the table's check has it. */
export const API_TOKEN_NAME = /^[A-Za-z0-9._-]{1,64}$/;

/** A2: the least time between two writes of one token's `last_used_at`. */
export const TOUCH_INTERVAL_S = 60;

export interface ApiTokenRow {
  name: string;
  scopes: ApiTokenScope[];
  createdAt: Date;
  lastUsedAt: Date | null;
  revokedAt: Date | null;
}

/** A token that authorizes: not revoked. */
export interface VerifiedApiToken {
  name: string;
  scopes: ApiTokenScope[];
  lastUsedAt: Date | null;
}

function checkedName(name: string): void {
  if (!API_TOKEN_NAME.test(name)) throw new Error(`a token name, not ${JSON.stringify(name)}`);
}

const scopesOf = (stored: readonly string[]): ApiTokenScope[] => API_TOKEN_SCOPES.filter((s) => stored.includes(s)) as ApiTokenScope[];

/**
 * Stores a token by its hash. Returns the row, or undefined when a token of that name exists,
 * revoked or not (A1).
 */
export async function insertApiToken(
  db: DbOrTx,
  token: { name: string; tokenSha256: string; scopes: readonly ApiTokenScope[] },
): Promise<ApiTokenRow | undefined> {
  checkedName(token.name);
  if (!/^[0-9a-f]{64}$/.test(token.tokenSha256)) throw new Error('a SHA-256 in lower-case hex');
  const rows = await db
    .insert(apiTokens)
    .values({ name: token.name, tokenSha256: token.tokenSha256, scopes: [...token.scopes] })
    .onConflictDoNothing({ target: apiTokens.name })
    .returning({
      name: apiTokens.name,
      scopes: apiTokens.scopes,
      createdAt: apiTokens.createdAt,
      lastUsedAt: apiTokens.lastUsedAt,
      revokedAt: apiTokens.revokedAt,
    });
  const r = rows[0];
  return r && { ...r, scopes: scopesOf(r.scopes) };
}

/** Every token, by name, revoked ones included; never a hash. */
export async function listApiTokens(db: DbOrTx): Promise<ApiTokenRow[]> {
  const rows = await db
    .select({
      name: apiTokens.name,
      scopes: apiTokens.scopes,
      createdAt: apiTokens.createdAt,
      lastUsedAt: apiTokens.lastUsedAt,
      revokedAt: apiTokens.revokedAt,
    })
    .from(apiTokens)
    .orderBy(asc(apiTokens.name));
  return rows.map((r) => ({ ...r, scopes: scopesOf(r.scopes) }));
}

/**
 * Revokes the token `name`. Returns when it was revoked and whether this call did it (false: it
 * was revoked already, and keeps its first time); undefined when there is no such token.
 */
export async function revokeApiToken(db: DbOrTx, name: string): Promise<{ revokedAt: Date; now: boolean } | undefined> {
  checkedName(name);
  const res = await db.execute<{ revoked_at: Date | string; now: boolean }>(sql`
    with old as (select revoked_at from corral.api_tokens where name = ${name})
    update corral.api_tokens t set revoked_at = coalesce(t.revoked_at, now())
     where t.name = ${name}
    returning t.revoked_at, (select revoked_at from old) is null as now`);
  const r = res.rows[0];
  return r && { revokedAt: new Date(r.revoked_at), now: r.now };
}

/** The token whose hash is `tokenSha256`, if it is not revoked (A1). */
export async function verifyApiToken(db: DbOrTx, tokenSha256: string): Promise<VerifiedApiToken | undefined> {
  const res = await db.execute<{ name: string; scopes: string[]; last_used_at: Date | string | null }>(sql`
    select name, scopes, last_used_at from corral.api_tokens
     where token_sha256 = ${tokenSha256} and revoked_at is null`);
  const r = res.rows[0];
  return r && { name: r.name, scopes: scopesOf(r.scopes), lastUsedAt: r.last_used_at === null ? null : new Date(r.last_used_at) };
}

/** A2: records a use of `name` now, unless one was recorded less than `TOUCH_INTERVAL_S` ago. */
export async function touchApiToken(db: DbOrTx, name: string): Promise<void> {
  await db.execute(sql`
    update corral.api_tokens set last_used_at = now()
     where name = ${name} and revoked_at is null
       and (last_used_at is null or last_used_at < now() - make_interval(secs => ${TOUCH_INTERVAL_S}))`);
}

/** Of `names`, those whose token still authorizes (not revoked, still there): what an open stream re-checks. */
export async function liveApiTokenNames(db: DbOrTx, names: readonly string[]): Promise<Set<string>> {
  if (names.length === 0) return new Set();
  const res = await db.execute<{ name: string }>(sql`
    select name from corral.api_tokens where name = any(${sql.param([...names])}::text[]) and revoked_at is null`);
  return new Set(res.rows.map((r) => r.name));
}
