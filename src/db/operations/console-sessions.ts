/**
 * SQL for the console's sign-ins (`corral.console_sessions`, src/db/schema-console.ts).
 *
 *  C1 A code or a session is made only for a token that authorizes now and has the `admin`
 *     scope, and lives no longer than that token: `expires_at` is the earlier of its own life and
 *     the token's.
 *  C2 A sign-in code is used at most once: using it deletes it, in the statement that reads it.
 *  C3 A session authorizes only while its token does: every lookup joins the token and checks it
 *     as `verifyApiToken` does (not revoked, not expired, still `admin`), so revoking the token
 *     ends its sessions at once.
 */
import { sql } from '../orm.ts';
import type { DbOrTx } from '../client.ts';
import { toDate } from '../rows.ts';
import type { ConsoleSessionKind } from '../schema-tokens.ts';

const SHA256 = /^[0-9a-f]{64}$/;

function checkedHash(h: string): void {
  if (!SHA256.test(h)) throw new Error('a SHA-256 in lower-case hex');
}

const TOKEN_AUTHORIZES = sql`t.revoked_at is null and (t.expires_at is null or t.expires_at > now()) and 'admin' = any(t.scopes)`;

/** C1: stores a code or a session for the token `tokenName`; undefined when that token is not a live admin token. */
export async function insertConsoleSecret(
  db: DbOrTx,
  row: { secretSha256: string; kind: ConsoleSessionKind; tokenName: string; ttlSeconds: number },
): Promise<{ expiresAt: Date } | undefined> {
  checkedHash(row.secretSha256);
  const res = await db.execute<{ expires_at: unknown }>(sql`
    insert into corral.console_sessions (secret_sha256, kind, token_name, expires_at)
    select ${row.secretSha256}, ${row.kind}, t.name, least(now() + make_interval(secs => ${row.ttlSeconds}), t.expires_at)
      from corral.api_tokens t where t.name = ${row.tokenName} and ${TOKEN_AUTHORIZES}
    returning expires_at`);
  const r = res.rows[0];
  return r && { expiresAt: toDate(r.expires_at)! };
}

/** C2: the token name of the sign-in code `codeSha256`, deleting it; undefined when it is unknown, used or expired, or its token no longer authorizes. */
export async function takeSignInCode(db: DbOrTx, codeSha256: string): Promise<string | undefined> {
  checkedHash(codeSha256);
  const res = await db.execute<{ token_name: string }>(sql`
    with used as (
      delete from corral.console_sessions where secret_sha256 = ${codeSha256} and kind = 'sign_in' returning token_name, expires_at)
    select u.token_name from used u join corral.api_tokens t on t.name = u.token_name
     where u.expires_at > now() and ${TOKEN_AUTHORIZES}`);
  return res.rows[0]?.token_name;
}

/** C3: the token of the session `secretSha256`, if it authorizes. */
export async function verifyConsoleSession(
  db: DbOrTx,
  secretSha256: string,
): Promise<{ tokenName: string; expiresAt: Date; tokenExpiresAt: Date | null } | undefined> {
  if (!SHA256.test(secretSha256)) return undefined;
  const res = await db.execute<{ name: string; expires_at: unknown; token_expires_at: unknown }>(sql`
    select t.name, s.expires_at, t.expires_at as token_expires_at
      from corral.console_sessions s join corral.api_tokens t on t.name = s.token_name
     where s.secret_sha256 = ${secretSha256} and s.kind = 'session' and s.expires_at > now() and ${TOKEN_AUTHORIZES}`);
  const r = res.rows[0];
  return r && { tokenName: r.name, expiresAt: toDate(r.expires_at)!, tokenExpiresAt: toDate(r.token_expires_at) };
}

/** Ends a session (signing out); nothing when there is none. */
export async function deleteConsoleSession(db: DbOrTx, secretSha256: string): Promise<void> {
  if (!SHA256.test(secretSha256)) return;
  await db.execute(sql`delete from corral.console_sessions where secret_sha256 = ${secretSha256} and kind = 'session'`);
}

/** Deletes at most `limit` expired codes and sessions; returns how many. */
export async function pruneConsoleSessions(db: DbOrTx, limit: number): Promise<number> {
  const res = await db.execute(sql`
    delete from corral.console_sessions where secret_sha256 in (
      select secret_sha256 from corral.console_sessions where expires_at < now() order by expires_at limit ${limit})`);
  return res.rowCount ?? 0;
}
