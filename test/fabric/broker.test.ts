import { afterEach, describe, expect, it } from 'vitest';
import { StaticTokenAuthenticator } from '../../src/fabric/auth.ts';
import { Broker, MAX_UNREGISTERED_FRAME_BYTES, type BrokerEvent, type BrokerOptions } from '../../src/fabric/broker.ts';
import type { DaemonMessage } from '../../src/fabric/protocol.ts';
import { silentLogger } from '../../src/base/logger.ts';
import { RawPeer } from '../helpers/raw-peer.ts';
import { makeTurnRef, waitFor } from './helpers.ts';

const cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function startBroker(over: Partial<BrokerOptions> = {}): Promise<{ broker: Broker; events: BrokerEvent[] }> {
  const events: BrokerEvent[] = [];
  const broker = new Broker({
    endpoint: 'tcp://127.0.0.1:0',
    logger: silentLogger,
    heartbeatIntervalMs: 150,
    progressIntervalMs: 250,
    onEvent: (e) => events.push(e),
    ...over,
  });
  await broker.start();
  cleanups.push(() => broker.stop());
  return { broker, events };
}

function peer(endpoint: string, routingId?: string): RawPeer {
  const p = new RawPeer(endpoint, routingId);
  cleanups.push(() => p.close());
  return p;
}

const ready = (id: string, capacity = 2): object => ({ v: 1, type: 'worker_ready', worker_id: id, capacity });
const heartbeat = (id: string, n = 0): object => ({ v: 1, type: 'worker_heartbeat', worker_id: id, in_flight: n });
const committed = (): DaemonMessage => ({ v: 1, type: 'turn_committed', turn_ref: makeTurnRef() });

