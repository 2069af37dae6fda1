import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  DAEMON_MESSAGE_TYPES,
  WORKER_MESSAGE_TYPES,
  daemonMessageSchema,
  encodeFrame,
  frameBytesAbove,
  isJsonValue,
  MAX_FRAME_DEPTH,
  withRawField,
  parseDaemonMessage,
  parseWorkerMessage,
  type DaemonMessage,
  type WorkerMessage,
} from '../../src/fabric/protocol.ts';
import { MAX_JSON_DEPTH, TOO_DEEP, unstorableReason } from '../../src/base/json-safety.ts';
import { makeTurnRef, makeTurnStart } from './helpers.ts';

const ref = makeTurnRef({ actor_epoch: 3, revision: 2 });
const buf = (o: unknown): Buffer => Buffer.from(JSON.stringify(o));

const validWorker: WorkerMessage[] = [
  { v: 1, type: 'worker_ready', worker_id: 'w-1', capacity: 4 },
  { v: 1, type: 'worker_ready', worker_id: 'host:a.b_c-9', capacity: 1024, sdk: 'x/1', auth: { scheme: 'token', credential: 's' } },
  { v: 1, type: 'worker_ready', worker_id: 'w-1', capacity: 1, auth: { scheme: 'key', credential: 's' } },
  {
    v: 1,
    type: 'worker_ready',
    worker_id: 'w-1',
    capacity: 1,
    auth: { scheme: 'key', credential: 's', nonce: 'A'.repeat(43), proof: 'Nx176iIb1F4YfY5UyNc0-1M4wkQrLT8h2Mw9TbhCtWM' },
  },
  { v: 1, type: 'worker_heartbeat', worker_id: 'w-1', in_flight: 0 },
  { v: 1, type: 'turn_accepted', turn_ref: ref },
  { v: 1, type: 'turn_progress', turn_ref: ref },
  { v: 1, type: 'turn_progress', turn_ref: ref, note: 'thinking' },
  { v: 1, type: 'turn_chunk', turn_ref: ref, seq: 1, data: { delta: 'Hel' } },
  { v: 1, type: 'turn_chunk', turn_ref: ref, seq: 2_147_483_647, data: null },
  { v: 1, type: 'turn_result', turn_ref: ref, messages: [] },
  {
    v: 1,
    type: 'turn_result',
    turn_ref: ref,
    messages: [
      { role: 'assistant', content: { text: 'hi', n: [1, null, true] } },
      { role: 'tool', content: 'plain string' },
    ],
    output: { done: true },
  },
  { v: 1, type: 'turn_error', turn_ref: ref, error: { code: 'boom', message: 'it broke', retryable: false } },
  {
    v: 1,
    type: 'turn_result',
    turn_ref: ref,
    messages: [],
    emit: [
      { actor: 'a/b', data: { x: 1 } },
      { actor: 'a/c', data: null, delay_ms: 1000 },
    ],
  },
  { v: 1, type: 'rpc_request', id: 'r-1', method: 'history.read', params: { before_seq: 10, limit: 5 }, turn_ref: ref },
  { v: 1, type: 'rpc_request', id: 'r-2', method: 'actor.status', turn_ref: ref },
];

