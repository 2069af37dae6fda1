/**
 * Knowing that a database is being set up, and waiting for it: a command started next to a daemon
 * that is still migrating (the first `npm start` on a fresh home) waits for the set-up to end,
 * instead of refusing a database that has no corral schema *yet*. Free of Drizzle and pg-boss, so
 * that `corral send` loads little.
 *
 * Rules:
 * U1 The whole set-up of a database (corral's migrations, pg-boss's, the queues and the SQL
 *    functions) runs under one session advisory lock, SETUP_LOCK_KEY (src/db/migrate.ts), so any
 *    connection sees from `pg_locks` that a set-up is under way, whoever runs it.
 * U2 A daemon of a home marks itself starting (`<home>/starting/<pid>`) before it resolves its
 *    database, and unmarks once it is set up (or failed): that covers the moments before it holds
 *    the lock (the embedded server starting, the connection opening). A mark whose process is gone
 *    (on this host) counts for nothing, so a daemon killed while starting leaves no wait behind.
 * U3 A command waits only while the database is not ready (`corral.send_events` missing) AND a
 *    set-up is under way (U1 or U2); it says once what it waits for, and gives up after
 *    `timeoutMs` with a clear error. With nothing setting up, it goes on at once (and refuses a
 *    database without corral's schema as before).
 */
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import type pg from 'pg';
import { systemClock, type Clock } from '../../base/clock.ts';
import { CorralError } from '../../base/errors.ts';
import { pidAlive } from './file-lock.ts';

/** Arbitrary, stable: "corral" in ASCII. */
export const SETUP_LOCK_KEY = 0x636f7272616c;

/** How long a command waits for a set-up under way, by default. */
export const SETUP_WAIT_MS = 60_000;
const POLL_MS = 200;

type Queryable = pg.Pool | pg.ClientBase;

const STARTING_DIR = 'starting';

interface StartingMark {
  pid: number;
  host: string;
  since: string;
}

/** U2: marks this process as a daemon of `homeDir` that is starting; returns the unmark (idempotent). */
export function markDaemonStarting(homeDir: string): () => void {
  const dir = join(homeDir, STARTING_DIR);
  const path = join(dir, String(process.pid));
  try {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const mark: StartingMark = { pid: process.pid, host: hostname(), since: new Date().toISOString() };
    writeFileSync(path, JSON.stringify(mark), { mode: 0o600 });
  } catch {
    // a home that cannot be written: the advisory lock (U1) still tells commands
    return () => undefined;
  }
  return () => rmSync(path, { force: true });
}

/** U2: the pids of the daemons of `homeDir` marked starting that are alive on this host. */
export function startingDaemons(homeDir: string): number[] {
  const dir = join(homeDir, STARTING_DIR);
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return [];
  }
  const host = hostname();
  const pids: number[] = [];
  for (const name of names) {
    try {
      const mark = JSON.parse(readFileSync(join(dir, name), 'utf8')) as Partial<StartingMark>;
      if (typeof mark.pid !== 'number' || mark.host !== host || mark.pid === process.pid) continue;
      if (pidAlive(mark.pid)) pids.push(mark.pid);
      else rmSync(join(dir, name), { force: true });
    } catch {
      // half written, or removed meanwhile
    }
  }
  return pids;
}

/** U1: the backend holding the set-up lock on this database, if one does. */
export async function setupLockHolder(db: Queryable): Promise<{ pid: number; application: string | null } | undefined> {
  const { rows } = await db.query<{ pid: number; application: string | null }>(
    `select l.pid, a.application_name as application
       from pg_locks l left join pg_stat_activity a on a.pid = l.pid
      where l.locktype = 'advisory' and l.granted and l.objsubid = 1
        and l.database = (select oid from pg_database where datname = current_database())
        and l.classid = $1 and l.objid = $2
      limit 1`,
    [Math.floor(SETUP_LOCK_KEY / 2 ** 32), SETUP_LOCK_KEY % 2 ** 32],
  );
  return rows[0];
}

/** U3: whether the set-up has finished once: the SQL enqueue, made last, is there. */
export async function isSetUp(db: Queryable): Promise<boolean> {
  const { rows } = await db.query<{ ready: boolean }>("select to_regprocedure('corral.send_events(jsonb)') is not null as ready");
  return rows[0]?.ready === true;
}

/** What is setting up the database now, in words; undefined when nothing is. */
async function setupUnderWay(db: Queryable, homeDir: string | undefined): Promise<string | undefined> {
  const holder = await setupLockHolder(db);
  if (holder) return `the set-up of the database under way (${holder.application || 'a session'}, backend pid ${holder.pid})`;
  const daemons = homeDir === undefined ? [] : startingDaemons(homeDir);
  if (daemons.length > 0) return `the daemon starting in ${homeDir} (pid ${daemons.join(', ')})`;
  return undefined;
}

export interface SetupWaitOptions {
  /** The home whose starting daemons count (U2). */
  homeDir?: string;
  /** Give up after this long. Default SETUP_WAIT_MS. */
  timeoutMs?: number;
  /** Said once, when the wait begins: what it waits for. */
  onWait?: (message: string) => void;
  clock?: Clock;
}

/**
 * U3: returns once the database is set up, or nothing is setting it up (the caller then goes on as
 * it would have: a database without corral's schema is refused there). Throws
 * `database_unavailable` when a set-up is still under way after `timeoutMs`.
 */
export async function waitForSetup(db: Queryable, opts: SetupWaitOptions = {}): Promise<void> {
  const clock = opts.clock ?? systemClock;
  const timeoutMs = opts.timeoutMs ?? SETUP_WAIT_MS;
  const startedMs = clock.nowMs();
  let told = false;
  for (;;) {
    if (await isSetUp(db)) return;
    const what = await setupUnderWay(db, opts.homeDir);
    if (what === undefined) return;
    const waitedMs = clock.nowMs() - startedMs;
    if (waitedMs >= timeoutMs) {
      throw new CorralError(
        'database_unavailable',
        `the database is still being set up after ${Math.round(waitedMs / 1000)} s: waited for ${what}; try again once it has started`,
      );
    }
    if (!told) {
      told = true;
      opts.onWait?.(`waiting for ${what} to finish (up to ${Math.round(timeoutMs / 1000)} s)`);
    }
    await clock.sleep(POLL_MS);
  }
}
