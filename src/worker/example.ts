/**
 * The example worker: an echo handler driven by the event's data, used by `corral worker`,
 * the end-to-end tests and the crash tests.
 *
 * Event data it understands (fields combine):
 * - `{"text": "hi"}`         → one assistant message `{ text: "echo: hi" }`
 * - `{"delayMs": N}`          → waits N ms first (aborted by cancel/stop through ctx.signal)
 * - `{"fail": true}`          → throws; the SDK sends turn_error "example worker asked to fail"
 * - `{"failCode": "x", "retryable": false}` with fail → chooses the error's code and flag
 * - `{"emit": {"actor": "a/b", "data": …, "delay_ms"?: N}}` (or an array of them) → emitted with
 *   the commit (durable effects: enqueued exactly once with the turn)
 * - `{"deliver": {"sink": "s", "body"?: …, "key"?: "k"}}` (or an array of them) → sent to sink `s`
 *   once the turn commits (the outbox); without `body`, the body is `{ "text": <the reply text>,
 *   "actor": "agent/session", "event_id": … }`
 * - `{"ring": {"actors": ["a/b", …], "n": 0, "last": 999}}` → passes the ring on: emits the same
 *   event with `n + 1` to `actors[(n + 1) % length]`, until `n` is `last` (chains of emits for the
 *   crash tests, e.g. across shards)
 * - `{"remindInMs": N}`      → a timer: emits `{ "reminder": <text or true> }` to this same actor,
 *   N ms after the commit
 * - `{"history": true}`      → reads the whole conversation back through `history.read` (worker
 *   RPC) and reports `history_total`
 * - `{"stream": N, "streamMs": T}` → streams N chunks `{ "delta": "w1 " }`, `{ "delta": "w2 " }` …
 *   (live turns: `ctx.stream`) spread over T ms (default 40 ms apart), before the rest; with
 *   `"stamp": true` each chunk also carries `t`, when it was sent (ms since the epoch, fractional)
 * - `{"stream": true, "streamMs": T}` → streams the reply's own text, as a model would: the
 *   `echo: …` text in about 10 pieces of whole words (`{ "delta": piece }`) spread over T ms
 *   (default 1000), then commits that text; the deltas put together are the committed text, to
 *   the character (`"stamp": true` as above)
 * - `{"flood": {"chunkBytes": B, "ms": T}}` → streams chunks of B bytes (default 32768) as fast as
 *   it can for T ms (default 10000), or until `ctx.stream` returns false (the attempt's stream
 *   budget is spent), and replies with `flood: { chunks, bytes, stopped }` (`stopped`: the budget
 *   ended it); a worker that streams without bound, for the stream budget's tests and benchmark
 * - anything else             → `{ text: "echo: " + JSON.stringify(data) }`
 * A turn that takes several events (input policy `coalesce`) answers them all in one message:
 * `echo: ` and each event's text (or its JSON) in order, joined by ` | `; it waits the largest
 * `delayMs` among them, and fails or emits as its first event asks.
 * A steer received before the reply is included as `steered: <last steer input>`. When the turn
 * continues a conversation, the reply says how many earlier messages it saw in its context
 * (`seen: N`).
 */
import type { Clock } from '../base/clock.ts';
import { systemClock } from '../base/clock.ts';
import type { Logger } from '../base/logger.ts';
import type { JsonValue, TurnResult, WorkerMessage } from '../fabric/protocol.ts';
import type { WorkerCredentials } from './credentials.ts';
import { createWorker, type Deliver, type Emit, type TurnContext, type TurnOutcome, type Worker, type WorkerHooks } from './sdk.ts';

const MAX_DELAY_MS = 24 * 60 * 60 * 1000;

function asRecord(data: JsonValue): Record<string, JsonValue> | null {
  return data !== null && typeof data === 'object' && !Array.isArray(data) ? data : null;
}

