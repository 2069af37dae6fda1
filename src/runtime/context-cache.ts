/**
 * The contexts of turn_start (docs/protocol.md §5.3), kept per conversation between turns.
 *
 * Reading a context costs PostgreSQL the most of a begin: the latest messages, their `jsonb`
 * converted to text and measured, at every turn. But this daemon has just written those messages
 * itself: the commit statement hands back their text (as PostgreSQL prints it), so the next
 * turn's context can be built here from the one before and what the commit added.
 *
 * Invariants:
 *  C1 the cache is never trusted on its own. A begin sends each actor's cached
 *     `(conversation id, next_seq)`, and the database builds the context itself unless both still
 *     match. Messages are written only by a commit, which moves `next_seq` in the same statement,
 *     and never change afterwards (H2, src/db/turns/history.ts): a matching `next_seq` means the same
 *     messages. A turn committed by another daemon, a commit whose outcome was lost, or an entry
 *     evicted here all fall back to the database. So does an entry holding a message that
 *     transcript retention deleted since (`pruned_through` at or above the entry's first seq, R4
 *     of src/db/operations/transcript-retention.ts): the database then reads the messages although
 *     `next_seq` matches, and what it read wins.
 *  C2 an entry holds exactly the messages the database would pick (`windowStart` is the selection of
 *     `contextLinesOf`: the latest `maxMessages`, then the longest run of them, newest first, whose
 *     content fits `maxBytes`). Appending keeps it exact: messages outside a window never come
 *     back into a later one, because the next window ends later and needs at least as many bytes.
 *  C3 memory is bounded: least recently used entries go first once `maxBytes` of the cache is
 *     reached, and `clear` drops everything (the daemon calls it when it idles).
 */
import type { ContextLimits } from '../db/turns/history.ts';

/** One conversation's context as this daemon last knew it. Immutable: a begin may hold it across a statement. */
export interface CachedContext {
  readonly conversationId: string;
  /** The seq the conversation's next message gets. */
  readonly nextSeq: number;
  /** The context's messages, oldest first, as their JSON on the wire; the last one is `nextSeq - 1`. */
  readonly elements: readonly string[];
  /** The UTF-8 bytes of each message's content, which is what the byte budget counts (H3). */
  readonly contentBytes: readonly number[];
  /** An estimate of the memory the entry holds, for the cache's bound. */
  readonly size: number;
}

/**
 * Messages as the database prints them: one line per message, oldest first, `role` and the
 * content's JSON text separated by one space (a JSON text printed by PostgreSQL never holds a raw
 * newline: it is escaped inside strings).
 */
export type MessageLines = string;

const ENTRY_OVERHEAD = 160;
const ELEMENT_OVERHEAD = 48;

/** The wire JSON of one context message. */
export function messageElement(seq: number, role: string, contentJson: string): string {
  return `{"seq":${seq},"role":"${role}","content":${contentJson}}`;
}

/** The first index of `bytes` that the window of `limits` keeps (C2); `bytes.length` when none. */
export function windowStart(bytes: readonly number[], limits: ContextLimits): number {
  const oldest = Math.max(0, bytes.length - limits.maxMessages);
  let sum = 0;
  let i = bytes.length;
  while (i > oldest && sum + bytes[i - 1]! <= limits.maxBytes) {
    sum += bytes[i - 1]!;
    i--;
  }
  return i;
}

/** The lines of `lines`, one per message (none for null or ''). */
function splitLines(lines: MessageLines | null): string[] {
  return lines === null || lines === '' ? [] : lines.split('\n');
}

/** Message lines (numbered from `firstSeq`) as context messages. */
function parseLines(lines: readonly string[], firstSeq: number): { elements: string[]; contentBytes: number[] } {
  const elements: string[] = [];
  const contentBytes: number[] = [];
  let seq = firstSeq;
  for (const line of lines) {
    const space = line.indexOf(' ');
    if (space <= 0) throw new Error(`malformed message line from the database: ${line.slice(0, 40)}`);
    const content = line.slice(space + 1);
    elements.push(messageElement(seq++, line.slice(0, space), content));
    contentBytes.push(Buffer.byteLength(content));
  }
  return { elements, contentBytes };
}

function entryOf(
  conversationId: string,
  nextSeq: number,
  elements: string[],
  contentBytes: number[],
  limits: ContextLimits,
): CachedContext {
  const start = windowStart(contentBytes, limits);
  const kept = start === 0 ? elements : elements.slice(start);
  let size = ENTRY_OVERHEAD + conversationId.length;
  for (const e of kept) size += ELEMENT_OVERHEAD + e.length;
  return { conversationId, nextSeq, elements: kept, contentBytes: start === 0 ? contentBytes : contentBytes.slice(start), size };
}

/**
 * The context as the database read it at a begin: `lines` are the messages of its window (null:
 * none), the last of them `nextSeq - 1`.
 */
export function contextFromDatabase(
  conversationId: string,
  nextSeq: number,
  lines: MessageLines | null,
  limits: ContextLimits,
): CachedContext {
  const list = splitLines(lines);
  const { elements, contentBytes } = parseLines(list, nextSeq - list.length);
  return entryOf(conversationId, nextSeq, elements, contentBytes, limits);
}

