/**
 * `GET /v1/actors/{agent_uid}/{session_id}/stream` on a real port with real `fetch`, its events
 * from a live source the test scripts: the SSE framing, `Last-Event-ID`, keep-alive comments, the
 * endings (an `error` event, the client gone, the token revoked, the server closing), the limits
 * per actor and per server (429), and a client that does not read (dropped, nothing buffered
 * past the bound).
 */
import { connect as connectTcp } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { CorralError } from '../../src/base/errors.ts';
import { revokeToken } from '../../src/ops/api-tokens.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { waitFor } from '../helpers/wait.ts';
import { answer, failure, startApi, type Api } from './helpers.ts';
import { ScriptedLive, SseReader } from './sse.ts';

const KEEPALIVE_MS = 150;
const BUFFER_BYTES = 16 * 1024;

const tdb = useTestDatabase();
let live: ScriptedLive;
let api: Api;
let reader: string;
const open: SseReader[] = [];

beforeAll(async () => {
  live = new ScriptedLive();
  api = await startApi(tdb.url, {
    live,
    keepAliveMs: KEEPALIVE_MS,
    config: { httpMaxStreams: 4, httpMaxStreamsPerActor: 2, httpStreamBufferBytes: BUFFER_BYTES },
  });
  reader = await api.token('stream-reader', ['read']);
});

afterEach(async () => {
  for (const r of open.splice(0)) await r.cancel();
  await waitFor(() => api.server.streams === 0, { what: 'every stream of the test ended' });
});

afterAll(async () => {
  await api?.stop();
});

async function stream(actor: string, headers: Record<string, string> = {}, token = reader): Promise<{ res: Response; sse: SseReader }> {
  const res = await api.call(`/v1/actors/${actor}/stream`, { headers, token });
  const sse = new SseReader(res);
  open.push(sse);
  return { res, sse };
}

const attempt = { event_id: '0190f7e2-0000-7000-8000-000000000001', epoch: 3, attempt: 1 };