describe('Broker', () => {
  it('binds port 0 and reports the real endpoint', async () => {
    const { broker } = await startBroker();
    expect(broker.endpoint).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
    expect(broker.endpoint).not.toMatch(/:0$/);
    expect(await broker.start()).toBe(broker.endpoint); // idempotent
  });

  it('registers a worker and answers with worker_welcome', async () => {
    const { broker, events } = await startBroker();
    const w = peer(broker.endpoint, 'w-1');
    await w.sendJson({ ...ready('w-1', 3), sdk: 'raw/1' });
    const [welcome] = await w.waitFor('worker_welcome');
    expect(welcome).toEqual({
      v: 1,
      type: 'worker_welcome',
      worker_id: 'w-1',
      capacity: 3,
      heartbeat_interval_ms: 150,
      progress_interval_ms: 250,
    });
    expect(events).toEqual([{ kind: 'worker_ready', workerId: 'w-1', capacity: 3, reconnect: false, sdk: 'raw/1' }]);
    expect(broker.isRegistered('w-1')).toBe(true);
    expect(broker.workers()).toMatchObject([{ workerId: 'w-1', capacity: 3, registrations: 1 }]);

    await w.sendJson(ready('w-1', 3));
    await w.waitFor('worker_welcome', 2);
    expect(events[1]).toMatchObject({ kind: 'worker_ready', reconnect: true });

    await w.sendJson(heartbeat('w-1', 1));
    await waitFor(() => events.find((e) => e.kind === 'worker_heartbeat'), 'heartbeat event');
    expect(events[2]).toEqual({ kind: 'worker_heartbeat', workerId: 'w-1', inFlight: 1 });
  });

  it('survives garbage, bad JSON, unknown types, multi-frame and schema violations', async () => {
    const { broker, events } = await startBroker();
    const w = peer(broker.endpoint, 'w-2');
    await w.sendJson(ready('w-2'));
    await w.waitFor('worker_welcome');

    const ref = makeTurnRef();
    await w.sendRaw(Buffer.from([0x00, 0xff, 0x13, 0x37, 0x80]));
    await w.sendRaw('{"v":1,"type":');
    await w.sendRaw('');
    await w.sendJson([1, 2, 3]);
    await w.sendJson({ v: 1, type: 'worker_moonwalk' });
    await w.sendRaw(JSON.stringify(heartbeat('w-2')), JSON.stringify(heartbeat('w-2')));
    await w.sendJson({ v: 1, type: 'turn_accepted' });
    await w.sendJson({ v: 1, type: 'turn_result', turn_ref: ref, messages: [{ role: 'user', content: 'x' }] });
    await w.sendJson({ v: 2, type: 'worker_heartbeat', worker_id: 'w-2', in_flight: 0 });
    // Then a valid message: it must still route.
    await w.sendJson({ v: 1, type: 'turn_accepted', turn_ref: ref });

    await waitFor(() => events.find((e) => e.kind === 'turn_accepted'), 'turn_accepted after garbage');
    const invalid = events.filter((e) => e.kind === 'invalid');
    expect(invalid).toHaveLength(9);
    // routing ids are reported in hex: they are opaque per-connection ids, not worker ids
    const rid = Buffer.from('w-2').toString('hex');
    expect(invalid.every((e) => e.kind === 'invalid' && e.routingId === rid)).toBe(true);
    const errors = await w.waitFor('error', 9);
    expect(errors.map((e) => e.code)).toEqual([...Array(8).fill('invalid_message'), 'unsupported_version']);
    expect(events.at(-1)).toEqual({ kind: 'turn_accepted', workerId: 'w-2', turnRef: ref });
    expect(broker.stats()).toMatchObject({ state: 'running', invalid: 9, workers: 1 });
  });

  it('answers not_registered to messages before worker_ready', async () => {
    const { broker, events } = await startBroker();
    const w = peer(broker.endpoint, 'w-3');
    await w.sendJson(heartbeat('w-3'));
    await w.sendJson({ v: 1, type: 'turn_accepted', turn_ref: makeTurnRef() });
    const errs = await w.waitFor('error', 2);
    expect(errs.map((e) => e.code)).toEqual(['not_registered', 'not_registered']);
    expect(events.map((e) => e.kind)).toEqual(['invalid', 'invalid']);

    // forget() puts a registered worker back into that state.
    await w.sendJson(ready('w-3'));
    await w.waitFor('worker_welcome');
    expect(broker.forget('w-3')).toBe(true);
    await w.sendJson(heartbeat('w-3'));
    await w.waitFor('error', 3);
    expect(w.ofType('error')[2]?.code).toBe('not_registered');
  });

  it('refuses a frame larger than any worker_ready from an unregistered connection unread, and still registers it after', async () => {
    const { broker, events } = await startBroker();
    const w = peer(broker.endpoint, 'w-big');
    const big = { v: 1, type: 'turn_chunk', turn_ref: makeTurnRef(), seq: 0, data: { delta: 'x'.repeat(MAX_UNREGISTERED_FRAME_BYTES) } };
    await w.sendJson(big);
    // a worker_ready padded to just under the limit is read (unknown fields are ignored)
    await w.sendJson({ ...ready('w-big'), padding: 'p'.repeat(MAX_UNREGISTERED_FRAME_BYTES - 200) });
    await w.waitFor('worker_welcome');
    const [err] = await w.waitFor('error', 1);
    expect(err).toMatchObject({ code: 'not_registered' });
    expect(String(err!.message)).toContain('bytes from a connection that has not registered');
    expect(events.filter((e) => e.kind === 'invalid')).toHaveLength(1);
    // registered, a frame that large is read like any other
    await w.sendJson({ v: 1, type: 'turn_progress', turn_ref: makeTurnRef(), padding: 'x'.repeat(MAX_UNREGISTERED_FRAME_BYTES) });
    await waitFor(() => events.find((e) => e.kind === 'turn_progress'), 'a large frame read once registered');
    expect(events.filter((e) => e.kind === 'invalid')).toHaveLength(1);
    expect(broker.isRegistered('w-big')).toBe(true);
  });

  it('binds one connection to one worker id; heartbeats must name it', async () => {
    const { broker } = await startBroker();
    const w = peer(broker.endpoint, 'conn-a');
    await w.sendJson(ready('w-a'));
    await w.waitFor('worker_welcome');
    await w.sendJson(ready('w-b'));
    expect((await w.waitFor('error'))[0]?.code).toBe('identity_mismatch');
    await w.sendJson(heartbeat('w-other'));
    expect((await w.waitFor('error', 2))[1]?.code).toBe('identity_mismatch');
    expect(broker.workers().map((s) => s.workerId)).toEqual(['w-a']);

    // a DEALER without a routing id registers like any other connection
    const anon = peer(broker.endpoint);
    await anon.sendJson(ready('w-anon'));
    await anon.waitFor('worker_welcome');
    expect(broker.isRegistered('w-anon')).toBe(true);
  });

  it('refuses a route takeover without proof and keeps the live session', async () => {
    const { broker, events } = await startBroker({ authenticator: new StaticTokenAuthenticator({ 'w-live': 'right-token' }) });
    const live = peer(broker.endpoint, 'conn-live');
    await live.sendJson({ ...ready('w-live'), auth: { scheme: 'token', credential: 'right-token' } });
    await live.waitFor('worker_welcome');

    // same worker id from another connection, wrong token
    const thief = peer(broker.endpoint, 'conn-thief');
    await thief.sendJson({ ...ready('w-live'), auth: { scheme: 'token', credential: 'guess' } });
    expect((await thief.waitFor('error'))[0]?.code).toBe('unauthorized');
    // the same routing id as the live connection: without handover libzmq ignores it
    const clone = peer(broker.endpoint, 'conn-live');
    await clone.sendJson({ ...ready('w-live'), auth: { scheme: 'token', credential: 'guess' } });

    expect(await broker.send('w-live', committed())).toEqual({ ok: true });
    await live.waitFor('turn_committed');
    expect(thief.ofType('turn_committed')).toHaveLength(0);
    expect(clone.ofType('turn_committed')).toHaveLength(0);
    expect(broker.stats().takeoverRefused).toBeGreaterThanOrEqual(1);
    expect(events.filter((e) => e.kind === 'worker_ready')).toHaveLength(1);

    // the proven owner may move to a new connection (a reconnect)
    const moved = peer(broker.endpoint, 'conn-new');
    await moved.sendJson({ ...ready('w-live'), auth: { scheme: 'token', credential: 'right-token' } });
    await moved.waitFor('worker_welcome');
    expect(await broker.send('w-live', committed())).toEqual({ ok: true });
    await moved.waitFor('turn_committed');
    expect(live.ofType('turn_committed')).toHaveLength(1);
  });

  it('asks the authenticator and refuses with unauthorized', async () => {
    const { broker, events } = await startBroker({ authenticator: new StaticTokenAuthenticator({ 'w-t': 's3cret' }) });
    const w = peer(broker.endpoint, 'w-t');
    await w.sendJson({ ...ready('w-t'), auth: { scheme: 'token', credential: 'wrong' } });
    expect((await w.waitFor('error'))[0]?.code).toBe('unauthorized');
    expect(broker.isRegistered('w-t')).toBe(false);
    await w.sendJson({ ...ready('w-t'), auth: { scheme: 'token', credential: 's3cret' } });
    await w.waitFor('worker_welcome');
    expect(events.at(-1)).toMatchObject({ kind: 'worker_ready', workerId: 'w-t' });
  });

  it('registers at most the capacity the authenticator allows, and the welcome tells the worker', async () => {
    const { broker, events } = await startBroker({ authenticator: { verify: () => ({ ok: true, maxCapacity: 2 }) } });
    const w = peer(broker.endpoint, 'w-cap');
    await w.sendJson(ready('w-cap', 8));
    expect((await w.waitFor('worker_welcome'))[0]).toMatchObject({ worker_id: 'w-cap', capacity: 2 });
    expect(events.at(-1)).toMatchObject({ kind: 'worker_ready', workerId: 'w-cap', capacity: 2 });
    // under the cap the worker's own capacity stands
    await w.sendJson(ready('w-cap', 1));
    expect((await w.waitFor('worker_welcome', 2))[1]).toMatchObject({ capacity: 1 });
  });

  it('returns unknown_route for unknown or disconnected workers (sends never wait for a route)', async () => {
    const { broker } = await startBroker({ zmtpHeartbeatMs: 0 });
    expect(await broker.send('nobody', committed())).toEqual({ ok: false, reason: 'unknown_route' });

    // Registered, then the peer goes away: once the router notices the closed connection, the
    // route is gone and sends fail with unknown_route (not a timeout: sendTimeout is 0).
    const w = new RawPeer(broker.endpoint, 'w-gone');
    await w.sendJson(ready('w-gone'));
    await w.waitFor('worker_welcome');
    expect(await broker.send('w-gone', committed())).toEqual({ ok: true });
    await w.close();
    const final = await waitFor(async () => {
      const r = await broker.send('w-gone', committed());
      return r.ok ? undefined : r;
    }, 'the route gone');
    expect(final).toEqual({ ok: false, reason: 'unknown_route' });
    expect(broker.stats().sendFailed.unknown_route).toBe(2);
  });

  it('serialises concurrent sends and keeps their order', async () => {
    const { broker } = await startBroker();
    const w = peer(broker.endpoint, 'w-many');
    await w.sendJson(ready('w-many'));
    await w.waitFor('worker_welcome');
    const refs = Array.from({ length: 500 }, (_, i) => makeTurnRef({ revision: i }));
    const results = await Promise.all(refs.map((turn_ref) => broker.send('w-many', { v: 1, type: 'turn_committed', turn_ref })));
    expect(results.every((r) => r.ok)).toBe(true);
    const got = await w.waitFor('turn_committed', 500);
    expect(got.map((m) => m.turn_ref.revision)).toEqual(refs.map((r) => r.revision));
  });

  it('refuses to send messages over the size limit, measured in UTF-8 bytes, and sends what fits intact', async () => {
    const { broker } = await startBroker({ maxMessageBytes: 2048 });
    const w = peer(broker.endpoint, 'w-big');
    await w.sendJson(ready('w-big'));
    await w.waitFor('worker_welcome');
    const big: DaemonMessage = { v: 1, type: 'turn_steer', turn_ref: makeTurnRef(), input: 'x'.repeat(4096) };
    expect(await broker.send('w-big', big)).toEqual({ ok: false, reason: 'too_large' });
    // 1,000 characters of 3 bytes each: under the limit counted in characters, over it in bytes
    const wide: DaemonMessage = { v: 1, type: 'turn_steer', turn_ref: makeTurnRef(), input: '€'.repeat(1000) };
    expect(await broker.send('w-big', wide)).toEqual({ ok: false, reason: 'too_large' });
    const fits: DaemonMessage = { v: 1, type: 'turn_steer', turn_ref: makeTurnRef(), input: '€'.repeat(500) };
    expect(await broker.send('w-big', fits)).toEqual({ ok: true });
    const [got] = await w.waitFor('turn_steer');
    expect(got!.input).toBe('€'.repeat(500));
  });

  it('drops a connection that sends an oversized frame and keeps serving', async () => {
    const { broker, events } = await startBroker({ maxMessageBytes: 1024 });
    const w = peer(broker.endpoint, 'w-huge');
    let dropped = 0;
    w.dealer.events.on('disconnect', () => dropped++);
    await w.sendJson(ready('w-huge'));
    await w.waitFor('worker_welcome');
    const before = broker.stats();
    // Over libzmq's limit (twice maxMessageBytes): the connection is closed under the peer.
    await w.sendRaw('x'.repeat(4096));
    await waitFor(() => dropped > 0, 'the connection dropped');
    // The frame never reached the broker as a message (not counted, no error answered).
    expect(broker.stats()).toMatchObject({ oversize: before.oversize, invalid: before.invalid, received: before.received });
    expect(w.ofType('error')).toEqual([]);
    // Keeps serving: a new worker registers, and the dropped one (reconnected) registers again.
    const other = peer(broker.endpoint, 'w-ok');
    await other.sendJson(ready('w-ok'));
    await other.waitFor('worker_welcome');
    await w.sendJson(ready('w-huge'));
    await w.waitFor('worker_welcome', 2);
    expect(events.filter((e) => e.kind === 'worker_ready').map((e) => (e as { workerId: string }).workerId)).toEqual([
      'w-huge',
      'w-ok',
      'w-huge',
    ]);
  });

  it('keeps running when onEvent throws', async () => {
    let calls = 0;
    const { broker } = await startBroker({
      onEvent: () => {
        calls++;
        throw new Error('callback bug');
      },
    });
    const w = peer(broker.endpoint, 'w-cb');
    await w.sendJson(ready('w-cb'));
    await w.waitFor('worker_welcome');
    await w.sendJson(heartbeat('w-cb'));
    await waitFor(() => calls >= 2, 'second callback');
    expect(broker.stats().callbackErrors).toBe(2);
  });

  it('stops idempotently; later sends report closed', async () => {
    const { broker } = await startBroker();
    const w = peer(broker.endpoint, 'w-s');
    await w.sendJson(ready('w-s'));
    await w.waitFor('worker_welcome');
    await Promise.all([broker.stop(), broker.stop()]);
    expect(broker.stats().state).toBe('stopped');
    expect(await broker.send('w-s', committed())).toEqual({ ok: false, reason: 'closed' });
    await expect(broker.start()).rejects.toThrow(/stopped/);
  });
});
