/**
 * Polls `check` until it returns a truthy value or the deadline passes. `what` names the condition
 * in the timeout's message; a function is called then (say, to show a process's log as it is at
 * the deadline, not as it was when the wait began).
 */
export async function waitFor<T>(
  check: () => Promise<T | undefined | null | false> | T | undefined | null | false,
  opts: { timeoutMs?: number; intervalMs?: number; what?: string | (() => string) } = {},
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
      const what = typeof opts.what === 'function' ? opts.what() : opts.what;
      throw new Error(`timed out waiting for ${what ?? 'condition'}${last ? `: ${String(last)}` : ''}`);
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
