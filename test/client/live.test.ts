/**
 * Live turns through the client: `corral.watch(actor)` yields each turn's start, the chunks its
 * worker streams (in order, each once, the first well before the commit), and its commit or
 * failure; a retry begins with `reset`; `lastEventId` resumes with no gap and no duplicate, from
 * another client too; the relay's bounds drop what is over them.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CorralError, type Corral, type LiveEvent, type LiveWatch } from '../../src/client/index.ts';
import { startClientSetup, type ClientSetup } from './helpers.ts';

let s: ClientSetup;
let sender: Corral;

beforeAll(async () => {
  s = await startClientSetup({ retryLimit: 1, retryDelaySeconds: 1, retryDelayMaxSeconds: 1, streamTurnBytes: 64 * 1024 }, { capacity: 8 });
  sender = await s.connect();
});

afterAll(async () => {
  await s?.stop();
});

/** Reads `watch` until `until` holds, with the time each event arrived. */
async function read(watch: LiveWatch, until: (seen: LiveEvent[]) => boolean, timeoutMs = 20_000): Promise<{ e: LiveEvent; at: number }[]> {
  const seen: { e: LiveEvent; at: number }[] = [];
  const timer = setTimeout(() => void watch.close(), timeoutMs);
  try {
    for await (const e of watch) {
      seen.push({ e, at: performance.now() });
      if (until(seen.map((x) => x.e))) break;
    }
  } finally {
    clearTimeout(timer);
  }
  if (!until(seen.map((x) => x.e))) throw new Error(`the stream ended first: ${seen.map((x) => x.e.type).join(' ')}`);
  return seen;
}

const deltas = (seen: LiveEvent[]) => seen.flatMap((e) => (e.type === 'chunk' ? [(e.data.data as { delta: string }).delta] : []));
const words = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => `w${from + i} `);

describe('corral.watch: live turns', () => {
  it('yields turn_started, 50 chunks in order (the first well before the commit), then the committed turn', async () => {
    const watch = await s.corral.watch('live/fifty');
    const sent = await sender.send('live/fifty', { text: 'tell me', stream: 50, streamMs: 2000 });
    const seen = await read(watch, (x) => x.some((e) => e.type === 'turn_committed'));
    const types = seen.map((x) => x.e.type);
    expect(types[0]).toBe('turn_started');
    expect(types.at(-1)).toBe('turn_committed');
    expect(deltas(seen.map((x) => x.e))).toEqual(words(1, 50));
    const started = seen[0]!.e;
    expect(started.type === 'turn_started' && started.data).toMatchObject({
      event_id: sent.eventId,
      attempt: 1,
      events: [{ id: sent.eventId, data: { text: 'tell me' } }],
    });
    const firstChunk = seen.find((x) => x.e.type === 'chunk')!;
    const committed = seen.at(-1)!;
    expect(committed.at - firstChunk.at).toBeGreaterThan(1000);
    expect(committed.e.type === 'turn_committed' && committed.e.data.messages.map((m) => m.role)).toEqual(['user', 'assistant']);
    // ids are unique and say where the stream was
    expect(new Set(seen.map((x) => x.e.id)).size).toBe(seen.length);
    expect(seen.filter((x) => x.e.type === 'chunk').map((x) => x.e.id.split(':')[1])).toEqual(words(1, 50).map((_, i) => String(i + 1)));
  });

  it('resumes after chunk 20 from another client with lastEventId: 21–50 exactly once, then the commit', async () => {
    const first = await s.corral.watch('live/resume');
    await sender.send('live/resume', { stream: 50, streamMs: 2000 });
    const before = await read(first, (x) => x.filter((e) => e.type === 'chunk').length === 20);
    await first.close();
    const last = before.at(-1)!.e;
    expect(last.type).toBe('chunk');
    const other = await s.connect();
    const again = await other.watch('live/resume', { lastEventId: last.id });
    const after = await read(again, (x) => x.some((e) => e.type === 'turn_committed'));
    await again.close();
    expect(after[0]!.e.type).toBe('chunk');
    expect(deltas(after.map((x) => x.e))).toEqual(words(21, 50));
    expect(after.at(-1)!.e.type).toBe('turn_committed');
  });

  it('a failed attempt ends with turn_failed, and its retry begins with reset before its own chunks', async () => {
    const watch = await s.corral.watch('live/retry');
    await sender.send('live/retry', { stream: 3, streamMs: 30, fail: true });
    const seen = (await read(watch, (x) => x.some((e) => e.type === 'turn_failed' && e.data.reason === 'dead_lettered'))).map((x) => x.e);
    expect(seen.map((e) => (e.type === 'chunk' ? `chunk#${e.data.attempt}` : e.type))).toEqual([
      'turn_started',
      'chunk#1',
      'chunk#1',
      'chunk#1',
      'turn_failed',
      'reset',
      'turn_started',
      'chunk#2',
      'chunk#2',
      'chunk#2',
      'turn_failed',
    ]);
    const failed = seen[4]!;
    expect(failed.type === 'turn_failed' && failed.data).toMatchObject({ reason: 'failed', attempt: 1 });
    const reset = seen[5]!;
    expect(reset.type === 'reset' && reset.data.attempt).toBe(2);
  });

  it('a watch that starts mid-turn gets the live turn from its first chunk', async () => {
    await sender.send('live/late', { stream: 30, streamMs: 1500 });
    const sawChunks = async () => {
      const probe = await s.connect();
      const w = await probe.watch('live/late');
      const seen = (await read(w, (x) => x.some((e) => e.type === 'turn_committed'))).map((x) => x.e);
      await w.close();
      return seen;
    };
    await new Promise((r) => setTimeout(r, 600));
    const seen = await sawChunks();
    expect(seen[0]!.type).toBe('turn_started');
    expect(deltas(seen)).toEqual(words(1, 30));
  });

  it('chunks past the per-attempt bytes are dropped and counted; the turn still commits', async () => {
    const watch = await s.corral.watch('live/bound');
    // each chunk frame is a few hundred bytes; 64 KiB takes roughly the first few hundred
    await sender.send('live/bound', { stream: 1500, streamMs: 300 });
    const seen = (await read(watch, (x) => x.some((e) => e.type === 'turn_committed'))).map((x) => x.e);
    const shown = deltas(seen);
    expect(shown.length).toBeGreaterThan(50);
    expect(shown.length).toBeLessThan(1500);
    expect(shown).toEqual(words(1, shown.length));
  });

  it('refuses a lastEventId that is not one', async () => {
    await expect(s.corral.watch('live/x', { lastEventId: 'nope' })).rejects.toBeInstanceOf(CorralError);
  });
});
