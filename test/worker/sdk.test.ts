import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { StaticTokenAuthenticator } from '../../src/fabric/auth.ts';
import { Broker, type BrokerEvent, type BrokerOptions } from '../../src/fabric/broker.ts';
import type { DaemonMessage, TurnRef } from '../../src/fabric/protocol.ts';
import { silentLogger } from '../../src/base/logger.ts';
import { createExampleHandler, runExampleWorker } from '../../src/worker/example.ts';
import { createWorker, type TurnHandler, type Worker, type WorkerOptions } from '../../src/worker/sdk.ts';
import { makeTurnRef, makeTurnStart, waitFor } from '../fabric/helpers.ts';
import { startCurveBroker } from '../security/curve-broker.ts';
import { Capture } from '../helpers/capture.ts';

const cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

interface Harness {
  broker: Broker;
  events: BrokerEvent[];
  of<K extends BrokerEvent['kind']>(kind: K, deliveryId?: string): Extract<BrokerEvent, { kind: K }>[];
}

async function startBroker(
  endpoint = 'tcp://127.0.0.1:0',
  events: BrokerEvent[] = [],
  over: Partial<BrokerOptions> = {},
): Promise<Harness> {
  const broker = new Broker({
    endpoint,
    logger: silentLogger,
    heartbeatIntervalMs: 100,
    progressIntervalMs: 50,
    onEvent: (e) => events.push(e),
    ...over,
  });
  await broker.start();
  cleanups.push(() => broker.stop());
  const of = <K extends BrokerEvent['kind']>(kind: K, deliveryId?: string): Extract<BrokerEvent, { kind: K }>[] =>
    events.filter(
      (e): e is Extract<BrokerEvent, { kind: K }> =>
        e.kind === kind && (deliveryId === undefined || ('turnRef' in e && e.turnRef.delivery_id === deliveryId)),
    );
  return { broker, events, of };
}

async function startWorker(h: Harness, over: Partial<WorkerOptions> = {}): Promise<Worker> {
  const worker = createWorker({
    endpoint: h.broker.endpoint,
    workerId: 'w-sdk',
    handler: createExampleHandler(),
    logger: silentLogger,
    heartbeatIntervalMs: 100,
    ...over,
  });
  cleanups.push(() => worker.stop());
  await worker.start();
  await waitFor(() => worker.isRegistered() && h.broker.isRegistered(worker.workerId), 'registration');
  return worker;
}

async function dispatch(h: Harness, data: unknown, ref: TurnRef = makeTurnRef(), workerId = 'w-sdk'): Promise<TurnRef> {
  expect(await h.broker.send(workerId, makeTurnStart(data, ref))).toEqual({ ok: true });
  return ref;
}

