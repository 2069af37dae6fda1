import { describe, expect, it } from 'vitest';
import { ContextCache, contextFromDatabase, contextJson, knownOf, windowStart } from '../../src/runtime/context-cache.ts';

const limits = { maxMessages: 3, maxBytes: 20 };
const conv = '11111111-1111-4111-8111-111111111111';
const lines = (...msgs: [string, unknown][]) => msgs.map(([role, content]) => `${role} ${JSON.stringify(content)}`).join('\n');
const parsed = (c: ReturnType<typeof contextFromDatabase>) => JSON.parse(contextJson(c)) as Record<string, unknown>;

describe('context window', () => {
  it('keeps the latest messages by count, then the newest run whose content fits the bytes', () => {
    expect(windowStart([1, 1, 1, 1, 1], limits)).toBe(2);
    expect(windowStart([1, 15, 4, 5], limits)).toBe(2);
    expect(windowStart([1, 2, 21], limits)).toBe(3);
    expect(windowStart([], limits)).toBe(0);
    // exactly the budget fits
    expect(windowStart([10, 10], limits)).toBe(0);
    // a message that does not fit ends the run, even if an older one would
    expect(windowStart([1, 19, 2], limits)).toBe(2);
  });

  it('numbers the lines read so the last is next_seq - 1, and counts content bytes in UTF-8', () => {
    const c = contextFromDatabase(conv, 8, lines(['user', 'é'], ['assistant', { a: [1, 2] }]), { maxMessages: 10, maxBytes: 100 });
    expect(c.contentBytes).toEqual([4, 11]);
    expect(parsed(c)).toEqual({
      conversation_id: conv,
      messages: [
        { seq: 6, role: 'user', content: 'é' },
        { seq: 7, role: 'assistant', content: { a: [1, 2] } },
      ],
      first_seq: 6,
      has_more: true,
      current_seq: 8,
    });
    const empty = contextFromDatabase(conv, 1, null, limits);
    expect(parsed(empty)).toEqual({ conversation_id: conv, messages: [], has_more: false, current_seq: 1 });
    // the newest message alone is over the budget: none sent, older ones said to exist
    expect(parsed(contextFromDatabase(conv, 5, null, limits))).toEqual({
      conversation_id: conv,
      messages: [],
      has_more: true,
      current_seq: 5,
    });
  });
});