describe('parseWorkerMessage', () => {
  it('accepts every valid worker message type', () => {
    for (const msg of validWorker) {
      const r = parseWorkerMessage(Buffer.from(encodeFrame(msg)));
      expect(r, JSON.stringify(msg)).toEqual({ ok: true, msg });
    }
    expect(new Set(validWorker.map((m) => m.type))).toEqual(new Set(WORKER_MESSAGE_TYPES));
  });

  it('ignores unknown fields but keeps unknown turn_ref fields (echoed verbatim)', () => {
    const r = parseWorkerMessage(buf({ v: 1, type: 'turn_accepted', future: 1, turn_ref: { ...ref, shard: 7 } }));
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(r.msg).not.toHaveProperty('future');
    expect(r.msg.type === 'turn_accepted' && r.msg.turn_ref).toEqual({ ...ref, shard: 7 });
  });

  const invalid: Array<[string, Buffer, string]> = [
    ['non-UTF-8 bytes', Buffer.from([0xff, 0xfe, 0x00, 0x80]), 'invalid_message'],
    ['not JSON', Buffer.from('{"v":1,'), 'invalid_message'],
    ['empty frame', Buffer.alloc(0), 'invalid_message'],
    ['JSON array', buf([1, 2]), 'invalid_message'],
    ['JSON null', buf(null), 'invalid_message'],
    ['missing v', buf({ type: 'worker_heartbeat', worker_id: 'w', in_flight: 0 }), 'invalid_message'],
    ['string v', buf({ v: '1', type: 'worker_heartbeat', worker_id: 'w', in_flight: 0 }), 'invalid_message'],
    ['v 2', buf({ v: 2, type: 'worker_heartbeat', worker_id: 'w', in_flight: 0 }), 'unsupported_version'],
    ['missing type', buf({ v: 1 }), 'invalid_message'],
    ['unknown type', buf({ v: 1, type: 'worker_dance' }), 'unknown_type'],
    ['daemon type from a worker', buf({ v: 1, type: 'turn_committed', turn_ref: ref }), 'unknown_type'],
    ['chunk seq 0', buf({ v: 1, type: 'turn_chunk', turn_ref: ref, seq: 0, data: 1 }), 'invalid_message'],
    ['chunk seq 1.5', buf({ v: 1, type: 'turn_chunk', turn_ref: ref, seq: 1.5, data: 1 }), 'invalid_message'],
    ['chunk without data', buf({ v: 1, type: 'turn_chunk', turn_ref: ref, seq: 1 }), 'invalid_message'],
    ['chunk without turn_ref', buf({ v: 1, type: 'turn_chunk', seq: 1, data: 1 }), 'invalid_message'],
    ['capacity 0', buf({ v: 1, type: 'worker_ready', worker_id: 'w', capacity: 0 }), 'invalid_message'],
    ['capacity 1025', buf({ v: 1, type: 'worker_ready', worker_id: 'w', capacity: 1025 }), 'invalid_message'],
    ['capacity 1.5', buf({ v: 1, type: 'worker_ready', worker_id: 'w', capacity: 1.5 }), 'invalid_message'],
    ['worker id with space', buf({ v: 1, type: 'worker_ready', worker_id: 'a b', capacity: 1 }), 'invalid_message'],
    ['worker id of 65 chars', buf({ v: 1, type: 'worker_ready', worker_id: 'a'.repeat(65), capacity: 1 }), 'invalid_message'],
    ['empty worker id', buf({ v: 1, type: 'worker_ready', worker_id: '', capacity: 1 }), 'invalid_message'],
    ['negative in_flight', buf({ v: 1, type: 'worker_heartbeat', worker_id: 'w', in_flight: -1 }), 'invalid_message'],
    ['missing turn_ref', buf({ v: 1, type: 'turn_accepted' }), 'invalid_message'],
    ['turn_ref epoch 0', buf({ v: 1, type: 'turn_accepted', turn_ref: { ...ref, actor_epoch: 0 } }), 'invalid_message'],
    ['turn_ref revision -1', buf({ v: 1, type: 'turn_accepted', turn_ref: { ...ref, revision: -1 } }), 'invalid_message'],
    ['turn_ref bad uuid', buf({ v: 1, type: 'turn_accepted', turn_ref: { ...ref, delivery_id: 'nope' } }), 'invalid_message'],
    ['turn_ref missing field', buf({ v: 1, type: 'turn_accepted', turn_ref: { ...ref, event_id: undefined } }), 'invalid_message'],
    ['result role user', buf({ v: 1, type: 'turn_result', turn_ref: ref, messages: [{ role: 'user', content: 'x' }] }), 'invalid_message'],
    ['result without messages', buf({ v: 1, type: 'turn_result', turn_ref: ref }), 'invalid_message'],
    [
      'result with 1001 messages',
      buf({ v: 1, type: 'turn_result', turn_ref: ref, messages: Array.from({ length: 1001 }, () => ({ role: 'tool', content: 1 })) }),
      'invalid_message',
    ],
    ...(
      [
        ['nonce of 42 chars', { nonce: 'A'.repeat(42) }],
        ['nonce of 44 chars', { nonce: 'A'.repeat(44) }],
        ['nonce with padding', { nonce: `${'A'.repeat(42)}=` }],
        ['proof with + (not base64url)', { proof: `${'A'.repeat(42)}+` }],
        ['proof not a string', { proof: 7 }],
      ] as const
    ).map(([name, auth]): [string, Buffer, string] => [
      name,
      buf({ v: 1, type: 'worker_ready', worker_id: 'w', capacity: 1, auth: { scheme: 'key', credential: 's', ...auth } }),
      'invalid_message',
    ]),
    ['error without retryable', buf({ v: 1, type: 'turn_error', turn_ref: ref, error: { code: 'x', message: 'y' } }), 'invalid_message'],
  ];
  it.each(invalid)('refuses %s', (_name, frame, code) => {
    const r = parseWorkerMessage(frame);
    expect(r.ok).toBe(false);
    if (!r.ok) {
      expect(r.code).toBe(code);
      expect(r.error.length).toBeGreaterThan(0);
    }
  });

  it('accepts exactly 1000 result messages', () => {
    const messages = Array.from({ length: 1000 }, () => ({ role: 'tool' as const, content: 1 }));
    expect(parseWorkerMessage(buf({ v: 1, type: 'turn_result', turn_ref: ref, messages })).ok).toBe(true);
  });

  it('never throws on arbitrary bytes', () => {
    for (let i = 0; i < 2000; i++) {
      const r = parseWorkerMessage(randomBytes(i % 64));
      expect(r.ok).toBe(false);
    }
    // Deeply nested JSON must not escape as a RangeError either.
    const deep = Buffer.from('{"v":1,"type":"turn_result","output":' + '['.repeat(50_000) + ']'.repeat(50_000) + '}');
    expect(parseWorkerMessage(deep).ok).toBe(false);
  });

  it('does not let __proto__ keys change an object prototype', () => {
    const r = parseWorkerMessage(
      Buffer.from(`{"v":1,"type":"turn_accepted","turn_ref":${JSON.stringify(ref).slice(0, -1)},"__proto__":{"polluted":1}}}`),
    );
    expect(r.ok).toBe(true);
    if (r.ok && r.msg.type === 'turn_accepted') expect(Object.getPrototypeOf(r.msg.turn_ref)).toBe(Object.prototype);
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
  });
});

