/**
 * The stream route end to end: a daemon and an example worker that streams chunks, the HTTP API
 * on the client's own `watch`, real `fetch`. A turn sent over HTTP shows on the SSE stream as
 * turn_started, its chunks in order, turn_committed; a client that reconnects with `Last-Event-ID`
 * in the middle of a turn gets the rest of it, with no gap and no duplicate.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startClientSetup, type ClientSetup } from '../client/helpers.ts';
import { waitFor } from '../helpers/wait.ts';
import { json, startApi, type Api } from './helpers.ts';
import { SseReader, type SseMessage } from './sse.ts';

let s: ClientSetup;
let api: Api;
let token: string;

beforeAll(async () => {
  s = await startClientSetup({}, { capacity: 4 });
  api = await startApi(s.t.db.url, { corral: s.corral });
  token = await api.token('live-app', ['read', 'send']);
});

afterAll(async () => {
  await api?.stop();
  await s?.stop();
});

/** Reads SSE messages (comments skipped) until `until` holds for them. */
async function readUntil(sse: SseReader, until: (seen: SseMessage[]) => boolean, seen: SseMessage[] = []): Promise<SseMessage[]> {
  while (!until(seen)) {
    const m = await sse.event(20_000);
    if (!m) throw new Error(`the stream ended after ${seen.map((x) => x.event).join(' ')}`);
    seen.push(m);
  }
  return seen;
}

const deltaOf = (m: SseMessage) => (JSON.parse(m.data!) as { data: { delta: string } }).data.delta;
const words = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => `w${from + i} `);

describe('the live stream over HTTP', () => {
  it('a turn sent over HTTP streams as turn_started, its chunks in order, then turn_committed', async () => {
    const res = await api.call('/v1/actors/live/http1/stream', { token });
    expect(res.status).toBe(200);
    const sse = new SseReader(res);
    await waitFor(() => api.server.streams === 1, { what: 'the stream open' });
    const sent = (await (
      await api.call('/v1/actors/live/http1/events', { ...json({ text: 'go', stream: 8, streamMs: 400 }), token })
    ).json()) as {
      event_id: string;
    };
    const seen = await readUntil(sse, (x) => x.some((m) => m.event === 'turn_committed'));
    expect(seen.map((m) => m.event)).toEqual(['turn_started', ...Array<string>(8).fill('chunk'), 'turn_committed']);
    expect(JSON.parse(seen[0]!.data!)).toMatchObject({
      event_id: sent.event_id,
      attempt: 1,
      events: [{ id: sent.event_id, data: { text: 'go', stream: 8 } }],
    });
    expect(seen.slice(1, 9).map(deltaOf)).toEqual(words(1, 8));
    // every message has its id, and each id once
    expect(seen.every((m) => typeof m.id === 'string' && m.id.length > 0)).toBe(true);
    expect(new Set(seen.map((m) => m.id)).size).toBe(seen.length);
    const committed = JSON.parse(seen.at(-1)!.data!) as { messages: { role: string; content: unknown }[] };
    expect(committed.messages.map((m) => m.role)).toEqual(['user', 'assistant']);
    await sse.cancel();
    await waitFor(() => api.server.streams === 0, { what: 'the stream released once its client left' });
  });

  it('{"stream": true} streams the reply itself: about 10 pieces of whole words that put together are the committed text', async () => {
    const res = await api.call('/v1/actors/live/reply/stream', { token });
    const sse = new SseReader(res);
    await waitFor(() => api.server.streams === 1, { what: 'the stream open' });
    const text = 'one two three four five six seven eight nine ten eleven twelve thirteen';
    await api.call('/v1/actors/live/reply/events', { ...json({ text, stream: true, streamMs: 300 }), token });
    const seen = await readUntil(sse, (x) => x.some((m) => m.event === 'turn_committed'));
    const deltas = seen.filter((m) => m.event === 'chunk').map(deltaOf);
    expect(deltas).toHaveLength(10);
    // whole words: no piece begins with a blank, or is one
    expect(deltas.every((d) => /^\S/.test(d))).toBe(true);
    const committed = JSON.parse(seen.at(-1)!.data!) as { messages: { role: string; content: { text: string } }[] };
    expect(committed.messages.find((m) => m.role === 'assistant')!.content.text).toBe(`echo: ${text}`);
    expect(deltas.join('')).toBe(`echo: ${text}`);
    await sse.cancel();
    await waitFor(() => api.server.streams === 0, { what: 'the stream released' });
  });

  it('Last-Event-ID in the middle of a turn resumes right after it: no gap, no duplicate', async () => {
    const first = new AbortController();
    const res = await api.call('/v1/actors/live/resume/stream', { token, signal: first.signal });
    const sse = new SseReader(res);
    await waitFor(() => api.server.streams === 1, { what: 'the stream open' });
    await api.call('/v1/actors/live/resume/events', { ...json({ text: 'long', stream: 20, streamMs: 3_000 }), token });
    const before = await readUntil(sse, (x) => x.filter((m) => m.event === 'chunk').length === 5);
    first.abort();
    await waitFor(() => api.server.streams === 0, { what: 'the first stream released' });

    const again = await api.call('/v1/actors/live/resume/stream', { token, headers: { 'last-event-id': before.at(-1)!.id! } });
    expect(again.status).toBe(200);
    const after = await readUntil(new SseReader(again), (x) => x.some((m) => m.event === 'turn_committed'));
    const bad = await api.call('/v1/actors/live/resume/stream', { token, headers: { 'last-event-id': 'not-an-id' } });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { error: { code: string } }).error.code).toBe('invalid_argument');
    const chunks = [...before, ...after].filter((m) => m.event === 'chunk');
    expect(chunks.map(deltaOf)).toEqual(words(1, 20));
    expect(after[0]!.event).toBe('chunk');
    expect(deltaOf(after[0]!)).toBe('w6 ');
  });
});