describe('worker SDK end to end', () => {
  it('accepts a turn and returns the echo result with the same turn_ref', async () => {
    const h = await startBroker();
    await startWorker(h);
    expect(h.of('worker_ready')[0]).toMatchObject({ workerId: 'w-sdk', capacity: 1, reconnect: false });
    const ref = await dispatch(h, { text: 'hi' });
    const [result] = await waitFor(() => h.of('turn_result', ref.delivery_id).length && h.of('turn_result', ref.delivery_id), 'result');
    expect(result).toEqual({
      kind: 'turn_result',
      workerId: 'w-sdk',
      turnRef: ref,
      messages: [{ role: 'assistant', content: { text: 'echo: hi' } }],
    });
    // an instant turn: its result implies the accept, which is left out
    expect(h.of('turn_accepted', ref.delivery_id)).toEqual([]);

    // a turn that waits: accepted first, then its result
    const slow = await dispatch(h, { text: 'later', delayMs: 100 });
    const [slowResult] = await waitFor(
      () => h.of('turn_result', slow.delivery_id).length && h.of('turn_result', slow.delivery_id),
      'result',
    );
    expect(h.of('turn_accepted', slow.delivery_id)).toEqual([{ kind: 'turn_accepted', workerId: 'w-sdk', turnRef: slow }]);
    expect(h.events.findIndex((e) => e.kind === 'turn_accepted')).toBeLessThan(h.events.indexOf(slowResult!));

    const other = await dispatch(h, [1, 'two']);
    const [r2] = await waitFor(() => h.of('turn_result', other.delivery_id).length && h.of('turn_result', other.delivery_id), 'result 2');
    expect(r2?.messages[0]?.content).toEqual({ text: 'echo: [1,"two"]' });
  });

  it('heartbeats with the interval from the welcome', async () => {
    const h = await startBroker();
    await startWorker(h, { heartbeatIntervalMs: 10_000 });
    await waitFor(() => h.of('worker_heartbeat').length >= 3, '3 heartbeats', 3000);
    expect(h.of('worker_heartbeat')[0]).toEqual({ kind: 'worker_heartbeat', workerId: 'w-sdk', inFlight: 0 });
  });

  it('turns a thrown error into turn_error', async () => {
    const h = await startBroker();
    await startWorker(h);
    const ref = await dispatch(h, { fail: true });
    const [err] = await waitFor(() => h.of('turn_error', ref.delivery_id).length && h.of('turn_error', ref.delivery_id), 'error');
    expect(err).toEqual({
      kind: 'turn_error',
      workerId: 'w-sdk',
      turnRef: ref,
      error: { code: 'handler_error', message: 'example worker asked to fail', retryable: true },
    });
    const ref2 = await dispatch(h, { fail: true, failCode: 'bad_input', retryable: false });
    const [err2] = await waitFor(() => h.of('turn_error', ref2.delivery_id).length && h.of('turn_error', ref2.delivery_id), 'error 2');
    expect(err2?.error).toMatchObject({ code: 'bad_input', retryable: false });
  });

  it('follows a steer: new revision in progress and result, input in the reply', async () => {
    const h = await startBroker();
    await startWorker(h);
    const ref = await dispatch(h, { text: 'hi', delayMs: 400 });
    await waitFor(() => h.of('turn_accepted', ref.delivery_id).length, 'accepted');
    const steered = { ...ref, revision: ref.revision + 1 };
    expect(await h.broker.send('w-sdk', { v: 1, type: 'turn_steer', turn_ref: steered, input: { also: 'this' } })).toEqual({ ok: true });
    const [result] = await waitFor(() => h.of('turn_result', ref.delivery_id).length && h.of('turn_result', ref.delivery_id), 'result');
    expect(result?.turnRef).toEqual(steered);
    expect(result?.messages[0]?.content).toEqual({ text: 'echo: hi', steered: { also: 'this' } });
    const progress = h.of('turn_progress', ref.delivery_id);
    expect(progress.some((p) => p.note === 'steered' && p.turnRef.revision === 1)).toBe(true);
    // Once steered, the worker never speaks the old revision again.
    const firstNew = h.events.findIndex((e) => e.kind === 'turn_progress' && e.note === 'steered');
    const later = h.events.slice(firstNew).filter((e) => 'turnRef' in e && e.turnRef.delivery_id === ref.delivery_id);
    expect(later.every((e) => 'turnRef' in e && e.turnRef.revision === 1)).toBe(true);
  });

  it('sends turn_progress while the handler runs', async () => {
    const h = await startBroker();
    await startWorker(h);
    const ref = await dispatch(h, { delayMs: 300 });
    await waitFor(() => h.of('turn_result', ref.delivery_id).length, 'result');
    expect(h.of('turn_progress', ref.delivery_id).length).toBeGreaterThanOrEqual(2);
  });

  it('cancel aborts the handler and sends nothing for the turn', async () => {
    const h = await startBroker();
    const worker = await startWorker(h);
    const ref = await dispatch(h, { delayMs: 30_000 });
    await waitFor(() => h.of('turn_accepted', ref.delivery_id).length, 'accepted');
    expect(worker.inFlight()).toBe(1);
    await h.broker.send('w-sdk', { v: 1, type: 'turn_cancel', turn_ref: ref, reason: 'operator' });
    await waitFor(() => worker.inFlight() === 0, 'handler aborted', 2000);
    // The worker's sends are FIFO: once a later turn's result is here, nothing else is coming.
    const next = await dispatch(h, { text: 'after' });
    await waitFor(() => h.of('turn_result', next.delivery_id).length, 'next result');
    expect(h.of('turn_result', ref.delivery_id)).toEqual([]);
    expect(h.of('turn_error', ref.delivery_id)).toEqual([]);
  });

  it('a terminal turn_rejected of the running turn aborts it', async () => {
    const h = await startBroker();
    const worker = await startWorker(h);
    const ref = await dispatch(h, { delayMs: 30_000 });
    await waitFor(() => h.of('turn_accepted', ref.delivery_id).length, 'accepted');
    await h.broker.send('w-sdk', { v: 1, type: 'turn_rejected', turn_ref: ref, reason: 'lease_expired' });
    await waitFor(() => worker.inFlight() === 0, 'handler aborted', 2000);
  });

  it('respects capacity: refuses the extra turn with a retryable over_capacity', async () => {
    const h = await startBroker();
    const worker = await startWorker(h, { capacity: 2 });
    const refs = [makeTurnRef(), makeTurnRef(), makeTurnRef()];
    for (const ref of refs) await dispatch(h, { delayMs: 300, text: 'c' }, ref);
    const [refused] = await waitFor(
      () => h.of('turn_error', refs[2]!.delivery_id).length && h.of('turn_error', refs[2]!.delivery_id),
      'refusal',
    );
    expect(refused?.error).toMatchObject({ code: 'over_capacity', retryable: true });
    expect(worker.inFlight()).toBe(2);
    await waitFor(() => h.of('worker_heartbeat').some((e) => e.inFlight === 2), 'heartbeat in_flight 2');
    await waitFor(() => h.of('turn_result').length === 2, 'two results');
    expect(h.of('turn_accepted', refs[2]!.delivery_id)).toEqual([]);
  });

  it('runs no more turns than the capacity the daemon registered, lower than its own when the allow-list caps it', async () => {
    // the cap an allow-list entry sets (KeyAuthenticator), without the keys
    const h = await startBroker(undefined, [], { authenticator: { verify: () => ({ ok: true, maxCapacity: 1 }) } });
    const worker = await startWorker(h, { capacity: 3 });
    expect(h.of('worker_ready')[0]).toMatchObject({ capacity: 1 });
    expect(worker.capacity()).toBe(1);
    const [first, second] = [makeTurnRef(), makeTurnRef()];
    await dispatch(h, { delayMs: 300, text: 'a' }, first);
    await dispatch(h, { delayMs: 300, text: 'b' }, second);
    const [refused] = await waitFor(
      () => h.of('turn_error', second!.delivery_id).length && h.of('turn_error', second!.delivery_id),
      'refusal',
    );
    expect(refused?.error).toMatchObject({ code: 'over_capacity', retryable: true });
    expect(worker.inFlight()).toBe(1);
    await waitFor(() => h.of('turn_result', first!.delivery_id).length, "the first turn's result");
    expect(h.of('turn_result', second!.delivery_id)).toEqual([]);
  });

  it('keeps its own capacity with a daemon whose welcome does not say one', async () => {
    const h = await startBroker();
    const worker = await startWorker(h, {
      capacity: 2,
      // a daemon older than the welcome's `capacity` field
      hooks: {
        onReceive: (m) => {
          if (m.type === 'worker_welcome') delete (m as { capacity?: number }).capacity;
        },
      },
    });
    expect(worker.capacity()).toBe(2);
    const refs = [makeTurnRef(), makeTurnRef()];
    for (const ref of refs) await dispatch(h, { delayMs: 100, text: 'c' }, ref);
    await waitFor(() => h.of('turn_result').length === 2, 'two results');
    expect(h.of('turn_error')).toEqual([]);
  });

  it('with CURVE, answers the daemon’s challenge with the key proof, once per nonce, and runs turns', async () => {
    const b = await startCurveBroker({ heartbeatIntervalMs: 100 });
    cleanups.push(() => b.stop());
    const key = b.issue('w-curve', { agents: ['agent-*'] });
    const received: DaemonMessage[] = [];
    const sent: string[] = [];
    const worker = createWorker({
      endpoint: b.broker.endpoint,
      workerId: 'w-curve',
      handler: createExampleHandler(),
      logger: silentLogger,
      heartbeatIntervalMs: 100,
      curve: { serverKey: key.server_key, publicKey: key.public_key, secretKey: key.secret_key },
      auth: { scheme: 'key', credential: key.token },
      hooks: {
        onReceive: (m) => void received.push(m),
        beforeSend: (m) => {
          if (m.type === 'worker_ready') sent.push(m.auth?.proof === undefined ? 'ask' : `proof:${m.auth.nonce}`);
          return [m];
        },
      },
    });
    cleanups.push(() => worker.stop());
    await worker.start();
    await waitFor(() => worker.isRegistered() && b.broker.isRegistered('w-curve'), 'registration with a key proof');
    const nonces = received.flatMap((m) => (m.type === 'worker_challenge' ? [m.nonce] : []));
    expect(nonces.length).toBeGreaterThanOrEqual(1);
    // each distinct nonce answered exactly once, even when the daemon sent it again
    expect(sent.filter((x) => x.startsWith('proof:')).sort()).toEqual([...new Set(nonces)].map((n) => `proof:${n}`).sort());
    expect(b.events.find((e) => e.kind === 'worker_ready')).toMatchObject({ workerId: 'w-curve', agents: ['agent-*'] });
    const ref = makeTurnRef();
    expect(await b.broker.send('w-curve', makeTurnStart({ text: 'proven' }, ref))).toEqual({ ok: true });
    await waitFor(() => b.events.some((e) => e.kind === 'turn_result' && e.turnRef.delivery_id === ref.delivery_id), 'the result');

    // forgotten by the daemon, it proves its key again over a new nonce
    b.broker.forget('w-curve');
    await waitFor(() => b.broker.isRegistered('w-curve') && new Set(sent.filter((x) => x.startsWith('proof:'))).size >= 2, 'proved again');
  });

  it('two processes sharing one id and token take the route from each other in turn (neither is starved)', async () => {
    const h = await startBroker(undefined, [], { authenticator: new StaticTokenAuthenticator({ 'w-twin': 'twin-token' }) });
    const welcomes = [0, 0];
    const twins = await Promise.all(
      [0, 1].map(async (i) => {
        const w = createWorker({
          endpoint: h.broker.endpoint,
          workerId: 'w-twin',
          handler: createExampleHandler(),
          logger: silentLogger,
          heartbeatIntervalMs: 100,
          auth: { scheme: 'token', credential: 'twin-token' },
          hooks: { onReceive: (m) => void (m.type === 'worker_welcome' && welcomes[i]!++) },
        });
        cleanups.push(() => w.stop());
        await w.start();
        return w;
      }),
    );
    // each one's next heartbeat after losing the route is answered not_registered, and it registers again
    await waitFor(() => welcomes.every((n) => n >= 4), 'both twins welcomed again and again', 15_000);
    const instances = h.of('worker_ready').map((e) => e.instance);
    expect(new Set(instances).size).toBe(2);
    // the route moved between the two runs (each move a new `instance`: a daemon re-dispatches the worker's turns)
    const moves = instances.filter((x, i) => i > 0 && x !== instances[i - 1]).length;
    expect(moves).toBeGreaterThanOrEqual(6);
    expect(twins).toHaveLength(2);
  });

  it('re-registers after not_registered (daemon forgot the worker)', async () => {
    const h = await startBroker();
    const worker = await startWorker(h);
    h.broker.forget('w-sdk');
    // The worker's next heartbeat is answered not_registered; it must register again.
    await waitFor(
      () => h.of('worker_ready').length === 2 && h.broker.isRegistered('w-sdk') && worker.isRegistered(),
      're-registration',
      3000,
    );
    expect(h.of('worker_ready')[1]).toMatchObject({ reconnect: false });
    const ref = await dispatch(h, { text: 'again' });
    await waitFor(() => h.of('turn_result', ref.delivery_id).length, 'result after re-registration');
  });

  it('reconnects to a restarted daemon and re-sends a result it never answered', async () => {
    const first = await startBroker();
    const endpoint = first.broker.endpoint;
    const worker = await startWorker(first);
    const ref = await dispatch(first, { text: 'slow', delayMs: 500 });
    await waitFor(() => first.of('turn_accepted', ref.delivery_id).length, 'accepted');
    await first.broker.stop();

    const second = await startBroker(endpoint);
    await waitFor(() => second.broker.isRegistered('w-sdk') && worker.isRegistered(), 'registration with the new daemon', 5000);
    const [result] = await waitFor(
      () => second.of('turn_result', ref.delivery_id).length && second.of('turn_result', ref.delivery_id),
      'result delivered to the new daemon',
      5000,
    );
    expect(result?.messages[0]?.content).toEqual({ text: 'echo: slow' });
    expect(worker.isRegistered()).toBe(true);
    // Once answered, the result is not sent again on the next re-registration.
    await second.broker.send('w-sdk', { v: 1, type: 'turn_committed', turn_ref: ref });
    const before = second.of('turn_result', ref.delivery_id).length;
    const readies = second.of('worker_ready').length;
    second.broker.forget('w-sdk');
    await waitFor(() => second.of('worker_ready').length > readies && worker.isRegistered(), 're-registration', 3000);
    const probe = await dispatch(second, { text: 'probe' });
    await waitFor(() => second.of('turn_result', probe.delivery_id).length, 'probe result');
    expect(second.of('turn_result', ref.delivery_id).length).toBe(before);
  });

  it('re-sends an unanswered turn_error after re-registering, and forgets one answered turn_failed', async () => {
    const h = await startBroker();
    const worker = await startWorker(h, { capacity: 2 });
    const answered = await dispatch(h, { fail: true });
    await waitFor(() => h.of('turn_error', answered.delivery_id).length, 'first error');
    await h.broker.send('w-sdk', { v: 1, type: 'turn_failed', turn_ref: answered, retry: true, dead_lettered: false });
    // sent after turn_failed on the same connection: its error proves turn_failed was read
    const open = await dispatch(h, { fail: true });
    await waitFor(() => h.of('turn_error', open.delivery_id).length, 'second error');
    const readies = h.of('worker_ready').length;
    h.broker.forget('w-sdk');
    await waitFor(() => h.of('worker_ready').length > readies && worker.isRegistered(), 're-registration', 3000);
    await waitFor(() => h.of('turn_error', open.delivery_id).length === 2, 'the unanswered error re-sent', 3000);
    expect(h.of('turn_error', answered.delivery_id)).toHaveLength(1);
  });

  it('turn.history and turn.rpc go over the socket with the current turn_ref; errors carry the code', async () => {
    const h = await startBroker();
    const answered = new Set<string>();
    const seen: unknown[] = [];
    await startWorker(h, {
      handler: async (ctx) => {
        const page = await ctx.history({ beforeSeq: 5, limit: 2 });
        seen.push(page.total);
        try {
          await ctx.rpc('actor.status');
        } catch (e) {
          seen.push((e as { code?: string }).code);
        }
        return { messages: [{ role: 'assistant', content: 'ok' }], emit: [{ actor: 'a/b', data: 1, delay_ms: 10 }] };
      },
    });
    // the test plays the daemon's RPC server
    const answer = setInterval(() => {
      for (const e of h.of('rpc_request')) {
        if (answered.has(e.id)) continue;
        answered.add(e.id);
        expect(e.turnRef.delivery_id).toBeDefined();
        const reply =
          e.method === 'history.read'
            ? {
                result: {
                  conversation_id: 'c',
                  messages: [],
                  has_more: false,
                  total: e.params && (e.params as { before_seq?: number }).before_seq === 5 ? 4 : -1,
                },
              }
            : { error: { code: 'not_live', message: 'no' } };
        void h.broker.send(e.workerId, { v: 1, type: 'rpc_response', id: e.id, ...reply } as never);
      }
    }, 10);
    cleanups.push(() => clearInterval(answer));
    const ref = await dispatch(h, { text: 'x' });
    const [result] = await waitFor(() => h.of('turn_result', ref.delivery_id).length && h.of('turn_result', ref.delivery_id), 'result');
    expect(seen).toEqual([4, 'not_live']);
    expect(result?.emit).toEqual([{ actor: 'a/b', data: 1, delay_ms: 10 }]);
  });

  it('duplicateResults sends every result twice', async () => {
    const h = await startBroker();
    const worker = await runExampleWorker({
      endpoint: h.broker.endpoint,
      workerId: 'w-dup',
      capacity: 1,
      logger: silentLogger,
      duplicateResults: true,
    });
    cleanups.push(() => worker.stop());
    await waitFor(() => h.broker.isRegistered('w-dup'), 'registration');
    const ref = await dispatch(h, { text: 'twice' }, makeTurnRef(), 'w-dup');
    const results = await waitFor(
      () => h.of('turn_result', ref.delivery_id).length === 2 && h.of('turn_result', ref.delivery_id),
      'two results',
    );
    expect(results[0]).toEqual(results[1]);
  });

  it('stop() aborts running turns with a retryable worker_stopping error', async () => {
    const h = await startBroker();
    const worker = await startWorker(h);
    const ref = await dispatch(h, { delayMs: 30_000 });
    await waitFor(() => h.of('turn_accepted', ref.delivery_id).length, 'accepted');
    await Promise.all([worker.stop(), worker.stop()]);
    expect(worker.inFlight()).toBe(0);
    const [err] = await waitFor(() => h.of('turn_error', ref.delivery_id).length && h.of('turn_error', ref.delivery_id), 'stop error');
    expect(err?.error).toMatchObject({ code: 'worker_stopping', retryable: true });
  });

  it('reports an invalid handler outcome as a non-retryable turn_error', async () => {
    const h = await startBroker();
    const handler: TurnHandler = async () => ({ messages: [{ role: 'user' as 'assistant', content: 'x' }] });
    await startWorker(h, { handler });
    const ref = await dispatch(h, {});
    const [err] = await waitFor(() => h.of('turn_error', ref.delivery_id).length && h.of('turn_error', ref.delivery_id), 'error');
    expect(err?.error).toMatchObject({ code: 'invalid_result', retryable: false });
  });

  it('fails a turn whose outcome breaks the shape limits with a retryable turn_error, sending no result', async () => {
    const h = await startBroker();
    // 10,000 levels: JSON.stringify would overflow the stack; 101 levels: the daemon would refuse it
    const nest = (n: number) => {
      let v: unknown = 'x';
      for (let i = 0; i < n; i++) v = [v];
      return v;
    };
    const handler: TurnHandler = async (ctx) => {
      const { n, where } = ctx.event.data as { n: number; where: string };
      if (where === 'emit') return { messages: [], emit: [{ actor: 'a/b', data: nest(n) }] };
      return where === 'output' ? { messages: [], output: nest(n) } : { messages: [{ role: 'assistant', content: nest(n) }] };
    };
    await startWorker(h, { handler, capacity: 4 });
    for (const [n, where, code] of [
      [10_000, 'content', 'unstorable_result'],
      [101, 'output', 'unstorable_result'],
      [101, 'emit', 'emit_limit'],
    ] as const) {
      const ref = await dispatch(h, { n, where });
      const [err] = await waitFor(
        () => h.of('turn_error', ref.delivery_id).length && h.of('turn_error', ref.delivery_id),
        `${where} error`,
      );
      expect(err?.error).toMatchObject({ code, retryable: true });
      expect(err?.error.message).toMatch(/nested deeper than 100 levels/);
      expect(h.of('turn_result', ref.delivery_id)).toEqual([]);
    }
    // 100 levels is within the limit
    const ok = await dispatch(h, { n: 100, where: 'output' });
    await waitFor(() => h.of('turn_result', ok.delivery_id).length, 'a result 100 levels deep');
  });

  it('refuses a result over the size limit, measured in UTF-8 bytes, and sends one that fits unchanged', async () => {
    const h = await startBroker();
    // 1,500 characters of 3 bytes each: under 2,048 counted in characters, over it in bytes
    const handler: TurnHandler = async (ctx) => {
      const n = (ctx.event.data as { n: number }).n;
      return { messages: [{ role: 'assistant', content: '€'.repeat(n) }] };
    };
    await startWorker(h, { handler, maxMessageBytes: 2048 });
    const big = await dispatch(h, { n: 1500 });
    const [err] = await waitFor(() => h.of('turn_error', big.delivery_id).length && h.of('turn_error', big.delivery_id), 'error');
    expect(err?.error).toMatchObject({ code: 'result_too_large', retryable: false });
    expect(err?.error.message).toMatch(/4[0-9]{3} bytes, limit 2048/);
    const small = await dispatch(h, { n: 300 });
    const [res] = await waitFor(() => h.of('turn_result', small.delivery_id).length && h.of('turn_result', small.delivery_id), 'result');
    expect(res?.turnRef).toEqual(small);
    expect(res?.messages).toEqual([{ role: 'assistant', content: '€'.repeat(300) }]);
  });

  it('replays steers that arrived before the handler subscribed', async () => {
    const h = await startBroker();
    const seen: unknown[] = [];
    const handler: TurnHandler = async (ctx) => {
      await new Promise((r) => setTimeout(r, 200));
      ctx.onSteer((input) => seen.push(input));
      return { messages: [{ role: 'assistant', content: { revision: ctx.turnRef.revision } }] };
    };
    await startWorker(h, { handler });
    const ref = await dispatch(h, {});
    await waitFor(() => h.of('turn_accepted', ref.delivery_id).length, 'accepted');
    await h.broker.send('w-sdk', { v: 1, type: 'turn_steer', turn_ref: { ...ref, revision: 5 }, input: 'late' });
    const [result] = await waitFor(() => h.of('turn_result', ref.delivery_id).length && h.of('turn_result', ref.delivery_id), 'result');
    expect(seen).toEqual(['late']);
    expect(result?.messages[0]?.content).toEqual({ revision: 5 });
  });

  describe('the stream budget (CORRAL_STREAM_TURN_BYTES)', () => {
    const BUDGET = 256 * 1024;
    const welcome = { leaseMs: 60_000, staleMs: 10_000, retry: { limit: 1, delay_s: 5, delay_max_s: 120, backoff: true } };
    const floodOf = (r: Extract<BrokerEvent, { kind: 'turn_result' }>) =>
      (r.messages[0]!.content as { flood: { chunks: number; stopped: boolean } }).flood;
    const warnings = (lines: string, what: string) => lines.split('\n').filter((l) => l.includes(what)).length;

    it('the welcome’s budget: the SDK sends chunk frames up to it, never past it, then ctx.stream returns false and says so once', async () => {
      const h = await startBroker(undefined, [], { welcome: { ...welcome, streamTurnBytes: BUDGET } });
      const log = new Capture();
      await startWorker(h, { logger: pino({ level: 'warn' }, log) });
      const ref = await dispatch(h, { flood: { chunkBytes: 32 * 1024, ms: 10_000 } });
      const [result] = await waitFor(() => h.of('turn_result', ref.delivery_id).length && h.of('turn_result', ref.delivery_id), 'result');
      const chunks = h.of('turn_chunk', ref.delivery_id);
      const sent = chunks.reduce((n, c) => n + c.bytes, 0);
      expect(sent).toBeLessThanOrEqual(BUDGET);
      // it stopped at the chunk that would have passed the budget, not earlier
      expect(sent + chunks[0]!.bytes).toBeGreaterThan(BUDGET);
      expect(floodOf(result!)).toEqual({ chunks: chunks.length, bytes: chunks.length * 32 * 1024, stopped: true });
      expect(warnings(log.text, 'stream budget is spent')).toBe(1);
    });

    it('a daemon’s turn_stream_closed: ctx.stream returns false from then on for that turn only, logged once', async () => {
      // a daemon that states no budget in its welcome: only its message stops the stream
      const h = await startBroker();
      const log = new Capture();
      await startWorker(h, { logger: pino({ level: 'warn' }, log), capacity: 2 });
      const ref = await dispatch(h, { flood: { chunkBytes: 1024, ms: 10_000 } });
      await waitFor(() => h.of('turn_chunk', ref.delivery_id).length >= 10, 'the flood');
      const closed = { v: 1, type: 'turn_stream_closed', turn_ref: ref, reason: 'turn_limit', limit_bytes: 10_000 } as const;
      expect(await h.broker.send('w-sdk', closed)).toEqual({ ok: true });
      expect(await h.broker.send('w-sdk', closed)).toEqual({ ok: true });
      const [result] = await waitFor(() => h.of('turn_result', ref.delivery_id).length && h.of('turn_result', ref.delivery_id), 'result');
      // the sends are FIFO: no chunk came after the result
      expect(floodOf(result!)).toMatchObject({ chunks: h.of('turn_chunk', ref.delivery_id).length, stopped: true });
      expect(warnings(log.text, 'closed the turn’s stream')).toBe(1);
      // another turn of the same worker still streams
      const other = await dispatch(h, { stream: 3 });
      await waitFor(() => h.of('turn_result', other.delivery_id).length, 'the other result');
      expect(h.of('turn_chunk', other.delivery_id)).toHaveLength(3);
    });
  });

  it('stop({ graceMs }) lets a running turn finish while it keeps heartbeating, so the daemon does not declare it stale', async () => {
    const h = await startBroker();
    const worker = await startWorker(h);
    const ref = await dispatch(h, { delayMs: 600, text: 'draining' });
    await waitFor(() => worker.inFlight() === 1, 'the turn running');
    const beatsBefore = h.of('worker_heartbeat').length;
    await worker.stop({ graceMs: 5_000 });
    // the turn finished and its result went out; heartbeats kept coming meanwhile (every 100 ms)
    await waitFor(() => h.of('turn_result', ref.delivery_id).length, 'the result');
    expect(h.of('worker_heartbeat').length - beatsBefore).toBeGreaterThanOrEqual(3);
  });

  it('ignores unknown daemon message types and keeps working', async () => {
    const h = await startBroker();
    await startWorker(h);
    await h.broker.send('w-sdk', { v: 1, type: 'turn_pause', turn_ref: makeTurnRef() } as unknown as DaemonMessage);
    const ref = await dispatch(h, { text: 'still here' });
    await waitFor(() => h.of('turn_result', ref.delivery_id).length, 'result');
    expect(h.of('invalid')).toEqual([]);
  });

  it('validates its options', () => {
    const base = { endpoint: 'tcp://127.0.0.1:1', handler: createExampleHandler() };
    expect(() => createWorker({ ...base, workerId: 'bad id' })).toThrow(/invalid worker id/);
    expect(() => createWorker({ ...base, workerId: 'ok', capacity: 0 })).toThrow(/capacity/);
  });
});