describe('daemon messages', () => {
  const validDaemon: DaemonMessage[] = [
    { v: 1, type: 'worker_welcome', worker_id: 'w-1', heartbeat_interval_ms: 2000, progress_interval_ms: 10000 },
    {
      v: 1,
      type: 'worker_welcome',
      worker_id: 'w-1',
      capacity: 4,
      heartbeat_interval_ms: 2000,
      progress_interval_ms: 10000,
      lease_ms: 60000,
      stale_ms: 10000,
      retry: { limit: 5, delay_s: 5, delay_max_s: 120, backoff: true },
      stream_chunk_bytes: 65536,
      stream_turn_bytes: 8388608,
    },
    { v: 1, type: 'turn_stream_closed', turn_ref: ref, reason: 'turn_limit', limit_bytes: 8388608 },
    {
      ...makeTurnStart({ text: 'hi' }, ref),
      context: {
        conversation_id: '0197a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a70',
        messages: [{ seq: 1, role: 'user', content: { text: 'hello' } }],
        first_seq: 1,
        has_more: false,
        current_seq: 2,
      },
    },
    { v: 1, type: 'turn_failed', turn_ref: ref, retry: true, dead_lettered: false },
    { v: 1, type: 'turn_failed', turn_ref: ref, retry: true, dead_lettered: false, handed_back: true },
    { v: 1, type: 'rpc_response', id: 'r-1', result: { messages: [], has_more: false, total: 0 } },
    { v: 1, type: 'rpc_response', id: 'r-2', error: { code: 'not_live', message: 'no live turn' } },
    makeTurnStart({ text: 'hi' }, ref),
    { v: 1, type: 'turn_steer', turn_ref: { ...ref, revision: 3 }, input: { text: 'more' } },
    { v: 1, type: 'turn_cancel', turn_ref: ref, reason: 'operator' },
    { v: 1, type: 'turn_committed', turn_ref: ref },
    { v: 1, type: 'turn_rejected', turn_ref: ref, reason: 'stale_epoch' },
    { v: 1, type: 'turn_rejected', turn_ref: ref, reason: 'lease_expired', detail: 'expired 3 s ago' },
    { v: 1, type: 'error', code: 'not_registered', message: 'send worker_ready first' },
    { v: 1, type: 'error', code: 'rate_limited', message: 'too many registrations of this key' },
    { v: 1, type: 'worker_challenge', worker_id: 'w-1', nonce: 'AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8' },
  ];

  it('round-trips every daemon message type', () => {
    for (const msg of validDaemon) {
      expect(parseDaemonMessage(Buffer.from(encodeFrame(msg)))).toEqual({ ok: true, msg });
      expect(daemonMessageSchema.safeParse(msg).success).toBe(true);
    }
    expect(new Set(validDaemon.map((m) => m.type))).toEqual(new Set(DAEMON_MESSAGE_TYPES));
  });

  it('accepts ISO times with Z or an offset, refuses local times', () => {
    const start = makeTurnStart({}, ref);
    expect(parseDaemonMessage(buf({ ...start, lease_expires_at: '2026-01-01T00:00:00.000+02:00' })).ok).toBe(true);
    expect(parseDaemonMessage(buf({ ...start, lease_expires_at: '2026-01-01T00:00:00' })).ok).toBe(false);
  });

  it('refuses a turn_stream_closed without its budget, with a budget below 1, or a reason over 64 characters', () => {
    const closed = { v: 1, type: 'turn_stream_closed', turn_ref: ref, reason: 'turn_limit', limit_bytes: 1024 };
    expect(parseDaemonMessage(buf(closed)).ok).toBe(true);
    for (const limit_bytes of [undefined, 0, 1.5, '1024']) expect(parseDaemonMessage(buf({ ...closed, limit_bytes })).ok).toBe(false);
    for (const reason of ['', 'r'.repeat(65), undefined]) expect(parseDaemonMessage(buf({ ...closed, reason })).ok).toBe(false);
    expect(parseDaemonMessage(buf({ ...closed, turn_ref: undefined })).ok).toBe(false);
  });

  it("refuses a welcome's capacity outside 1..1024", () => {
    const welcome = { v: 1, type: 'worker_welcome', worker_id: 'w-1', heartbeat_interval_ms: 2000, progress_interval_ms: 10000 };
    for (const capacity of [0, 1025, 1.5, '2']) expect(parseDaemonMessage(buf({ ...welcome, capacity })).ok).toBe(false);
  });

  it('refuses a challenge whose nonce is not 43 characters of base64url, or without its worker id', () => {
    const challenge = { v: 1, type: 'worker_challenge', worker_id: 'w-1', nonce: 'A'.repeat(43) };
    for (const nonce of ['A'.repeat(42), 'A'.repeat(44), `${'A'.repeat(42)}/`, 43]) {
      expect(parseDaemonMessage(buf({ ...challenge, nonce })).ok).toBe(false);
    }
    expect(parseDaemonMessage(buf({ ...challenge, worker_id: undefined })).ok).toBe(false);
  });

  it("takes a batch turn_start's events (2–100, in order, event first) and refuses other shapes", () => {
    const start = makeTurnStart({ text: 'a' }, ref) as Record<string, unknown> & { event: { id: string; enqueued_at: string } };
    const ev = (i: number) => ({ id: `e${i}`, data: { text: `t${i}` }, enqueued_at: start.event.enqueued_at });
    const events = [start.event, ev(1), ev(2)];
    const parsed = parseDaemonMessage(buf({ ...start, events }));
    expect(parsed.ok && parsed.msg.type === 'turn_start' && parsed.msg.events?.map((e) => e.id)).toEqual([start.event.id, 'e1', 'e2']);
    for (const [what, bad] of [
      ['one event is no batch', [start.event]],
      ['more than 100', Array.from({ length: 101 }, (_, i) => ev(i))],
      ['an event without its id', [start.event, { data: 1, enqueued_at: start.event.enqueued_at }]],
      ['not a list', { 0: start.event }],
    ] as const) {
      expect(parseDaemonMessage(buf({ ...start, events: bad })), what).toMatchObject({ ok: false, code: 'invalid_message' });
    }
  });

  it('reports unknown daemon types as unknown_type (workers skip them)', () => {
    const r = parseDaemonMessage(buf({ v: 1, type: 'turn_pause', turn_ref: ref }));
    expect(r).toMatchObject({ ok: false, code: 'unknown_type' });
  });
});

