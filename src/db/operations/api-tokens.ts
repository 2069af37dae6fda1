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
 *  A3 A token with `expires_at` authorizes only before it, by the database's clock: every
 *     statement that verifies one says `expires_at > now()`. A token expired for longer than
 *     the retention window is deleted (its name free again); a revoked one that never expires
 *     stays (A1).
 */
import type { DbOrTx } from '../client.ts';
import { asc, sql } from '../orm.ts';
import { ageCutoff, apiTokens } from '../schema.ts';

import { API_TOKEN_SCOPES, type ApiTokenScope } from '../views.ts';

export { API_TOKEN_SCOPES, type ApiTokenScope };

/** A token's name, as the table's check has it. */
export const API_TOKEN_NAME = /^[A-Za-z0-9._-]{1,64}$/;

/** A2: the least time between two writes of one token's `last_used_at`. */
export const TOUCH_INTERVAL_S = 60;

export interface ApiTokenRow {
  name: string;
  scopes: ApiTokenScope[];
  /** Its actor patterns; undefined: every actor. */
  actors: string[] | undefined;
  expiresAt: Date | null;
  createdAt: Date;
  lastUsedAt: Date | null;
  revokedAt: Date | null;
}

/** A token that authorizes: not revoked, not expired. */
export interface VerifiedApiToken {
  name: string;
  scopes: ApiTokenScope[];
  /** Its actor patterns; undefined: every actor. */
  actors: string[] | undefined;
  expiresAt: Date | null;
  lastUsedAt: Date | null;
}

function checkedName(name: string): void {
  if (!API_TOKEN_NAME.test(name)) throw new Error(`a token name, not ${JSON.stringify(name)}`);
}

const scopesOf = (stored: readonly string[]): ApiTokenScope[] => API_TOKEN_SCOPES.filter((s) => stored.includes(s)) as ApiTokenScope[];

const ROW = {
  name: apiTokens.name,
  scopes: apiTokens.scopes,
  actors: apiTokens.actors,
  expiresAt: apiTokens.expiresAt,
  createdAt: apiTokens.createdAt,
  lastUsedAt: apiTokens.lastUsedAt,
  revokedAt: apiTokens.revokedAt,
};

const rowOf = (r: { scopes: string[]; actors: string[] | null } & Omit<ApiTokenRow, 'scopes' | 'actors'>): ApiTokenRow => ({
  ...r,
  scopes: scopesOf(r.scopes),
  actors: r.actors ?? undefined,
});

/**
 * Stores a token by its hash, with its actors (undefined: every actor) and, for a short-lived
 * one, its life in seconds from now (by the database's clock, A3). Returns the row, or undefined
 * when a token of that name exists, revoked or not (A1).
 */
export async function insertApiToken(
  db: DbOrTx,
  token: { name: string; tokenSha256: string; scopes: readonly ApiTokenScope[]; actors?: readonly string[]; ttlSeconds?: number },
): Promise<ApiTokenRow | undefined> {
  checkedName(token.name);
  if (!/^[0-9a-f]{64}$/.test(token.tokenSha256)) throw new Error('a SHA-256 in lower-case hex');
  const rows = await db
    .insert(apiTokens)
    .values({
      name: token.name,
      tokenSha256: token.tokenSha256,
      scopes: [...token.scopes],
      actors: token.actors ? [...token.actors] : null,
      expiresAt: token.ttlSeconds === undefined ? null : sql`now() + make_interval(secs => ${token.ttlSeconds})`,
    })
    .onConflictDoNothing({ target: apiTokens.name })
    .returning(ROW);
  const r = rows[0];
  return r && rowOf(r);
}

/** Every token, by name, revoked and expired ones included; never a hash. */
export async function listApiTokens(db: DbOrTx): Promise<ApiTokenRow[]> {
  const rows = await db.select(ROW).from(apiTokens).orderBy(asc(apiTokens.name));
  return rows.map(rowOf);
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

/** The token whose hash is `tokenSha256`, if it authorizes: not revoked (A1), not expired (A3). */
export async function verifyApiToken(db: DbOrTx, tokenSha256: string): Promise<VerifiedApiToken | undefined> {
  const res = await db.execute<{
    name: string;
    scopes: string[];
    actors: string[] | null;
    expires_at: Date | string | null;
    last_used_at: Date | string | null;
  }>(sql`
    select name, scopes, actors, expires_at, last_used_at from corral.api_tokens
     where token_sha256 = ${tokenSha256} and revoked_at is null and (expires_at is null or expires_at > now())`);
  const r = res.rows[0];
  const date = (v: Date | string | null) => (v === null ? null : new Date(v));
  return (
    r && {
      name: r.name,
      scopes: scopesOf(r.scopes),
      actors: r.actors ?? undefined,
      expiresAt: date(r.expires_at),
      lastUsedAt: date(r.last_used_at),
    }
  );
}

/** A2: records a use of `name` now, unless one was recorded less than `TOUCH_INTERVAL_S` ago. */
export async function touchApiToken(db: DbOrTx, name: string): Promise<void> {
  await db.execute(sql`
    update corral.api_tokens set last_used_at = now()
     where name = ${name} and revoked_at is null
       and (last_used_at is null or last_used_at < now() - make_interval(secs => ${TOUCH_INTERVAL_S}))`);
}

/** Of `names`, those whose token still authorizes (not revoked, not expired, still there): what an open stream re-checks. */
export async function liveApiTokenNames(db: DbOrTx, names: readonly string[]): Promise<Set<string>> {
  if (names.length === 0) return new Set();
  const res = await db.execute<{ name: string }>(sql`
    select name from corral.api_tokens where name = any(${sql.param([...names])}::text[]) and revoked_at is null
       and (expires_at is null or expires_at > now())`);
  return new Set(res.rows.map((r) => r.name));
}

/** A3: deletes at most `limit` tokens expired more than `olderThanSeconds` ago; returns how many. */
export async function pruneExpiredApiTokens(db: DbOrTx, olderThanSeconds: number, limit: number): Promise<number> {
  const res = await db.execute(sql`
    delete from corral.api_tokens where name in (
      select name from corral.api_tokens
       where expires_at is not null and expires_at < ${ageCutoff(olderThanSeconds)}
       order by expires_at
       limit ${limit})`);
  return res.rowCount ?? 0;
}
