// Worker defaults shared by the CLI and the benchmarks. No imports: the CLI loads this at start.

/**
 * Turns one worker process runs at once. An agent's turn mostly waits on a model or a tool; 32
 * is within noise of the best rate for instant turns and 25× capacity 1 for 0.5 s turns
 * (`npm run bench:capacity`, docs/benchmarks.md#worker-capacity).
 */
export const DEFAULT_WORKER_CAPACITY = 32;
