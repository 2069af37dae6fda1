/**
 * Reading Server-Sent Events (the HTTP API's live stream, docs/http.md): one parser for every
 * reader of it in corral (`corral watch --url`, the benchmarks, the tests). A message is a block
 * of `field: value` lines ended by a blank line; `:` starts a comment (the keepalive).
 */
import { CorralError } from '../base/errors.ts';
import { LIVE_EVENT_TYPES, type LiveEvent } from './events.ts';

const TYPES: ReadonlySet<string> = new Set(LIVE_EVENT_TYPES);
/** Most bytes of one SSE message held while it arrives: a chunk is at most 64 KiB by default. */
const MAX_MESSAGE_TEXT = 8 * 1024 * 1024;

/** One SSE message as sent: its fields (`data` lines joined by a newline), or a comment. */
export interface SseMessage {
  id?: string;
  event?: string;
  data?: string;
  comment?: string;
}

/** The message of one block (the text between two blank lines). */
export function parseSseBlock(block: string): SseMessage {
  const m: SseMessage = {};
  const data: string[] = [];
  for (const line of block.split('\n')) {
    if (line.startsWith(':')) {
      m.comment = line.slice(1).trim();
      continue;
    }
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
    if (field === 'id' || field === 'event') m[field] = value;
    else if (field === 'data') data.push(value);
  }
  if (data.length > 0) m.data = data.join('\n');
  return m;
}

/**
 * Cuts a text stream into SSE blocks as they complete: `push` each decoded piece, get the blocks
 * it completed. Throws when one message grows past 8 MiB (a server that never ends one).
 */
export class SseSplitter {
  private buffer = '';

  push(text: string): string[] {
    this.buffer += text;
    const blocks: string[] = [];
    for (let cut = this.buffer.indexOf('\n\n'); cut >= 0; cut = this.buffer.indexOf('\n\n')) {
      blocks.push(this.buffer.slice(0, cut));
      this.buffer = this.buffer.slice(cut + 2);
    }
    if (this.buffer.length > MAX_MESSAGE_TEXT) throw new CorralError('internal', 'the server sent an SSE message over 8 MiB');
    return blocks;
  }
}

/** A message as a live event; undefined for a comment or a message that is not one of the stream's events. */
export function liveEventOf(m: SseMessage): LiveEvent | undefined {
  if (m.id === undefined || m.event === undefined || !TYPES.has(m.event) || m.data === undefined) return undefined;
  return { id: m.id, type: m.event, data: JSON.parse(m.data) } as LiveEvent;
}

/** The live events of an SSE body (`id:`, `event:`, `data:` lines; comments skipped). */
export async function* sseEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<LiveEvent> {
  const decoder = new TextDecoder();
  const splitter = new SseSplitter();
  for await (const bytes of body) {
    for (const block of splitter.push(decoder.decode(bytes, { stream: true }))) {
      const e = liveEventOf(parseSseBlock(block));
      if (e) yield e;
    }
  }
}