describe('frames', () => {
  it('encodes a frame with a raw field spliced in, which a worker parses as a valid message', () => {
    const conversationId = '0190a5e2-0000-7000-8000-000000000001';
    const context = `{"conversation_id":"${conversationId}","messages":[],"has_more":false,"current_seq":1}`;
    const msg = withRawField(makeTurnStart({ text: 'é' }, ref), 'context', context);
    const text = encodeFrame(msg);
    expect(JSON.parse(text)).toMatchObject({
      type: 'turn_start',
      event: { data: { text: 'é' } },
      context: { conversation_id: conversationId, messages: [] },
    });
    expect(parseDaemonMessage(Buffer.from(text, 'utf8'))).toMatchObject({
      ok: true,
      msg: { type: 'turn_start', context: { messages: [] } },
    });
  });

  it('reports a frame over the limit by its UTF-8 size', () => {
    expect(frameBytesAbove('a'.repeat(100), 300)).toBeUndefined(); // too short to need measuring
    expect(frameBytesAbove('a'.repeat(200), 150)).toBe(200);
    expect(frameBytesAbove('€'.repeat(100), 300)).toBeUndefined(); // exactly 300 bytes
    expect(frameBytesAbove('€'.repeat(101), 300)).toBe(303);
    expect(frameBytesAbove('😀'.repeat(50), 199)).toBe(200); // two code units, four bytes
  });
});

