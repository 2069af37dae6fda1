/** Real OS processes for crash tests: spawn the CLI, find children, kill by signal, always clean up. */
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { createWriteStream, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

export const CORRAL_BIN = resolve(import.meta.dirname, '../../bin/corral.js');

export { freePort } from '../../src/net.ts';

export interface Proc {
  child: ChildProcess;
  logPath: string;
  log(): string;
  exited: Promise<number | null>;
}

const spawned = new Set<ChildProcess>();

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
  spawned.add(child);
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  void exited.then(() => spawned.delete(child));
  return { child, logPath, log: () => readFileSync(logPath, 'utf8'), exited };
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

/** Kills every process spawned here that is still alive (and its children). */
export function killAll(): void {
  for (const child of spawned) {
    if (child.pid) for (const pid of childPids(child.pid, '')) safeKill(pid, 'SIGKILL');
    child.kill('SIGKILL');
  }
  spawned.clear();
}

export function safeKill(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    // already gone
  }
}