/** Build the example handler; `clock` drives the `delayMs` wait. */
export function createExampleHandler(clock: Clock = systemClock): (ctx: TurnContext) => Promise<TurnOutcome> {
  return async (ctx) => {
    let steered: JsonValue | undefined;
    const unsubscribe = ctx.onSteer((input) => {
      steered = input;
    });
    try {
      const data = ctx.event.data;
      const rec = asRecord(data);
      const delay = Math.max(0, ...ctx.events.map((e) => delayOf(asRecord(e.data))));
      if (delay > 0) await clock.sleep(Math.min(delay, MAX_DELAY_MS), ctx.signal);
      const text = `echo: ${ctx.events.map((e) => textOf(e.data)).join(' | ')}`;
      await streamChunks(ctx, rec, text, clock);
      const flooded = await flood(ctx, rec, clock);
      ctx.signal.throwIfAborted();
      if (rec?.fail === true) {
        const err = new Error('example worker asked to fail') as Error & { code?: string; retryable?: boolean };
        if (typeof rec.failCode === 'string') err.code = rec.failCode;
        if (typeof rec.retryable === 'boolean') err.retryable = rec.retryable;
        throw err;
      }
      const content: Record<string, JsonValue> = { text };
      if (steered !== undefined) content.steered = steered;
      const seen = ctx.context?.messages.length ?? 0;
      if (seen > 0) content.seen = seen;
      if (rec?.history === true) content.history_total = await readWholeHistory(ctx);
      if (flooded) content.flood = flooded;
      const emit = effectsOf(rec, ctx);
      const deliver = deliveriesOf(rec, ctx, text);
      return {
        messages: [{ role: 'assistant', content }],
        ...(emit.length > 0 ? { emit } : {}),
        ...(deliver.length > 0 ? { deliver } : {}),
      };
    } finally {
      unsubscribe();
    }
  };
}

/** Pieces `stream: true` cuts a reply into: enough to see it grow, few enough to read each one. */
const REPLY_PIECES = 10;

/**
 * `stream`: a number N streams N chunks `w1 `, `w2 ` … over `streamMs`; `true` streams `reply`
 * itself in about `REPLY_PIECES` pieces over `streamMs` (default 1 s), so a watcher sees the text
 * it will find committed. Each chunk is `{ delta }`, as a model's tokens would come.
 */
async function streamChunks(ctx: TurnContext, rec: Record<string, JsonValue> | null, reply: string, clock: Clock): Promise<void> {
  const n = rec?.stream;
  let deltas: string[];
  let defaultMs: number;
  if (n === true) {
    deltas = piecesOf(reply, REPLY_PIECES);
    defaultMs = 1_000;
  } else if (typeof n === 'number' && Number.isInteger(n) && n > 0) {
    deltas = Array.from({ length: Math.min(n, 100_000) }, (_, i) => `w${i + 1} `);
    defaultMs = deltas.length * 40;
  } else {
    return;
  }
  const count = deltas.length;
  const total = typeof rec?.streamMs === 'number' && rec.streamMs >= 0 ? Math.min(rec.streamMs, MAX_DELAY_MS) : defaultMs;
  const stamp = rec?.stamp === true;
  for (const [i, delta] of deltas.entries()) {
    ctx.stream(stamp ? { delta, t: performance.timeOrigin + performance.now() } : { delta });
    if (i < count - 1 && total > 0) await clock.sleep(total / count, ctx.signal);
  }
}

/** `flood`: what it streamed, and whether the stream budget ended it. */
async function flood(
  ctx: TurnContext,
  rec: Record<string, JsonValue> | null,
  clock: Clock,
): Promise<{ chunks: number; bytes: number; stopped: boolean } | undefined> {
  const spec = rec?.flood === true ? {} : asRecord(rec?.flood ?? null);
  if (!spec) return undefined;
  const size = typeof spec.chunkBytes === 'number' && spec.chunkBytes >= 1 ? Math.min(Math.floor(spec.chunkBytes), 1 << 20) : 32 * 1024;
  const ms = typeof spec.ms === 'number' && spec.ms >= 0 ? Math.min(spec.ms, MAX_DELAY_MS) : 10_000;
  const delta = 'x'.repeat(size);
  const end = clock.nowMs() + ms;
  let chunks = 0;
  while (clock.nowMs() < end && !ctx.signal.aborted) {
    if (!ctx.stream({ delta })) return { chunks, bytes: chunks * size, stopped: true };
    chunks++;
    // let the socket's queue drain between chunks: a worker's memory stays flat
    await new Promise<void>((resolve) => setImmediate(resolve));
  }
  return { chunks, bytes: chunks * size, stopped: false };
}

/**
 * `text` in at most `max` pieces of whole words, each word with the blanks after it, as evenly
 * as the words allow. Cut only where a blank meets a word, so joined they are `text` exactly.
 */
export function piecesOf(text: string, max: number): string[] {
  const words = text.split(/(?<=\s)(?=\S)/);
  const count = Math.min(max, words.length);
  const pieces: string[] = [];
  for (let i = 0; i < count; i++) {
    pieces.push(words.slice(Math.floor((i * words.length) / count), Math.floor(((i + 1) * words.length) / count)).join(''));
  }
  return pieces;
}

