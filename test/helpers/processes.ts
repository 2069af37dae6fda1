/**
 * Real OS processes for crash tests: spawn the CLI, find children, kill by signal, always clean up.
 *
 * Every child a test starts (here or in the chaos cluster) is registered with `trackChild`, so
 * that `killAll()` and the exit hook kill it whatever happens, and the leak check after each test
 * file (test/helpers/leak-check.ts) sees one still running.
 */
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { createWriteStream, existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

export const CORRAL_BIN = resolve(import.meta.dirname, '../../bin/corral.js');

export { freePort } from '../../src/db/postgres/net.ts';

export interface Proc {
  child: ChildProcess;
  logPath: string;
  log(): string;
  exited: Promise<number | null>;
}

/**
 * `proc`'s exit code, waited for at most `timeoutMs`: a process that does not exit fails the test
 * there, with the end of its log, instead of at the test's own timeout.
 */
export async function exitOf(proc: Proc, timeoutMs = 60_000): Promise<number | null> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`pid ${proc.child.pid} did not exit within ${timeoutMs} ms; its log ends:\n${proc.log().slice(-3000)}`)),
      timeoutMs,
    );
  });
  try {
    return await Promise.race([proc.exited, late]);
  } finally {
    clearTimeout(timer);
  }
}

const spawned = new Set<ChildProcess>();
let exitHookInstalled = false;

const alive = (c: ChildProcess) => c.pid !== undefined && c.exitCode === null && c.signalCode === null;

/** Registers `child`: killed by `killAll()` and when this process exits; seen by the leak check. */
export function trackChild(child: ChildProcess): void {
  spawned.add(child);
  child.once('exit', () => spawned.delete(child));
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  // A test runner or script that dies must not leave daemons behind.
  process.on('exit', () => {
    for (const c of spawned) if (alive(c)) safeKill(c.pid!, 'SIGKILL');
  });
}

/** Tracked children still running. */
export function liveChildren(): ChildProcess[] {
  return [...spawned].filter(alive);
}

export function spawnCorral(args: string[], env: Record<string, string>, name = args[0] ?? 'corral'): Proc {
  const dir = mkdtempSync(join(tmpdir(), 'corral-proc-'));
  const logPath = join(dir, `${name}.log`);
  const out = createWriteStream(logPath);
  const child = spawn(process.execPath, [CORRAL_BIN, ...args], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  child.stdout!.pipe(out);
  child.stderr!.pipe(out);
  trackChild(child);
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  // the file is made by the stream, a moment after the spawn: until then the log is empty
  const log = () => (existsSync(logPath) ? readFileSync(logPath, 'utf8') : '');
  return { child, logPath, log, exited };
}

/** Pids of `ppid`'s children whose command line contains `match`. */
export function childPids(ppid: number, match: string): number[] {
  try {
    const out = execFileSync('ps', ['-o', 'pid=,args=', '--ppid', String(ppid)], { encoding: 'utf8' });
    return out
      .split('\n')
      .filter((l) => l.includes(match))
      .map((l) => Number(l.trim().split(/\s+/)[0]))
      .filter((n) => Number.isInteger(n) && n > 0);
  } catch {
    return [];
  }
}

/** Every descendant of `pid`. */
export function descendants(pid: number): number[] {
  const rows = execFileSync('ps', ['-eo', 'pid=,ppid='], { encoding: 'utf8' })
    .trim()
    .split('\n')
    .map((l) => l.trim().split(/\s+/).map(Number) as [number, number]);
  const out: number[] = [];
  const walk = (p: number) => {
    for (const [child, parent] of rows) if (parent === p) (out.push(child), walk(child));
  };
  walk(pid);
  return out;
}

/** A process's command line (`pid: cmd args…`), for messages; `pid: gone` once it exited. */
export function commandOf(pid: number): string {
  try {
    return `${pid}: ${readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ').trim().slice(0, 160)}`;
  } catch {
    return `${pid}: gone`;
  }
}

/** Whether a process with this pid exists. */
export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Postmasters serving the cluster under `home` (running as the postgres user when root). */
export function postmastersOf(home: string): number {
  const out = execFileSync('ps', ['-eo', 'args='], { encoding: 'utf8' });
  return out.split('\n').filter((l) => /\/postgres -D /.test(l) && l.includes(home)).length;
}

/** SIGKILLs every tracked process that is still alive (and its children); returns how many. */
export function killAll(): number {
  let n = 0;
  for (const child of liveChildren()) {
    for (const pid of childPids(child.pid!, '')) safeKill(pid, 'SIGKILL');
    safeKill(child.pid!, 'SIGKILL');
    n++;
  }
  return n;
}

export function safeKill(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    // already gone
  }
}

/** Stops `proc` with SIGTERM if it still runs, waiting up to `waitMs` for it to exit. */
export async function stopGracefully(proc: Proc | undefined, waitMs = 8_000): Promise<void> {
  if (proc?.child.exitCode !== null) return;
  proc.child.kill('SIGTERM');
  await Promise.race([proc.exited, new Promise((r) => setTimeout(r, waitMs))]);
}

/**
 * The environment of a crash test's `corral daemon` and `corral worker` processes: insecure, on
 * `databaseUrl` and `endpoint`, with leases, heartbeats, stale timeouts and retries short enough
 * that a killed process's turns come back within a few seconds.
 */
export function fastRecoveryEnv(databaseUrl: string, endpoint: string): Record<string, string> {
  return {
    DATABASE_URL: databaseUrl,
    CORRAL_ENDPOINT: endpoint,
    CORRAL_INSECURE: '1',
    CORRAL_LEASE_MS: '3000',
    CORRAL_PROGRESS_INTERVAL_MS: '500',
    CORRAL_WORKER_HEARTBEAT_MS: '200',
    CORRAL_WORKER_STALE_MS: '1500',
    CORRAL_WATCHDOG_INTERVAL_MS: '200',
    CORRAL_RECOVERY_INTERVAL_MS: '500',
    CORRAL_RETRY_DELAY_S: '1',
    CORRAL_RETRY_DELAY_MAX_S: '2',
    CORRAL_POLL_INTERVAL_MS: '200',
  };
}
