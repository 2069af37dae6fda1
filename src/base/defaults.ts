/**
 * Defaults that more than one layer uses: the configuration's, and the same values where the
 * fabric and the worker SDK run without one (a broker in a test, a worker written against the
 * SDK). One constant each, so the daemon, the SDK and the docs agree.
 *
 * No imports: every command loads this at start (the protocol module's schemas alone are ~15 ms
 * of start-up that only the daemon and the workers need).
 */

/** How often a worker reports progress on a running turn (`CORRAL_PROGRESS_INTERVAL_MS`). */
export const DEFAULT_PROGRESS_INTERVAL_MS = 10_000;

/** How often a worker sends a heartbeat (`CORRAL_WORKER_HEARTBEAT_MS`). */
export const DEFAULT_HEARTBEAT_INTERVAL_MS = 2_000;

/** Largest frame on the wire, either way (`CORRAL_MAX_MESSAGE_BYTES`). */
export const DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024;
/**
 * Messages the broker's ROUTER reads ahead per connection (ZMQ_RCVHWM, `CORRAL_RECEIVE_HWM`):
 * bounds what one flooding peer can make the daemon hold (docs/benchmarks.md, "Receive
 * high-water mark"); libzmq's own default is 1000.
 */
export const DEFAULT_RECEIVE_HWM = 32;

/** Largest event payload, its JSON in bytes (`CORRAL_MAX_EVENT_BYTES`). */
export const DEFAULT_MAX_EVENT_BYTES = 256 * 1024;

/** Memory for the conversation contexts a daemon keeps between turns (`CORRAL_CONTEXT_CACHE_BYTES`). */
export const DEFAULT_CONTEXT_CACHE_BYTES = 32 * 1024 * 1024;

/** As root: where the embedded PostgreSQL's binaries and data go when the `postgres` user cannot reach them in place (`CORRAL_EMBEDDED_ROOT`). */
export const DEFAULT_EMBEDDED_ROOT = '/var/lib/corral';

/**
 * Turns one worker process runs at once. An agent's turn mostly waits on a model or a tool; 32
 * is within noise of the best rate for instant turns and 25× capacity 1 for 0.5 s turns
 * (`npm run bench:capacity`, docs/benchmarks.md#worker-capacity).
 */
export const DEFAULT_WORKER_CAPACITY = 32;

/** Set by the daemon on the local worker processes it spawns: they stop when it is gone (src/cli/parent-watch.ts). */
export const STOP_WITH_PARENT_ENV = 'CORRAL_STOP_WITH_PARENT';

/**
 * What happens to an event sent while its actor is busy (a turn runs or events wait): `queue`
 * takes it as a turn of its own, after the others; `coalesce` takes it with every other event
 * waiting into the actor's next turn; `interrupt` cancels the running turn and gives the next one
 * the interrupted events with the new ones; `reject` refuses it (`actor_busy`).
 */
export const INPUT_POLICIES = ['queue', 'coalesce', 'interrupt', 'reject'] as const;
export type InputPolicy = (typeof INPUT_POLICIES)[number];
/** The policies whose turns take a batch of events (`corral.actor_batch`, src/db/turns/batches.ts). */
export const BATCHING_POLICIES = ['coalesce', 'interrupt'] as const satisfies readonly InputPolicy[];
/** The policies a policy may be set to today. */
export const AVAILABLE_INPUT_POLICIES = ['queue', 'coalesce', 'interrupt', 'reject'] as const satisfies readonly InputPolicy[];

/** The most events one turn takes (a policy's `max-events` is at most this). */
export const MAX_BATCH_EVENTS = 100;
/** A batching policy's `max-events` when it sets none. */
export const DEFAULT_BATCH_EVENTS = 20;
/** The longest debounce and max-wait a policy may set (one hour, in ms). */
export const MAX_DEBOUNCE_MS = 3_600_000;

/** The largest `turn_chunk` frame a daemon relays unless configured otherwise (CORRAL_STREAM_CHUNK_BYTES, told in `worker_welcome`). */
export const DEFAULT_STREAM_CHUNK_BYTES = 64 * 1024;