/** An event's `delayMs`, 0 when it asks for none. */
function delayOf(rec: Record<string, JsonValue> | null): number {
  const delay = rec?.delayMs;
  return typeof delay === 'number' && Number.isFinite(delay) && delay > 0 ? delay : 0;
}

/** What the echo says of one event: its `text`, else its JSON. */
function textOf(data: JsonValue): string {
  const rec = asRecord(data);
  return typeof rec?.text === 'string' ? rec.text : JSON.stringify(data);
}

/** The effects an example event asks for: `emit` entries and a `remindInMs` timer to its own actor. */
function effectsOf(rec: Record<string, JsonValue> | null, ctx: TurnContext): Emit[] {
  if (!rec) return [];
  const out: Emit[] = [];
  const wanted = Array.isArray(rec.emit) ? rec.emit : rec.emit !== undefined ? [rec.emit] : [];
  for (const e of wanted) {
    const r = asRecord(e);
    if (r && typeof r.actor === 'string') {
      out.push({ actor: r.actor, data: r.data ?? null, ...(typeof r.delay_ms === 'number' ? { delay_ms: r.delay_ms } : {}) });
    }
  }
  const ring = asRecord(rec.ring ?? null);
  if (ring && Array.isArray(ring.actors) && ring.actors.length > 0 && typeof ring.n === 'number' && typeof ring.last === 'number') {
    const next = ring.actors[(ring.n + 1) % ring.actors.length];
    if (ring.n < ring.last && typeof next === 'string') out.push({ actor: next, data: { ...rec, ring: { ...ring, n: ring.n + 1 } } });
  }
  const remind = rec.remindInMs;
  if (typeof remind === 'number' && Number.isInteger(remind) && remind >= 0) {
    const self = `${ctx.turnRef.agent_uid}/${ctx.turnRef.session_id}`;
    out.push({ actor: self, data: { reminder: typeof rec.text === 'string' ? rec.text : true }, delay_ms: remind });
  }
  return out;
}

/** The outbound messages an example event asks for (`deliver`). */
function deliveriesOf(rec: Record<string, JsonValue> | null, ctx: TurnContext, text: string): Deliver[] {
  if (!rec || rec.deliver === undefined) return [];
  const wanted = Array.isArray(rec.deliver) ? rec.deliver : [rec.deliver];
  const actor = `${ctx.turnRef.agent_uid}/${ctx.turnRef.session_id}`;
  return wanted.flatMap((d) => {
    const r = asRecord(d);
    if (!r || typeof r.sink !== 'string') return [];
    const body = r.body === undefined ? { text, actor, event_id: ctx.turnRef.event_id } : r.body;
    return [{ sink: r.sink, body, ...(typeof r.key === 'string' ? { key: r.key } : {}) }];
  });
}

/** Pages back through the whole conversation with `history.read`; returns how many messages it read. */
async function readWholeHistory(ctx: TurnContext): Promise<number> {
  let read = 0;
  let before: number | undefined;
  for (;;) {
    const page = await ctx.history({ limit: 200, ...(before === undefined ? {} : { beforeSeq: before }) });
    read += page.messages.length;
    if (!page.has_more || page.messages.length === 0) return read;
    before = page.messages[0]!.seq;
  }
}

/** The handler with the system clock. */
export const exampleHandler = createExampleHandler();

/** Hooks that send every turn_result twice (exercises the daemon's duplicate handling). */
export const duplicateResultHooks: WorkerHooks = {
  beforeSendResult: (msg: TurnResult): WorkerMessage[] => [msg, msg],
};

export type { WorkerCredentials } from './credentials.ts';

export interface ExampleWorkerOptions {
  endpoint: string;
  workerId: string;
  capacity?: number;
  logger: Logger;
  clock?: Clock;
  /** Send every turn_result twice (via the `beforeSendResult` fault point). */
  duplicateResults?: boolean;
  /** Absent: no CURVE (a daemon started with --insecure). */
  credentials?: WorkerCredentials;
}

/** Create and start the example worker. The caller owns `stop()` (and signal handling). */
export async function runExampleWorker(opts: ExampleWorkerOptions): Promise<Worker> {
  const clock = opts.clock ?? systemClock;
  const worker = createWorker({
    endpoint: opts.endpoint,
    workerId: opts.workerId,
    capacity: opts.capacity ?? 1,
    handler: createExampleHandler(clock),
    logger: opts.logger,
    clock,
    sdk: 'corral-ts/0.1 example',
    ...(opts.duplicateResults ? { hooks: duplicateResultHooks } : {}),
    ...(opts.credentials ? { curve: opts.credentials.curve, auth: opts.credentials.auth } : {}),
  });
  await worker.start();
  return worker;
}
