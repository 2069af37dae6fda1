/**
 * Starts one real PostgreSQL for the test run (embedded, in a temporary folder, unless
 * DATABASE_URL names a server) and builds a template database with corral's migrations and
 * pg-boss's schema. Each test file clones it (CREATE DATABASE … TEMPLATE), see helpers/db.ts.
 */
import { mkdtemp, rm, chmod } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import type { TestProject } from 'vitest/node';
import { ensureEmbeddedPostgres, type EmbeddedServer } from '../src/db/postgres/embedded.ts';
import { migrateDatabase } from '../src/db/migrate.ts';
import { createBoss, ensureQueues } from '../src/queue/boss.ts';
import { DEFAULTS } from '../src/config.ts';
import { KEPT_COMMENT, withDatabase } from './helpers/databases.ts';

declare module 'vitest' {
  export interface ProvidedContext {
    pgServerUrl: string;
    pgTemplate: string;
  }
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  let home: string | undefined;
  let server: EmbeddedServer | undefined;
  let serverUrl = process.env.DATABASE_URL;
  if (!serverUrl) {
    home = await mkdtemp(join(tmpdir(), 'corral-test-'));
    await chmod(home, 0o755);
    server = await ensureEmbeddedPostgres({ homeDir: home, ephemeral: true, database: 'postgres' });
    serverUrl = server.url;
  }
  const template = `corral_tpl_${process.pid}`;
  const admin = new pg.Client({ connectionString: serverUrl });
  await admin.connect();
  await admin.query(`drop database if exists ${template}`);
  await admin.query(`create database ${template}`);
  await admin.end();

  const templateUrl = withDatabase(serverUrl, template);
  await migrateDatabase(templateUrl);
  const boss = createBoss(templateUrl, { ...DEFAULTS });
  await boss.start();
  await ensureQueues(boss, DEFAULTS);
  await boss.stop({ graceful: false, close: true });

  project.provide('pgServerUrl', serverUrl);
  project.provide('pgTemplate', template);

  return async () => {
    const c = new pg.Client({ connectionString: serverUrl });
    await c.connect();
    await c.query(`drop database if exists ${template} with (force)`).catch(() => undefined);
    // Databases of failed tests are kept (helpers/db.ts): so is the embedded server's folder.
    const kept = (
      await c.query<{ datname: string }>(`select datname from pg_database where shobj_description(oid, 'pg_database') = $1`, [KEPT_COMMENT])
    ).rows;
    await c.end();
    await server?.stop();
    if (home && kept.length > 0) {
      console.error(
        `kept ${kept.length} database(s) of failed tests in the embedded PostgreSQL at ${home} (start it with ensureEmbeddedPostgres({ homeDir }))`,
      );
    } else if (home) {
      await rm(home, { recursive: true, force: true });
    }
  };
}