describe('nesting depth of worker frames', () => {
  const deep = (n: number, inner = '0') => '['.repeat(n) + inner + ']'.repeat(n);
  const frame = (type: string, body: string) => Buffer.from(`{"v":1,"type":"${type}","turn_ref":${JSON.stringify(ref)},${body}}`);

  it('cuts a result value that opens deeper than MAX_FRAME_DEPTH to TOO_DEEP, keeping the rest', () => {
    expect(MAX_FRAME_DEPTH).toBe(MAX_JSON_DEPTH + 3);
    // content at frame depth 3: 100 levels fit, 101 are cut at the 101st (a string with a bracket inside stays)
    const fits = parseWorkerMessage(frame('turn_result', `"messages":[{"role":"assistant","content":${deep(100, '"]]["')}}]`));
    expect(fits.ok && fits.msg.type === 'turn_result' && JSON.stringify(fits.msg.messages[0]!.content)).toBe(
      deep(100, JSON.stringify(']][')),
    );
    const cut = parseWorkerMessage(frame('turn_result', `"messages":[{"role":"assistant","content":${deep(1_000_000)}}],"output":1`));
    expect(cut.ok).toBe(true);
    if (!cut.ok || cut.msg.type !== 'turn_result') return;
    expect(JSON.stringify(cut.msg.messages[0]!.content)).toBe(deep(100, JSON.stringify(TOO_DEEP)));
    expect(cut.msg.output).toBe(1);
    expect(unstorableReason(cut.msg.messages[0]!.content)).toMatch(/nested deeper than 100 levels/);
  });

  it('refuses any other message nested that deep as invalid_message, and cuts rpc params', () => {
    const progress = parseWorkerMessage(Buffer.from(`{"v":1,"type":"turn_progress","turn_ref":${JSON.stringify(ref)},"x":${deep(200)}}`));
    expect(progress).toMatchObject({ ok: false, code: 'invalid_message', error: expect.stringMatching(/nested deeper than 103/) });
    const error = parseWorkerMessage(frame('turn_error', `"error":{"code":"c","message":"m","retryable":true,"details":${deep(10_000)}}`));
    expect(error).toMatchObject({ ok: false, code: 'invalid_message' });
    const rpc = parseWorkerMessage(frame('rpc_request', `"id":"r","method":"actor.status","params":${deep(10_000)}`));
    expect(rpc.ok && rpc.msg.type === 'rpc_request' && unstorableReason(rpc.msg.params)).toMatch(/nested deeper/);
    // unbalanced or garbage inside a cut subtree still fails as JSON when the frame cannot close
    expect(parseWorkerMessage(Buffer.from(`{"v":1,"type":"turn_result","x":${'['.repeat(500)}`))).toMatchObject({ ok: false });
  });
});

