/**
 * Connections are limited per key (src/fabric/admission.ts), on real CURVE sockets: one key's
 * idle connections never take the connections another key needs, whatever routing ids it uses.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { waitFor } from '../helpers/wait.ts';
import { startCurveBroker, type CurveBroker } from './curve-broker.ts';

const brokers: CurveBroker[] = [];
afterEach(async () => {
  for (const b of brokers.splice(0)) await b.stop();
});

async function start(over: Parameters<typeof startCurveBroker>[0]): Promise<CurveBroker> {
  const b = await startCurveBroker(over);
  brokers.push(b);
  return b;
}

describe('connection limits per key', () => {
  it('refuses the N+1th connection of one key at the handshake while another key still connects', async () => {
    const b = await start({ maxConnectionsPerKey: 3, maxConnections: 64 });
    const hog = b.issue('hog');
    const other = b.issue('other');
    const idle = [0, 1, 2].map(() => b.watched(hog));
    await waitFor(() => idle.every((p) => p.events.includes('handshake')) && b.broker.stats().connections === 3, {
      what: 'three idle connections of one key',
      timeoutMs: 10_000,
    });

    const extra = b.watched(hog);
    await waitFor(() => extra.events.includes('handshake:error:auth'), { what: 'the fourth refused', timeoutMs: 10_000 });
    expect(extra.events).not.toContain('handshake');
    expect(b.broker.stats()).toMatchObject({ connections: 3, keyConnectionsRefused: 1, connectionsRefused: 0 });
    expect(b.logs.filter((l) => l.msg === 'connection refused: connection limit per key reached (3)')).toMatchObject([{ key: 'hog' }]);

    // another key is not affected: it connects and registers
    const p = b.peer(other);
    expect(await p.registerWithKey(other)).toMatchObject({ type: 'worker_welcome', worker_id: 'other' });
    expect(b.broker.stats().connections).toBe(4);

    // a registered session still counts against its key
    expect(await idle[0]!.peer.registerWithKey(hog)).toMatchObject({ type: 'worker_welcome' });
    const again = b.watched(hog);
    await waitFor(() => again.events.includes('handshake:error:auth'), { what: 'still refused', timeoutMs: 10_000 });

    // a connection that ends gives its place back
    await idle[1]!.peer.close();
    await waitFor(() => b.broker.stats().connections === 3, { what: 'the closed connection released' });
    const next = b.watched(hog);
    await waitFor(() => next.events.includes('handshake'), { what: 'a new connection of the key admitted', timeoutMs: 10_000 });
    expect(b.broker.stats()).toMatchObject({ connections: 4, keyConnectionsRefused: 2 });
  });

  it('keeps counting a connection whose routing id libzmq never shows (a reused live routing id)', async () => {
    const b = await start({ maxConnectionsPerKey: 2, attachWaitMs: 200 });
    const hog = b.issue('hog');
    const first = b.watched(hog, 'same-id');
    await waitFor(() => b.broker.stats().connections === 1 && first.events.includes('handshake'), { what: 'first connection' });
    // the same routing id again: admitted at the handshake, then ignored by the ROUTER, which
    // delivers nothing of it, not even its connect notification
    const twin = b.watched(hog, 'same-id');
    await waitFor(() => b.broker.stats().connectionsUnattributed === 1, { what: 'the twin counted unattributed', timeoutMs: 5_000 });
    expect(twin.events).toContain('handshake');
    expect(b.logs.some((l) => l.msg.startsWith('an admitted connection never appeared') && l.key === 'hog')).toBe(true);
    // so the key is at its limit: two live connections, though the broker sees one
    const third = b.watched(hog);
    await waitFor(() => third.events.includes('handshake:error:auth'), { what: 'the third refused', timeoutMs: 10_000 });
    expect(b.broker.stats()).toMatchObject({ connections: 2, keyConnectionsRefused: 1 });
    const other = b.issue('other');
    expect(await b.peer(other).registerWithKey(other)).toMatchObject({ type: 'worker_welcome' });
  });

  it('still caps connections per daemon, counting every key', async () => {
    const b = await start({ maxConnectionsPerKey: 2, maxConnections: 3 });
    const keys = [b.issue('a'), b.issue('b')];
    const live = [b.watched(keys[0]!), b.watched(keys[0]!), b.watched(keys[1]!)];
    await waitFor(() => live.every((p) => p.events.includes('handshake')) && b.broker.stats().connections === 3, {
      what: 'three connections',
    });
    const over = b.watched(keys[1]!);
    await waitFor(() => over.events.includes('handshake:error:auth'), { what: 'refused at the daemon cap', timeoutMs: 10_000 });
    expect(b.broker.stats()).toMatchObject({ connections: 3, connectionsRefused: 1, keyConnectionsRefused: 0 });
  });

  it('admits one connection at a time and serves keys in turn under a burst of handshakes', async () => {
    const b = await start({ maxConnectionsPerKey: 20, maxConnections: 200 });
    const keys = ['k1', 'k2', 'k3'].map((id) => b.issue(id));
    const all = keys.flatMap((k) => Array.from({ length: 15 }, () => b.watched(k)));
    await waitFor(() => all.every((p) => p.events.includes('handshake')) && b.broker.stats().connections === 45, {
      what: 'a burst of 45 handshakes admitted',
      timeoutMs: 20_000,
    });
    expect(b.broker.stats()).toMatchObject({ admissionsQueued: 0, connectionsUnattributed: 0, keyConnectionsRefused: 0 });
    // each connection is tied to its key: closing one key's connections frees exactly those
    await Promise.all(all.slice(0, 15).map((p) => p.peer.close()));
    await waitFor(() => b.broker.stats().connections === 30, { what: "k1's connections released" });
    const k2more = Array.from({ length: 6 }, () => b.watched(keys[1]!));
    const settled = (p: { events: string[] }) => p.events.includes('handshake') || p.events.includes('handshake:error:auth');
    await waitFor(() => k2more.every(settled), { what: "k2's six more handshakes settled", timeoutMs: 10_000 });
    // k2 held 15 of its 20: five more are admitted, the sixth refused (which one is up to the scheduler)
    expect(k2more.filter((p) => p.events.includes('handshake:error:auth'))).toHaveLength(1);
    expect(b.broker.stats()).toMatchObject({ connections: 35, keyConnectionsRefused: 1 });
  });
});
