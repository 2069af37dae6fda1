/**
 * The one jittered, capped backoff used by every reconnect and retry loop, so a failing loop
 * never hot-loops. Pure: the random source is injected.
 */
export interface BackoffPolicy {
  baseMs: number;
  maxMs: number;
}

/**
 * Equal jitter: a uniform delay in [c/2, c], where c = min(max, base·2^(attempt−1)). Half the
 * delay is fixed, so even the first attempt waits at least base/2.
 */
export function backoffDelayMs(attempt: number, policy: BackoffPolicy, random: () => number = Math.random): number {
  const n = Math.max(1, Math.floor(attempt));
  const ceiling = Math.min(policy.maxMs, policy.baseMs * 2 ** Math.min(n - 1, 30));
  const floor = ceiling / 2;
  return Math.round(floor + (ceiling - floor) * random());
}

/**
 * pg-boss's retry schedule for actor events (retryDelay, retryBackoff, retryDelayMax): failure n
 * waits between delay·2^(n−1) and delay·2^n seconds, capped at the maximum. Used to document and
 * test the contract that every retry delay lies within [retryDelay, retryDelayMax].
 */
export function retryWindowSeconds(failure: number, delayS: number, maxS: number): { min: number; max: number } {
  const n = Math.max(1, Math.floor(failure));
  return { min: Math.min(maxS, delayS * 2 ** (n - 1)), max: Math.min(maxS, delayS * 2 ** n) };
}
