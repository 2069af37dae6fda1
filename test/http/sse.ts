/**
 * For the stream route's tests: a reader of Server-Sent Events over a real `fetch`, and a live
 * source the test scripts (the events it yields, when it ends), so that the route's framing,
 * bounds and endings are checked event by event.
 */
import type { ActorKey } from '../../src/base/actor-key.ts';
import type { LiveEvent, LiveWatch, LiveWatchOptions } from '../../src/live/events.ts';
import type { LiveSource } from '../../src/http/server.ts';
import { parseSseBlock, SseSplitter, type SseMessage } from '../../src/live/sse.ts';

export type { SseMessage };

/** Reads `res`'s body as SSE: `next()` gives the next message or comment, undefined at its end. */
export class SseReader {
  raw = '';
  private readonly splitter = new SseSplitter();
  private readonly blocks: string[] = [];
  private readonly reader: ReadableStreamDefaultReader<Uint8Array>;
  private readonly decoder = new TextDecoder();
  ended = false;

  constructor(res: Response) {
    this.reader = res.body!.getReader();
  }

  async next(timeoutMs = 10_000): Promise<SseMessage | undefined> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const block = this.blocks.shift();
      if (block !== undefined) return parseSseBlock(block);
      if (this.ended) return undefined;
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<'late'>((r) => (timer = setTimeout(() => r('late'), Math.max(0, deadline - Date.now()))));
      const read = await Promise.race([this.reader.read(), late]).finally(() => clearTimeout(timer));
      if (read === 'late') throw new Error(`no SSE message within ${timeoutMs} ms; so far: ${JSON.stringify(this.raw.slice(-300))}`);
      if (read.done) {
        this.ended = true;
        continue;
      }
      const text = this.decoder.decode(read.value, { stream: true });
      this.raw += text;
      this.blocks.push(...this.splitter.push(text));
    }
  }

  /** The next message that is not a comment. */
  async event(timeoutMs?: number): Promise<SseMessage | undefined> {
    for (;;) {
      const m = await this.next(timeoutMs);
      if (!m || m.comment === undefined) return m;
    }
  }

  async cancel(): Promise<void> {
    await this.reader.cancel().catch(() => undefined);
  }
}

/** One watch the test drives: `push` an event, `finish` the stream. */
export class ScriptedWatch implements LiveWatch {
  readonly actor: ActorKey;
  readonly opts: LiveWatchOptions;
  closed = false;
  /** Events taken by the route so far. */
  taken = 0;
  /** When set, the watch makes a chunk of this many bytes whenever one is asked for, without end. */
  flood: number | undefined;
  private readonly queue: LiveEvent[] = [];
  private wake: (() => void) | undefined;

  constructor(actor: ActorKey, opts: LiveWatchOptions) {
    this.actor = actor;
    this.opts = opts;
    opts.signal?.addEventListener('abort', () => this.finish(), { once: true });
  }

  /** From now on, a chunk of `bytes` whenever one is asked for (a turn streaming at full speed). */
  startFlood(bytes: number): void {
    this.flood = bytes;
    this.wake?.();
  }

  push(...events: LiveEvent[]): void {
    this.queue.push(...events);
    this.wake?.();
  }

  finish(): void {
    this.closed = true;
    this.wake?.();
  }

  async close(): Promise<void> {
    this.finish();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<LiveEvent> {
    for (;;) {
      if (this.flood !== undefined && !this.closed) {
        // a turn at full speed still lets the event loop run between chunks
        await new Promise<void>((r) => setImmediate(r));
        this.taken++;
        const data = { event_id: 'e', epoch: 1, attempt: 1, seq: this.taken, data: 'x'.repeat(this.flood) };
        yield { id: `flood-${this.taken}`, type: 'chunk', data };
        continue;
      }
      const e = this.queue.shift();
      if (e) {
        this.taken++;
        yield e;
        continue;
      }
      if (this.closed) return;
      await new Promise<void>((r) => (this.wake = r));
      this.wake = undefined;
    }
  }
}

/** A live source whose watches the test drives (the route under test is all that is real here). */
export class ScriptedLive implements LiveSource {
  readonly watches: ScriptedWatch[] = [];
  /** The next watch fails to start with this. */
  failNext: Error | undefined;
  /** While set, watches start only once it resolves. */
  gate: Promise<void> | undefined;
  /** Watches waiting at the gate. */
  starting = 0;

  async watch(actor: ActorKey, opts: LiveWatchOptions): Promise<LiveWatch> {
    const fail = this.failNext;
    this.failNext = undefined;
    if (fail) throw fail;
    if (this.gate) {
      this.starting++;
      await this.gate.finally(() => this.starting--);
    }
    const w = new ScriptedWatch(actor, opts);
    this.watches.push(w);
    return w;
  }

  last(): ScriptedWatch {
    const w = this.watches.at(-1);
    if (!w) throw new Error('no watch started yet');
    return w;
  }
}
