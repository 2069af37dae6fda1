/**
 * The outbox's pure parts: what becomes of a message after an answer (S2 of outbox-sender.ts),
 * the retry delays and Retry-After, the checks of a result's `deliver` (X1) and the derived
 * webhook-id (X2).
 */
import { describe, expect, it } from 'vitest';
import { checkDeliveries, outboxRowsOf, webhookIdOf } from '../../src/effects/deliver.ts';
import { decideOutbox, outboxRetryDelayMs, parseRetryAfter, type AttemptResult } from '../../src/outbox/sender.ts';

const policy = { limit: 3, delayS: 5, maxS: 120 };
const ctx = { sink: 's', nowMs: Date.parse('2026-12-02T00:00:00Z'), random: () => 0.5 };
const answer = (status: number, retryAfter: string | null = null): AttemptResult => ({ status, retryAfter, text: '' });

describe('decideOutbox', () => {
  it('delivers on any 2xx', () => {
    for (const s of [200, 201, 202, 204, 299]) expect(decideOutbox(answer(s), 1, policy, ctx)).toEqual({ kind: 'delivered', status: s });
  });

  it('410 dead-letters and disables the sink, whatever the attempt', () => {
    expect(decideOutbox(answer(410), 1, policy, ctx)).toMatchObject({ kind: 'dead', status: 410, disableSink: 's' });
  });

  it('retries 408, 425, 429, 5xx, a timeout and a connection error, until the limit', () => {
    for (const r of [answer(408), answer(425), answer(429), answer(500), answer(503), { status: null, error: 'ECONNREFUSED' } as const]) {
      expect(decideOutbox(r, 1, policy, ctx).kind).toBe('retry');
      expect(decideOutbox(r, 3, policy, ctx).kind).toBe('retry');
      const last = decideOutbox(r, 4, policy, ctx);
      expect(last.kind).toBe('dead');
      expect(last).toMatchObject({ error: expect.stringMatching(/^gave up after 4 attempts/) });
      expect(last).not.toHaveProperty('disableSink');
    }
  });

  it('dead-letters at once what the receiver refused (another 4xx, a 3xx not followed)', () => {
    for (const s of [301, 400, 401, 403, 404, 413, 422]) {
      const d = decideOutbox(answer(s), 1, policy, ctx);
      expect(d).toMatchObject({ kind: 'dead', status: s, error: expect.stringMatching(/^refused by the receiver: HTTP/) });
    }
  });
});

describe('retry delays', () => {
  it('lie in the events’ window for retry n, capped at the maximum', () => {
    for (let n = 1; n <= 10; n++) {
      const low = Math.min(120_000, 5_000 * 2 ** (n - 1));
      const high = Math.min(120_000, 5_000 * 2 ** n);
      expect(outboxRetryDelayMs(n, policy, null, () => 0)).toBe(low);
      expect(outboxRetryDelayMs(n, policy, null, () => 1)).toBe(high);
    }
  });

  it('follow Retry-After within the bounds (5–120 s)', () => {
    expect(outboxRetryDelayMs(1, policy, 30_000)).toBe(30_000);
    expect(outboxRetryDelayMs(1, policy, 1_000)).toBe(5_000);
    expect(outboxRetryDelayMs(1, policy, 3_600_000)).toBe(120_000);
    expect(decideOutbox(answer(429, '60'), 1, policy, ctx)).toMatchObject({ kind: 'retry', delayMs: 60_000 });
  });

  it('read Retry-After as seconds or an HTTP date; anything else is ignored', () => {
    expect(parseRetryAfter('7', ctx.nowMs)).toBe(7_000);
    expect(parseRetryAfter(' 12 ', ctx.nowMs)).toBe(12_000);
    expect(parseRetryAfter('Wed, 02 Dec 2026 00:00:30 GMT', ctx.nowMs)).toBe(30_000);
    expect(parseRetryAfter('Tue, 01 Dec 2026 00:00:00 GMT', ctx.nowMs)).toBe(0);
    expect(parseRetryAfter('soon', ctx.nowMs)).toBeNull();
    expect(parseRetryAfter('-5', ctx.nowMs)).toBeNull();
    expect(parseRetryAfter(null, ctx.nowMs)).toBeNull();
  });
});