/**
 * What a begin sends the database of an entry (C1): the conversation, its `next_seq`, and the
 * first seq the entry holds (`nextSeq` when it holds none), which no deletion may have reached.
 */
export function knownOf(c: CachedContext | undefined): { conversationId: string; nextSeq: number; firstSeq: number } | undefined {
  return c && { conversationId: c.conversationId, nextSeq: c.nextSeq, firstSeq: c.nextSeq - c.elements.length };
}

/** turn_start's `context` field as JSON text (docs/protocol.md §5.3). */
export function contextJson(c: CachedContext): string {
  const firstSeq = c.nextSeq - c.elements.length;
  const first = c.elements.length > 0 ? `,"first_seq":${firstSeq}` : '';
  return (
    `{"conversation_id":"${c.conversationId}","messages":[${c.elements.join(',')}]${first}` +
    `,"has_more":${firstSeq > 1},"current_seq":${c.nextSeq}}`
  );
}

export interface ContextCacheStats {
  /** Begins whose context came from here (the database only checked it). */
  hits: number;
  /** Begins whose context the database read. */
  misses: number;
  entries: number;
  bytes: number;
}

export class ContextCache {
  /** Least recently used first (a Map keeps insertion order). */
  private readonly entries = new Map<string, CachedContext>();
  private bytes = 0;
  private hits = 0;
  private misses = 0;
  private readonly maxBytes: number;
  private readonly limits: ContextLimits;

  /** `maxBytes` 0 keeps nothing: every context is read by the database. */
  constructor(limits: ContextLimits, maxBytes: number) {
    this.limits = limits;
    this.maxBytes = maxBytes;
  }

  /** Whether anything is kept at all. */
  get enabled(): boolean {
    return this.maxBytes > 0;
  }

  /** What the cache knows of `key`'s conversation, for the begin's check (C1). */
  known(key: string): CachedContext | undefined {
    return this.entries.get(key);
  }

  /**
   * The context a begin of `key` sends: the cached entry `known` when the database found the
   * conversation unchanged (`conversationId`, `nextSeq`) and so read nothing (`lines` null), else
   * the one built from the `lines` it read, which replaces the entry.
   */
  resolve(
    key: string,
    known: CachedContext | undefined,
    read: { conversationId: string; nextSeq: number; lines: MessageLines | null },
  ): CachedContext {
    if (known !== undefined && read.lines === null && known.conversationId === read.conversationId && known.nextSeq === read.nextSeq) {
      this.hits++;
      if (this.entries.get(key) === known) this.touch(key, known);
      return known;
    }
    this.misses++;
    const entry = contextFromDatabase(read.conversationId, read.nextSeq, read.lines, this.limits);
    this.put(key, entry);
    return entry;
  }

  /**
   * A turn of `key` committed `lines`, numbered from `firstSeq`, in `conversationId`: the entry
   * moves on when it ended right before them, and a conversation's first turn starts one. An entry
   * that cannot be brought up to date is dropped (a later begin reads the database, C1).
   */
  committed(key: string, conversationId: string, firstSeq: number, lines: MessageLines): void {
    if (this.maxBytes === 0) return;
    const next = this.afterCommit(key, conversationId, firstSeq, lines);
    if (next === 'unchanged') return;
    if (next) this.put(key, next);
    else this.drop(key);
  }

  /**
   * The entry `committed` would keep for `key` after that commit, changing nothing: 'unchanged'
   * when the entry holds those messages already, undefined when it would be dropped. A turn begun
   * in the same transaction as the commit (src/runtime/turn-commit.ts) sends it as its known context.
   */
  afterCommit(key: string, conversationId: string, firstSeq: number, lines: MessageLines): CachedContext | 'unchanged' | undefined {
    const entry = this.entries.get(key);
    const added = parseLines(splitLines(lines), firstSeq);
    const nextSeq = firstSeq + added.elements.length;
    const same = entry !== undefined && entry.conversationId === conversationId;
    if (same && entry.nextSeq >= nextSeq) return 'unchanged';
    if (same && entry.nextSeq === firstSeq) {
      return entryOf(
        conversationId,
        nextSeq,
        [...entry.elements, ...added.elements],
        [...entry.contentBytes, ...added.contentBytes],
        this.limits,
      );
    }
    return firstSeq === 1 ? entryOf(conversationId, nextSeq, added.elements, added.contentBytes, this.limits) : undefined;
  }

  /** Drops every entry (the daemon is idle: the memory goes back, C3). */
  clear(): void {
    this.entries.clear();
    this.bytes = 0;
  }

  get stats(): ContextCacheStats {
    return { hits: this.hits, misses: this.misses, entries: this.entries.size, bytes: this.bytes };
  }

  private touch(key: string, entry: CachedContext): void {
    this.entries.delete(key);
    this.entries.set(key, entry);
  }

  private put(key: string, entry: CachedContext): void {
    if (this.maxBytes === 0) return;
    this.drop(key);
    if (entry.size > this.maxBytes) return;
    this.entries.set(key, entry);
    this.bytes += entry.size;
    for (const [oldest, e] of this.entries) {
      if (this.bytes <= this.maxBytes) break;
      this.entries.delete(oldest);
      this.bytes -= e.size;
    }
  }

  private drop(key: string): void {
    const old = this.entries.get(key);
    if (old === undefined) return;
    this.entries.delete(key);
    this.bytes -= old.size;
  }
}
