/** Polls `check` until it returns a truthy value or the deadline passes. */
export async function waitFor<T>(
  check: () => Promise<T | undefined | null | false> | T | undefined | null | false,
  opts: { timeoutMs?: number; intervalMs?: number; what?: string } = {},
): Promise<T> {
  const deadline = Date.now() + (opts.timeoutMs ?? 20_000);
  let last: unknown;
  for (;;) {
    try {
      const v = await check();
      if (v) return v as T;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out waiting for ${opts.what ?? 'condition'}${last ? `: ${String(last)}` : ''}`);
    }
    await new Promise((r) => setTimeout(r, opts.intervalMs ?? 25));
  }
}

/**
 * Waits `ms` of wall-clock time. Only for durations that are the point of a test step (how long a
 * fault lasts: a process stays stopped, a server stays down), never to let something happen:
 * wait for that state with `waitFor` instead.
 */
export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