describe("a result's deliver", () => {
  it('is serialized once, the bytes that will be signed and sent', () => {
    const r = checkDeliveries(
      [
        { sink: 'a', body: { x: [1, 'é'] } },
        { sink: 'b', body: null, key: 'k-1' },
      ],
      1024,
    );
    expect(r).toEqual({
      ok: true,
      deliveries: [
        { sink: 'a', body: '{"x":[1,"é"]}' },
        { sink: 'b', body: 'null', key: 'k-1' },
      ],
    });
    expect(checkDeliveries(undefined, 10)).toEqual({ ok: true, deliveries: [] });
  });

  it('refuses what breaks the limits, saying which', () => {
    const refuse = (raw: unknown[], max = 1024) => {
      const r = checkDeliveries(raw, max);
      return r.ok ? '' : r.detail;
    };
    expect(refuse(Array.from({ length: 17 }, () => ({ sink: 'a', body: 1 })))).toMatch(/17 deliveries; at most 16/);
    expect(refuse([{ sink: 'a b', body: 1 }])).toMatch(/^deliver\[0\]: sink/);
    expect(refuse([{ body: 1 }])).toMatch(/^deliver\[0\]: sink/);
    expect(refuse([{ sink: 'a', body: 1, key: '' }])).toMatch(/^deliver\[0\]: key/);
    expect(refuse([{ sink: 'a', body: 1, key: 'x'.repeat(257) }])).toMatch(/^deliver\[0\]: key/);
    expect(refuse([{ sink: 'a', body: 1, key: 'é' }])).toMatch(/^deliver\[0\]: key/);
    expect(refuse([{ sink: 'a', body: 'x'.repeat(2000) }])).toMatch(/deliver\[0\]\.body: 2002 bytes; at most 1024/);
    let deep: unknown = 1;
    for (let d = 0; d < 101; d++) deep = [deep];
    expect(
      refuse([
        { sink: 'a', body: 1 },
        { sink: 'a', body: deep },
      ]),
    ).toMatch(/^\$\.deliver\[1\]\.body/);
    expect(
      refuse([
        { sink: 'a', body: 1, key: 'k' },
        { sink: 'a', body: 2, key: 'k' },
      ]),
    ).toMatch(/used twice for sink a/);
    // the same key for two sinks is two messages
    expect(
      refuse([
        { sink: 'a', body: 1, key: 'k' },
        { sink: 'b', body: 2, key: 'k' },
      ]),
    ).toBe('');
  });

  it('gets a webhook-id of its actor and its key, or of its actor, event and place', () => {
    const fence = {
      agentUid: 'ag',
      sessionId: 's',
      activationUid: '00000000-0000-0000-0000-000000000001',
      actorEpoch: 1,
      eventId: '01a2357b-3e40-7274-8002-4f12e711c2e1',
      revision: 0,
      deliveryId: '00000000-0000-0000-0000-000000000002',
    };
    const rows = outboxRowsOf(fence, [
      { sink: 'a', body: '1' },
      { sink: 'a', body: '2', key: 'mine' },
      { sink: 'b', body: '3' },
    ]);
    expect(rows.map((r) => [r.sink, r.webhookId, r.key, r.position])).toEqual([
      ['a', 'ag/s/01a2357b-3e40-7274-8002-4f12e711c2e1.0', null, 0],
      ['a', 'ag/s/mine', 'mine', 1],
      ['b', 'ag/s/01a2357b-3e40-7274-8002-4f12e711c2e1.2', null, 2],
    ]);
    expect(webhookIdOf(fence, fence.eventId, 2)).toBe(rows[2]!.webhookId);
    // the same key from another actor is another id (dedupe per actor), and the id names the actor
    expect(outboxRowsOf({ ...fence, agentUid: 'other' }, [{ sink: 'a', body: '2', key: 'mine' }])[0]!.webhookId).toBe('other/s/mine');
    expect(outboxRowsOf({ ...fence, sessionId: 's2' }, [{ sink: 'a', body: '2', key: 'mine' }])[0]!.webhookId).toBe('ag/s2/mine');
  });
});
