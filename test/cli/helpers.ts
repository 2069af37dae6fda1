/** Runs the real `corral` CLI (or a script) as a subprocess: stdout, stderr and exit code. */
import { spawn } from 'node:child_process';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = fileURLToPath(new URL('../..', import.meta.url));
import { CORRAL_BIN } from '../helpers/processes.ts';

/** The `corral` command (bin/corral.js). */
export const CORRAL = CORRAL_BIN;
export const RUN_TS = fileURLToPath(new URL('../../bin/run-ts.js', import.meta.url));

/**
 * Node's on-disk compile cache: every CLI start loads the same ~300 modules (drizzle-orm alone
 * costs ~0.8 s of CPU); caching their bytecode cuts a third of each start.
 */
const COMPILE_CACHE = join(tmpdir(), 'corral-test-compile-cache');

/**
 * At most this many CLI processes at once per test file: each start costs ~1–2 s of CPU, and
 * more processes than cores only make every one of them slower (and CI has 2 cores).
 */
const MAX_CONCURRENT = Math.max(1, Math.min(2, availableParallelism()));
let running = 0;
const waiting: (() => void)[] = [];

async function slot<T>(fn: () => Promise<T>): Promise<T> {
  while (running >= MAX_CONCURRENT) await new Promise<void>((resolve) => waiting.push(resolve));
  running++;
  try {
    return await fn();
  } finally {
    running--;
    waiting.shift()?.();
  }
}

export interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/**
 * Spawns asynchronously (never spawnSync): tests keep an in-process daemon running while the CLI
 * works, and a blocked event loop would stall it.
 */
export function run(
  command: string[],
  env: Record<string, string | undefined> = {},
  opts: { timeoutMs?: number; input?: string | Buffer } = {},
): Promise<CliResult> {
  return slot(
    () =>
      new Promise<CliResult>((resolve, reject) => {
        const child = spawn(process.execPath, command, {
          cwd: ROOT,
          env: { NODE_COMPILE_CACHE: COMPILE_CACHE, ...process.env, CORRAL_LOG_LEVEL: 'warn', ...env },
          stdio: ['pipe', 'pipe', 'pipe'],
        });
        // standard input: `input`, or nothing (at once at its end); a command may stop reading
        // early (input over a limit), so the rest not being read is no error here
        child.stdin.on('error', () => undefined);
        child.stdin.end(opts.input);
        let stdout = '';
        let stderr = '';
        child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
        child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
        const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 60_000);
        child.on('error', reject);
        child.on('close', (code) => {
          clearTimeout(timer);
          resolve({ code, stdout, stderr });
        });
      }),
  );
}

/** `corral <args>` against `databaseUrl`. */
export function corral(
  args: string[],
  databaseUrl: string,
  env: Record<string, string> = {},
  opts: { input?: string | Buffer } = {},
): Promise<CliResult> {
  return run([CORRAL, ...args], { DATABASE_URL: databaseUrl, ...env }, opts);
}

/** `node bin/run-ts.js <script> <args>` against `databaseUrl`. */
export function script(path: string, args: string[], databaseUrl: string, env: Record<string, string> = {}): Promise<CliResult> {
  return run([RUN_TS, path, ...args], { DATABASE_URL: databaseUrl, ...env });
}

/** Parses a command's JSON stdout, failing with its stderr when it is not JSON. */
export function json<T>(r: CliResult): T {
  try {
    return JSON.parse(r.stdout) as T;
  } catch {
    throw new Error(`not JSON (exit ${r.code}): ${r.stdout}\nstderr: ${r.stderr}`);
  }
}

/**
 * Fresh CORRAL_HOME folders for one test file (mode 0755, so that the embedded PostgreSQL, run as
 * the `postgres` user under root, can reach them). `removeAll()`, in `afterAll`, stops the
 * embedded server of each and deletes it.
 */
export function freshHomes(prefix: string): { make(): Promise<string>; removeAll(): Promise<void> } {
  const homes: string[] = [];
  return {
    async make() {
      const home = await mkdtemp(join(tmpdir(), prefix));
      await chmod(home, 0o755);
      homes.push(home);
      return home;
    },
    async removeAll() {
      for (const home of homes.splice(0)) {
        await run([CORRAL, 'db', 'stop'], { CORRAL_HOME: home, DATABASE_URL: '' }).catch(() => undefined);
        await rm(home, { recursive: true, force: true });
      }
    },
  };
}