describe('the stream', () => {
  it('writes each live event as id, event and data lines, with the SSE headers', async () => {
    const { res, sse } = await stream('agent/s1');
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
    expect(res.headers.get('cache-control')).toBe('no-store');
    const watch = live.last();
    expect(watch.actor).toEqual({ agentUid: 'agent', sessionId: 's1' });
    expect(watch.opts.lastEventId).toBeUndefined();
    expect(watch.opts.maxBufferedBytes).toBe(BUFFER_BYTES);
    expect(watch.opts.signal?.aborted).toBe(false);

    const started = {
      ...attempt,
      events: [{ id: attempt.event_id, data: { text: 'hi\nthere' }, enqueued_at: '2026-01-01T00:00:00.000Z' }],
    };
    watch.push(
      { id: 'ev-1', type: 'turn_started', data: started },
      { id: 'ev-2', type: 'chunk', data: { ...attempt, seq: 1, data: 'line one\nline two\r\n' } },
      { id: 'ev-3', type: 'turn_committed', data: { ...attempt, messages: [{ seq: 1, role: 'assistant', content: 'ok' }], output: null } },
    );
    const got = [await sse.event(), await sse.event(), await sse.event()];
    expect(got).toEqual([
      { id: 'ev-1', event: 'turn_started', data: JSON.stringify(started) },
      { id: 'ev-2', event: 'chunk', data: JSON.stringify({ ...attempt, seq: 1, data: 'line one\nline two\r\n' }) },
      { id: 'ev-3', event: 'turn_committed', data: expect.stringContaining('"messages":[{"seq":1') },
    ]);
    expect(sse.raw).toContain(
      `id: ev-2\nevent: chunk\ndata: ${JSON.stringify({ ...attempt, seq: 1, data: 'line one\nline two\r\n' })}\n\n`,
    );
  });

  it('passes Last-Event-ID on as lastEventId, and sends a keep-alive comment while quiet', async () => {
    const { sse } = await stream('agent/s2', { 'last-event-id': '0190f7e2-0000-7000-8000-000000000001:7' });
    expect(live.last().opts.lastEventId).toBe('0190f7e2-0000-7000-8000-000000000001:7');
    expect(await sse.next(KEEPALIVE_MS * 20)).toEqual({ comment: 'keepalive' });
    expect(await sse.next(KEEPALIVE_MS * 20)).toEqual({ comment: 'keepalive' });
    const bad = await answer(
      await api.call('/v1/actors/agent/s2/stream', { headers: { 'last-event-id': 'x'.repeat(201) }, token: reader }),
    );
    expect(bad).toEqual({ status: 400, body: failure('invalid_argument', /^invalid header last-event-id .*at most 200 characters$/) });
  });

  it('ends after an error event, and when the watch ends', async () => {
    const { sse } = await stream('agent/s3');
    const watch = live.last();
    watch.push({ id: 'ev-9', type: 'error', data: { code: 'overflow', message: 'the reader fell too far behind' } });
    expect(await sse.event()).toEqual({
      id: 'ev-9',
      event: 'error',
      data: JSON.stringify({ code: 'overflow', message: 'the reader fell too far behind' }),
    });
    expect(await sse.event()).toBeUndefined();
    expect(watch.closed).toBe(true);

    const second = await stream('agent/s3');
    live.last().finish();
    expect(await second.sse.event()).toBeUndefined();
  });

  it('a watch that cannot start is an ordinary JSON error', async () => {
    live.failNext = new CorralError('invalid_argument', 'lastEventId: not an id this stream gave');
    expect(await answer(await api.call('/v1/actors/agent/s4/stream', { token: reader }))).toEqual({
      status: 400,
      body: failure('invalid_argument', 'lastEventId: not an id this stream gave'),
    });
    live.failNext = new Error('cannot connect to 10.0.0.7');
    expect(await answer(await api.call('/v1/actors/agent/s4/stream', { token: reader }))).toEqual({
      status: 500,
      body: { error: { code: 'internal', message: 'internal error' } },
    });
    expect(api.server.streams).toBe(0);
  });

  it('the client going away aborts the watch', async () => {
    const ac = new AbortController();
    const res = await api.call('/v1/actors/agent/s5/stream', { token: reader, signal: ac.signal });
    expect(res.status).toBe(200);
    const watch = live.last();
    expect(api.server.streams).toBe(1);
    ac.abort();
    await waitFor(() => watch.opts.signal?.aborted && watch.closed, { what: 'the watch aborted' });
    await waitFor(() => api.server.streams === 0, { what: 'the stream released' });
  });

  it('a revoked token ends the streams it opened within a keep-alive interval', async () => {
    const doomed = await api.token('doomed', ['read']);
    const { sse } = await stream('agent/s6', {}, doomed);
    const other = await stream('agent/s6');
    await revokeToken(api.database.db, 'doomed');
    const started = Date.now();
    for (;;) {
      const m = await sse.next(KEEPALIVE_MS * 20);
      if (!m) break;
      expect(m.comment).toBe('keepalive');
    }
    expect(Date.now() - started).toBeLessThan(KEEPALIVE_MS * 20);
    expect(live.watches.at(-2)!.closed).toBe(true);
    // the other token's stream goes on
    expect(await other.sse.next(KEEPALIVE_MS * 20)).toEqual({ comment: 'keepalive' });
    expect(live.last().closed).toBe(false);
  });
});

