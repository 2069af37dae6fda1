/**
 * Drizzle, as the rest of corral uses it: every module imports Drizzle from here, never from
 * `drizzle-orm` itself (an ESLint rule holds to it).
 *
 * Why: start-up time. Drizzle's ES-module build is ~100 small files, and on Node 24 loading each
 * one parses the package's 179 kB package.json again: `import('drizzle-orm/node-postgres')`
 * takes ~440 ms, most of a read command's run (`corral transcript`, ~25× a bare `node -e 0`).
 * Its CommonJS build of the same four entry points loads in ~62 ms, so it is loaded here through
 * `require`. Doing that in one module also keeps to one copy of Drizzle per process: a second,
 * ES-module copy would have classes of its own (the dual-package hazard).
 *
 * The values are typed by the packages' own declarations, and the types are re-exported from
 * them, so typing is exactly what a direct import would give.
 */
import { createRequire } from 'node:module';
import type * as DrizzleOrm from 'drizzle-orm';
import type * as PgCore from 'drizzle-orm/pg-core';
import type * as NodePostgres from 'drizzle-orm/node-postgres';
import type * as NodePostgresMigrator from 'drizzle-orm/node-postgres/migrator';

const require = createRequire(import.meta.url);
const orm = require('drizzle-orm') as typeof DrizzleOrm;
const pgCore = require('drizzle-orm/pg-core') as typeof PgCore;
const nodePostgres = require('drizzle-orm/node-postgres') as typeof NodePostgres;
const nodePostgresMigrator = require('drizzle-orm/node-postgres/migrator') as typeof NodePostgresMigrator;

export const { sql, eq, ne, lt, lte, and, or, inArray, isNull, isNotNull, asc, desc, count, getTableColumns } = orm;
export type { Column, ExtractTablesWithRelations, InferSelectModel, SQL, Table } from 'drizzle-orm';

export const {
  PgDialect,
  bigint,
  bigserial,
  boolean,
  check,
  index,
  integer,
  jsonb,
  pgSchema,
  primaryKey,
  text,
  timestamp,
  uniqueIndex,
  uuid,
} = pgCore;
export type { PgTransaction } from 'drizzle-orm/pg-core';

export const { drizzle } = nodePostgres;
export type { NodePgDatabase, NodePgQueryResultHKT } from 'drizzle-orm/node-postgres';

export const { migrate } = nodePostgresMigrator;
