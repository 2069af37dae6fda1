/**
 * A lock file that serialises one critical section across processes on one machine (used for
 * starting, stopping and attaching to the embedded PostgreSQL, so `corral` commands started
 * together on a fresh home do not run initdb or pg_ctl over each other).
 *
 * Rules:
 * L1 The lock is held by whoever created `<path>` with O_EXCL; its content names the holder
 *    (pid, host, a random token).
 * L2 A live holder touches the file every `staleMs / 4`, so its mtime stays fresh even while it
 *    waits on a child process (initdb, pg_ctl).
 * L3 A lock is stale when its holder's pid is gone (same host), or when its mtime is older than
 *    `staleMs` (a holder on another host, a frozen holder, a reused pid). So a holder killed
 *    with -9 blocks the next start for one poll when the pid is gone, and for `staleMs` at most.
 * L4 Only one waiter breaks a stale lock: it must first create `<path>.break` (O_EXCL), then
 *    re-reads the lock and removes it only if it still carries the stale holder's token.
 */
import { randomBytes } from 'node:crypto';
import { open, readFile, stat, unlink, utimes } from 'node:fs/promises';
import { hostname } from 'node:os';
import { CorralError } from '../../base/errors.ts';
import { systemClock } from '../../base/clock.ts';

export interface FileLockOptions {
  /** A holder whose file has not been touched for this long is presumed dead. */
  staleMs?: number;
  /** Give up waiting after this long (a clear error names the holder). */
  timeoutMs?: number;
  /** Called once when the lock is found held, so a command can say what it waits for. */
  onWait?: (holder: LockHolder | undefined) => void;
}

export interface LockHolder {
  pid: number;
  host: string;
  token: string;
  since: string;
}

export const DEFAULT_LOCK_STALE_MS = 10_000;
const DEFAULT_TIMEOUT_MS = 180_000;
const BREAKER_STALE_MS = 5_000;

function errnoOf(e: unknown): string | undefined {
  return (e as NodeJS.ErrnoException | undefined)?.code;
}

/** Whether process `pid` runs on this host (one we may not signal counts as running). */
export function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return errnoOf(e) === 'EPERM';
  }
}

async function readHolder(path: string): Promise<{ holder: LockHolder | undefined; ageMs: number } | undefined> {
  try {
    const [text, st] = await Promise.all([readFile(path, 'utf8'), stat(path)]);
    let holder: LockHolder | undefined;
    try {
      holder = JSON.parse(text) as LockHolder;
    } catch {
      holder = undefined; // created, not yet written: judged by its age alone
    }
    return { holder, ageMs: Date.now() - st.mtimeMs };
  } catch (e) {
    if (errnoOf(e) === 'ENOENT') return undefined;
    throw e;
  }
}

/** L3. */
export function isStale(holder: LockHolder | undefined, ageMs: number, staleMs: number, host = hostname()): boolean {
  if (ageMs > staleMs) return true;
  if (!holder || typeof holder.pid !== 'number') return false;
  return holder.host === host && holder.pid !== process.pid && !pidAlive(holder.pid);
}

async function tryCreate(path: string, holder: LockHolder): Promise<boolean> {
  try {
    const fh = await open(path, 'wx', 0o600);
    try {
      await fh.writeFile(JSON.stringify(holder));
    } finally {
      await fh.close();
    }
    return true;
  } catch (e) {
    if (errnoOf(e) === 'EEXIST') return false;
    throw e;
  }
}

/** L4: removes the lock only if it is still the stale one we saw. */
async function breakStale(path: string, seen: LockHolder | undefined, staleMs: number): Promise<void> {
  const breaker = `${path}.break`;
  if (!(await tryCreate(breaker, { pid: process.pid, host: hostname(), token: 'break', since: new Date().toISOString() }))) {
    const st = await stat(breaker).catch(() => undefined);
    // A breaker killed between its two steps must not block everyone: its file is tiny-lived.
    if (st && Date.now() - st.mtimeMs > BREAKER_STALE_MS) await unlink(breaker).catch(() => undefined);
    return;
  }
  try {
    const now = await readHolder(path);
    if (!now) return;
    const same = now.holder?.token === seen?.token;
    if (same && isStale(now.holder, now.ageMs, staleMs)) await unlink(path).catch(() => undefined);
  } finally {
    await unlink(breaker).catch(() => undefined);
  }
}

/** Runs `fn` holding the lock file at `path` (L1–L4). */
export async function withFileLock<T>(path: string, fn: () => Promise<T>, opts: FileLockOptions = {}): Promise<T> {
  const staleMs = opts.staleMs ?? DEFAULT_LOCK_STALE_MS;
  const deadline = Date.now() + (opts.timeoutMs ?? DEFAULT_TIMEOUT_MS);
  const me: LockHolder = { pid: process.pid, host: hostname(), token: randomBytes(12).toString('hex'), since: new Date().toISOString() };
  let told = false;
  let pollMs = 10;
  while (!(await tryCreate(path, me))) {
    const seen = await readHolder(path);
    if (seen && isStale(seen.holder, seen.ageMs, staleMs)) {
      await breakStale(path, seen.holder, staleMs);
      continue;
    }
    if (!told) {
      told = true;
      opts.onWait?.(seen?.holder);
    }
    if (Date.now() > deadline) {
      const who = seen?.holder ? `pid ${seen.holder.pid} on ${seen.holder.host}` : 'another process';
      throw new CorralError('database_unavailable', `timed out waiting for the lock ${path}, held by ${who}`);
    }
    await systemClock.sleep(pollMs + Math.random() * pollMs);
    pollMs = Math.min(100, pollMs * 2);
  }
  // L2: keep the mtime fresh while `fn` runs; unref so a stuck lock never keeps the process alive.
  const touch = setInterval(
    () => {
      const now = new Date();
      utimes(path, now, now).catch(() => undefined);
    },
    Math.max(50, Math.floor(staleMs / 4)),
  );
  touch.unref();
  try {
    return await fn();
  } finally {
    clearInterval(touch);
    const still = await readHolder(path).catch(() => undefined);
    if (still?.holder?.token === me.token) await unlink(path).catch(() => undefined);
  }
}