describe('turn_rejected reasons', () => {
  it('are the fence reasons plus unstorable, emit_limit, emit_denied, deliver_limit, deliver_forbidden and commit_failed, and docs/protocol.md lists exactly them', async () => {
    const { readFile } = await import('node:fs/promises');
    const { FENCE_REASONS } = await import('../../src/base/errors.ts');
    const { TURN_REJECTED_REASONS } = await import('../../src/fabric/protocol.ts');
    expect([...TURN_REJECTED_REASONS]).toEqual([
      ...FENCE_REASONS,
      'unstorable',
      'emit_limit',
      'emit_denied',
      'deliver_limit',
      'deliver_forbidden',
      'commit_failed',
    ]);
    const doc = await readFile(new URL('../../docs/protocol.md', import.meta.url), 'utf8');
    const table = doc.slice(doc.indexOf('| reason | meaning | what the worker should do |'));
    const rows = table.split('\n').slice(2);
    const documented = rows
      .slice(
        0,
        rows.findIndex((l) => !l.startsWith('|')),
      )
      .map((l) => /^\| `([a-z_]+)` \|/.exec(l)?.[1]);
    expect(documented.sort()).toEqual([...TURN_REJECTED_REASONS].sort());
  });
});

describe('protocol error codes', () => {
  it('are the ones docs/protocol.md §10 lists', async () => {
    const { readFile } = await import('node:fs/promises');
    const { PROTOCOL_ERROR_CODES } = await import('../../src/fabric/protocol.ts');
    const doc = await readFile(new URL('../../docs/protocol.md', import.meta.url), 'utf8');
    const rows = doc.slice(doc.indexOf('| code | cause |')).split('\n').slice(2);
    const documented = rows
      .slice(
        0,
        rows.findIndex((l) => !l.startsWith('|')),
      )
      .map((l) => /^\| `([a-z_]+)` \|/.exec(l)?.[1]);
    expect(documented.sort()).toEqual([...PROTOCOL_ERROR_CODES].sort());
  });
});

describe('isJsonValue', () => {
  it('accepts what JSON.parse returns and refuses what JSON cannot carry', () => {
    expect(isJsonValue(JSON.parse('{"a":[1,"x",null,true,{"b":[[]]}],"c":-0.5}'))).toBe(true);
    expect(isJsonValue(Object.create(null) as object)).toBe(true);
    for (const bad of [undefined, () => 1, new Date(0), NaN, Infinity, 1n, Symbol('s'), { a: [1, undefined] }, [{ d: new Map() }]]) {
      expect(isJsonValue(bad)).toBe(false);
    }
  });
});
