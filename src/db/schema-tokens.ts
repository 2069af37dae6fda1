/**
 * API tokens and what they open (`corral tokens`, the operator console).
 *
 * The operator console's sign-ins (src/http/console/, src/db/operations/console-sessions.ts): a
 * one-time sign-in code made by `corral console`, and the browser session it (or a pasted admin
 * token) opens. Each row belongs to an API token by name and goes with it; only the SHA-256 of
 * the secret a browser holds is stored.
 */
import { sql, check, index, text, uniqueIndex } from './orm.ts';
import { corral, tz } from './schema-base.ts';

/**
 * API tokens of the HTTP API (`corral tokens`, src/db/operations/api-tokens.ts): a bearer token is shown
 * once when created; only its SHA-256 is stored (a token is 32 random bytes, so a fast hash is
 * enough). `scopes` says what it may do (`read`: streams, transcripts, event states; `send`:
 * events; `admin`: the operator console). A revoked token stays, so its name is not reused by mistake.
 */
export const apiTokens = corral.table(
  'api_tokens',
  {
    name: text('name').primaryKey(),
    tokenSha256: text('token_sha256').notNull(),
    scopes: text('scopes').array().notNull(),
    /** The actors it may touch (src/base/actor-scope.ts patterns); null: every actor. */
    actors: text('actors').array(),
    /** When it stops authorizing (a short-lived token, `--ttl`); null: never. */
    expiresAt: tz('expires_at'),
    createdAt: tz('created_at').notNull().defaultNow(),
    lastUsedAt: tz('last_used_at'),
    revokedAt: tz('revoked_at'),
  },
  (t) => [
    uniqueIndex('api_tokens_sha256').on(t.tokenSha256),
    // the pruning of tokens expired long ago (src/db/operations/api-tokens.ts)
    index('api_tokens_expired').on(t.expiresAt).where(sql.raw('expires_at is not null')),
    check('api_tokens_actors', sql.raw('actors is null or cardinality(actors) between 1 and 64')),
    check('api_tokens_name', sql.raw(`name ~ '^[A-Za-z0-9._-]{1,64}$'`)),
    check('api_tokens_scopes', sql.raw(`cardinality(scopes) >= 1 and scopes <@ array['read', 'send', 'admin']::text[]`)),
  ],
);

/** `sign_in`: a one-time code (used once, within minutes); `session`: a signed-in browser. */
export const CONSOLE_SESSION_KINDS = ['sign_in', 'session'] as const;
export type ConsoleSessionKind = (typeof CONSOLE_SESSION_KINDS)[number];

export const consoleSessions = corral.table(
  'console_sessions',
  {
    secretSha256: text('secret_sha256').primaryKey(),
    kind: text('kind', { enum: CONSOLE_SESSION_KINDS }).notNull(),
    tokenName: text('token_name')
      .notNull()
      .references(() => apiTokens.name, { onDelete: 'cascade' }),
    createdAt: tz('created_at').notNull().defaultNow(),
    expiresAt: tz('expires_at').notNull(),
  },
  (t) => [
    // a token's rows go with it (the foreign key's cascade), and expired ones are pruned by age
    index('console_sessions_token').on(t.tokenName),
    index('console_sessions_expires').on(t.expiresAt),
    check('console_sessions_secret', sql.raw(`secret_sha256 ~ '^[0-9a-f]{64}$'`)),
    check('console_sessions_kind', sql.raw(`kind in ('sign_in', 'session')`)),
  ],
);
