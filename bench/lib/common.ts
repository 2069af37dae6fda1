/**
 * Small helpers shared by the benchmarks: progress lines, deadlines, percentiles, and a cleanup
 * stack that runs once in reverse order (also on errors and Ctrl-C).
 */
import { performance } from 'node:perf_hooks';
import { sleep, waitFor } from '../../test/helpers/wait.ts';

export { sleep };

export const progress = (msg: string): void => {
  process.stderr.write(`[bench ${new Date().toISOString().slice(11, 23)}] ${msg}\n`);
};

export class PhaseTimeout extends Error {}

/**
 * Polls `check` until truthy (the shared `waitFor`: a failing check is retried); throws
 * PhaseTimeout after `deadline` (performance.now() ms).
 */
export async function until<T>(
  check: () => Promise<T | undefined | false> | T | undefined | false,
  deadline: number,
  what: string,
  intervalMs = 50,
): Promise<T> {
  try {
    return await waitFor(check, { timeoutMs: Math.max(0, deadline - performance.now()), intervalMs, what });
  } catch (e) {
    throw new PhaseTimeout((e as Error).message);
  }
}

export function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[rank]!;
}

export interface Percentiles {
  n: number;
  p50: number;
  p95: number;
  p99: number;
  max: number;
  mean: number;
}

export function summarise(values: number[]): Percentiles {
  const s = [...values].sort((a, b) => a - b);
  const mean = s.length ? s.reduce((a, b) => a + b, 0) / s.length : Number.NaN;
  return { n: s.length, p50: percentile(s, 50), p95: percentile(s, 95), p99: percentile(s, 99), max: s.at(-1) ?? Number.NaN, mean };
}

export const round = (n: number, digits = 1): number => (Number.isFinite(n) ? Number(n.toFixed(digits)) : n);

export const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

/** Splits n into k near-equal positive parts. */
export const split = (n: number, k: number): number[] =>
  Array.from({ length: k }, (_, i) => Math.floor((n * (i + 1)) / k) - Math.floor((n * i) / k));

/** Rounds every number in `v` for the JSON output: 2 decimals, or 4 significant digits below 1. */
export function roundDeep(v: unknown): unknown {
  if (typeof v === 'number') return Number.isFinite(v) && Math.abs(v) < 1 ? Number(v.toPrecision(4)) : round(v, 2);
  if (Array.isArray(v)) return v.map(roundDeep);
  if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, roundDeep(x)]));
  return v;
}

/** Cleanup steps, run once in reverse order, each bounded so a hang cannot keep the process. */
export class Cleanup {
  private readonly steps: { name: string; fn: () => Promise<unknown> }[] = [];
  private running: Promise<void> | undefined;

  defer(name: string, fn: () => Promise<unknown>): void {
    this.steps.push({ name, fn });
  }

  run(): Promise<void> {
    this.running ??= (async () => {
      while (this.steps.length > 0) {
        const step = this.steps.pop()!;
        let timer: NodeJS.Timeout | undefined;
        const t0 = performance.now();
        try {
          await Promise.race([
            step.fn(),
            new Promise((_, reject) => {
              timer = setTimeout(() => reject(new Error('timed out after 30 s')), 30_000);
            }),
          ]);
        } catch (e) {
          progress(`cleanup: ${step.name} failed: ${(e as Error).message}`);
        } finally {
          clearTimeout(timer);
          const ms = performance.now() - t0;
          if (ms > 1_000) progress(`cleanup: ${step.name} took ${(ms / 1000).toFixed(1)} s`);
        }
      }
    })();
    return this.running;
  }
}

/**
 * The process benchmarks' main: `fn` gets a cleanup stack that runs at the end, on errors (exit 1,
 * the error on stderr) and on Ctrl-C (exit 130). Returns the exit code.
 */
export async function runBench(fn: (cleanup: Cleanup) => Promise<number>): Promise<number> {
  const cleanup = new Cleanup();
  process.once('SIGINT', () => void cleanup.run().finally(() => process.exit(130)));
  try {
    return await fn(cleanup);
  } catch (e) {
    progress(`failed: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}`);
    return 1;
  } finally {
    await cleanup.run();
  }
}

/** A V8 CPU profile of this process, started now; `stopInto` writes it as a .cpuprofile file. */
export async function startCpuProfile(): Promise<{ stopInto(file: string): Promise<void> }> {
  const { Session } = await import('node:inspector/promises');
  const { writeFile } = await import('node:fs/promises');
  const session = new Session();
  session.connect();
  await session.post('Profiler.enable');
  await session.post('Profiler.start');
  return {
    async stopInto(file) {
      const { profile } = await session.post('Profiler.stop');
      session.disconnect();
      await writeFile(file, JSON.stringify(profile));
      progress(`CPU profile written to ${file}`);
    },
  };
}