describe('the bounds', () => {
  it('429 too_many_streams past the limit per actor, then past the server’s; a slot freed is taken again', async () => {
    const a = [await stream('busy/one'), await stream('busy/one')];
    expect(a.map((x) => x.res.status)).toEqual([200, 200]);
    const third = await api.call('/v1/actors/busy/one/stream', { token: reader });
    expect(await answer(third)).toEqual({
      status: 429,
      body: failure('too_many_streams', 'actor busy/one has 2 streams open, the limit per actor (CORRAL_HTTP_MAX_STREAMS_PER_ACTOR)'),
    });
    expect(third.headers.get('retry-after')).toBe('5');
    const b = [await stream('busy/two'), await stream('busy/three')];
    expect(b.map((x) => x.res.status)).toEqual([200, 200]);
    expect(api.server.streams).toBe(4);
    expect(await answer(await api.call('/v1/actors/busy/four/stream', { token: reader }))).toEqual({
      status: 429,
      body: failure('too_many_streams', 'the server has 4 streams open, its limit (CORRAL_HTTP_MAX_STREAMS)'),
    });
    await a[0]!.sse.cancel();
    await waitFor(() => api.server.streams === 3, { what: 'a stream released' });
    expect((await stream('busy/one')).res.status).toBe(200);
  });

  it('a client that does not read is dropped once its socket holds more than the bound', async () => {
    const socket = connectTcp(api.server.port, '127.0.0.1');
    await new Promise<void>((resolve, reject) => socket.once('connect', resolve).once('error', reject));
    let received = 0;
    let holding = true;
    let tail = '';
    socket.on('data', (d: Buffer) => {
      received += d.length;
      tail = (tail + d.toString('latin1')).slice(-5);
      // read the headers, then nothing more: TCP's windows fill, then the server's buffer
      if (holding) socket.pause();
    });
    const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
    socket.write(`GET /v1/actors/slow/reader/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${reader}\r\n\r\n`);
    const watch = await waitFor(() => live.watches.find((w) => w.actor.agentUid === 'slow'), { what: 'the slow stream started' });
    watch.startFlood(8 * 1024);
    await waitFor(() => watch.closed, { what: 'the slow client dropped', timeoutMs: 30_000 });
    expect(watch.opts.signal?.aborted).toBe(true);
    await waitFor(() => api.server.streams === 0, { what: 'its slot released' });
    // what was made for it is what the sockets held (the kernel's buffers, a few MiB on loopback)
    // plus the bound, and nothing is made after the drop
    const taken = watch.taken;
    expect(taken * 8 * 1024).toBeLessThan(32 * 1024 * 1024);
    await new Promise((r) => setTimeout(r, 200));
    expect(watch.taken).toBe(taken);
    holding = false;
    socket.resume();
    await closed;
    // cut, not ended: the last bytes are a chunk's, not the chunked body's end
    expect(tail).not.toBe('0\r\n\r\n');
    expect(received).toBeGreaterThan(BUFFER_BYTES);
    expect(received).toBeLessThan(taken * (8 * 1024 + 200));
  });

  it('closing the server while a watch starts answers 503 shutdown, not a stream', async () => {
    const other = await startApi(tdb.url, { live, keepAliveMs: KEEPALIVE_MS });
    let open!: () => void;
    live.gate = new Promise<void>((r) => (open = r));
    try {
      const pending = other.call('/v1/actors/agent/starting/stream', { token: reader });
      await waitFor(() => live.starting === 1, { what: 'the watch starting' });
      const stopping = other.stop();
      open();
      const res = await pending;
      expect(await answer(res)).toEqual({
        status: 503,
        body: { error: { code: 'shutdown', message: 'the server is shutting down' } },
      });
      await stopping;
      expect(live.last().closed).toBe(true);
    } finally {
      live.gate = undefined;
      open();
    }
  });

  it('closing the server ends its streams', async () => {
    const other = await startApi(tdb.url, { live, keepAliveMs: KEEPALIVE_MS });
    const token = reader;
    const res = await other.call('/v1/actors/agent/closing/stream', { token });
    const sse = new SseReader(res);
    const watch = live.last();
    await other.stop();
    expect(await sse.event()).toBeUndefined();
    expect(watch.closed).toBe(true);
    expect(other.server.streams).toBe(0);
  });
});