describe('ContextCache', () => {
  const key = 'a/s';

  it('moves an entry on with each commit, and answers the begin from it while the database agrees', () => {
    const cache = new ContextCache(limits, 1_000_000);
    cache.committed(key, conv, 1, lines(['user', 1], ['assistant', 2]));
    const known = cache.known(key)!;
    expect(known).toMatchObject({ conversationId: conv, nextSeq: 3 });
    cache.committed(key, conv, 3, lines(['user', 3], ['assistant', 4]));
    const next = cache.known(key)!;
    expect(next.nextSeq).toBe(5);
    expect(next.elements).toEqual([
      '{"seq":2,"role":"assistant","content":2}',
      '{"seq":3,"role":"user","content":3}',
      '{"seq":4,"role":"assistant","content":4}',
    ]);
    // the database found the conversation where the entry says: the entry is the context
    expect(cache.resolve(key, next, { conversationId: conv, nextSeq: 5, lines: null })).toBe(next);
    expect(cache.stats).toMatchObject({ hits: 1, misses: 0, entries: 1 });
  });

  it('tells, changing nothing, the entry a commit would leave (the known context of a turn begun in that commit)', () => {
    const cache = new ContextCache(limits, 1_000_000);
    // a first turn starts an entry; one that does not follow it would drop it
    const first = cache.afterCommit(key, conv, 1, lines(['user', 1], ['assistant', 2]));
    expect(first).toMatchObject({ conversationId: conv, nextSeq: 3 });
    expect(cache.known(key)).toBeUndefined();
    expect(cache.afterCommit(key, conv, 5, lines(['user', 5]))).toBeUndefined();
    cache.committed(key, conv, 1, lines(['user', 1], ['assistant', 2]));
    const now = cache.known(key)!;
    const after = cache.afterCommit(key, conv, 3, lines(['user', 3], ['assistant', 4]));
    expect(cache.known(key)).toBe(now);
    // what committed() then keeps is the same context
    cache.committed(key, conv, 3, lines(['user', 3], ['assistant', 4]));
    expect(after).toEqual(cache.known(key));
    expect(cache.afterCommit(key, conv, 3, lines(['user', 3], ['assistant', 4]))).toBe('unchanged');
    // the begin in the commit finds the conversation where that entry says: a hit, the entry is the context
    expect(cache.resolve(key, after as ReturnType<typeof cache.known>, { conversationId: conv, nextSeq: 5, lines: null })).toBe(after);
  });

  it('takes what the database read when the conversation moved on elsewhere, and drops what it cannot bring up to date', () => {
    const cache = new ContextCache(limits, 1_000_000);
    cache.committed(key, conv, 1, lines(['user', 1]));
    const stale = cache.known(key)!;
    const read = cache.resolve(key, stale, { conversationId: conv, nextSeq: 4, lines: lines(['user', 2], ['assistant', 3]) });
    expect(read).not.toBe(stale);
    expect(read.nextSeq).toBe(4);
    expect(cache.known(key)).toBe(read);
    expect(cache.stats).toMatchObject({ hits: 0, misses: 1 });
    // a commit that does not follow the entry (seqs 9.. while the entry ends at 3): dropped
    cache.committed(key, conv, 9, lines(['user', 9]));
    expect(cache.known(key)).toBeUndefined();
    // a late commit the entry already holds leaves it alone
    cache.committed(key, conv, 1, lines(['user', 1]));
    cache.committed(key, conv, 2, lines(['user', 2]));
    const now = cache.known(key)!;
    cache.committed(key, conv, 1, lines(['user', 1]));
    expect(cache.known(key)).toBe(now);
    expect(now.nextSeq).toBe(3);
  });

  it('takes what the database read although next_seq matches (transcript retention deleted what the entry held)', () => {
    const cache = new ContextCache(limits, 1_000_000);
    cache.committed(key, conv, 1, lines(['user', 1], ['assistant', 2], ['user', 3], ['assistant', 4]));
    const held = cache.known(key)!;
    // the begin tells the database which messages the entry holds: seqs 2..4
    expect(knownOf(held)).toEqual({ conversationId: conv, nextSeq: 5, firstSeq: 2 });
    expect(knownOf(undefined)).toBeUndefined();
    // seqs 1..2 were deleted: the database read the rest, and that is the context
    const read = cache.resolve(key, held, { conversationId: conv, nextSeq: 5, lines: lines(['user', 3], ['assistant', 4]) });
    expect(parsed(read)).toMatchObject({ messages: [{ seq: 3 }, { seq: 4 }], first_seq: 3, current_seq: 5 });
    expect(cache.known(key)).toBe(read);
    // everything was deleted: read, and empty ('' rather than null, which means "not read")
    const none = cache.resolve(key, read, { conversationId: conv, nextSeq: 5, lines: '' });
    expect(none.elements).toEqual([]);
    expect(knownOf(none)).toEqual({ conversationId: conv, nextSeq: 5, firstSeq: 5 });
    expect(cache.stats).toMatchObject({ hits: 0, misses: 2 });
  });

  it('keeps an entry equal to what the database would pick, whatever the commits', () => {
    const limits2 = { maxMessages: 4, maxBytes: 12 };
    const cache = new ContextCache(limits2, 1_000_000);
    const all: number[] = [];
    let next = 1;
    for (const sizes of [[1], [3, 9], [1, 1, 1, 1, 1, 1], [12], [13], [2, 2], [1]]) {
      const msgs = sizes.map((n) => ['tool', n === 1 ? 7 : 'x'.repeat(n - 2)] as [string, unknown]);
      cache.committed(key, conv, next, lines(...msgs));
      all.push(...sizes);
      next += sizes.length;
      const entry = cache.known(key)!;
      expect(entry.nextSeq).toBe(next);
      expect(entry.contentBytes).toEqual(all.slice(windowStart(all, limits2)));
    }
  });

  it('stays under its memory bound, least recently used first, and clears', () => {
    const one = contextFromDatabase(conv, 2, lines(['user', 'x'.repeat(10)]), limits);
    const cache = new ContextCache(limits, one.size * 2 + 1);
    for (const k of ['a', 'b', 'c'])
      cache.resolve(k, undefined, { conversationId: conv, nextSeq: 2, lines: lines(['user', 'x'.repeat(10)]) });
    expect(cache.known('a')).toBeUndefined();
    expect(cache.stats).toMatchObject({ entries: 2, bytes: one.size * 2 });
    // a hit counts as a use: 'b' outlives 'c' now
    cache.resolve('b', cache.known('b'), { conversationId: conv, nextSeq: 2, lines: null });
    cache.resolve('d', undefined, { conversationId: conv, nextSeq: 2, lines: lines(['user', 'x'.repeat(10)]) });
    expect(cache.known('c')).toBeUndefined();
    expect(cache.known('b')).toBeDefined();
    cache.clear();
    expect(cache.stats).toMatchObject({ entries: 0, bytes: 0 });
    // with no memory, nothing is kept but contexts still resolve
    const none = new ContextCache(limits, 0);
    expect(none.resolve(key, undefined, { conversationId: conv, nextSeq: 2, lines: lines(['user', 1]) }).elements).toHaveLength(1);
    none.committed(key, conv, 2, lines(['user', 2]));
    expect(none.known(key)).toBeUndefined();
  });
});
