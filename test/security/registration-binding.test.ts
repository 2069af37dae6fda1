/**
 * A worker id registers only with a proof made from its own secret key (docs/protocol.md §13), on
 * real CURVE sockets: the token of another worker is not enough, and a nonce is good for one
 * attempt, on its own connection, for a few seconds. Registrations and their log lines are
 * limited per key.
 */
import { randomBytes } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { systemClock, type Clock } from '../../src/base/clock.ts';
import { workerProof } from '../../src/fabric/proof.ts';
import type { Msg, RawPeer } from '../helpers/raw-peer.ts';
import { waitFor } from '../helpers/wait.ts';
import { startCurveBroker, type CurveBroker, type IssuedKey } from './curve-broker.ts';

const brokers: CurveBroker[] = [];
afterEach(async () => {
  for (const b of brokers.splice(0)) await b.stop();
});

async function start(over: Parameters<typeof startCurveBroker>[0] = {}): Promise<CurveBroker> {
  const b = await startCurveBroker(over);
  brokers.push(b);
  return b;
}

const ready = (key: IssuedKey, auth: Record<string, unknown>) => ({
  type: 'worker_ready',
  worker_id: key.worker_id,
  capacity: 1,
  auth: { scheme: 'key', credential: key.token, ...auth },
});

/** Asks for a challenge on `p` and returns its nonce. */
async function challenge(p: RawPeer, key: IssuedKey): Promise<string> {
  await p.send(ready(key, {}));
  return (await p.next('worker_challenge', (m) => m.worker_id === key.worker_id)).nonce as string;
}

const answer = (p: RawPeer): Promise<Msg> => p.next('', (m) => m.type === 'worker_welcome' || m.type === 'error');
const proofOf = (key: IssuedKey, nonce: string) => workerProof(key.secret_key, key.server_key, key.worker_id, nonce);

describe('registration bound to the key', () => {
  it("refuses a worker's token over another key's connection: unauthorized", async () => {
    const b = await start();
    const victim = b.issue('victim');
    const intruder = b.issue('intruder');
    const p = b.peer(intruder);
    // the token alone (the scheme registrations used to need), and with the key scheme
    await p.send({ type: 'worker_ready', worker_id: 'victim', capacity: 1, auth: { scheme: 'token', credential: victim.token } });
    expect(await p.next('error')).toMatchObject({ code: 'unauthorized', message: expect.stringMatching(/token alone/) });
    const nonce = await challenge(p, victim);
    // the intruder can prove only its own key
    await p.send(ready(victim, { nonce, proof: workerProof(intruder.secret_key, intruder.server_key, 'victim', nonce) }));
    expect(await answer(p)).toMatchObject({ type: 'error', code: 'unauthorized', message: 'bad key proof' });
    expect(b.broker.isRegistered('victim')).toBe(false);
    expect(b.events.filter((e) => e.kind === 'worker_ready')).toEqual([]);
    // the victim's own key, on its own connection, registers it
    expect(await b.peer(victim).registerWithKey(victim)).toMatchObject({ type: 'worker_welcome', worker_id: 'victim' });
  });

  it("refuses a proof for another connection's nonce, a replayed nonce, a wrong proof and an expired nonce", async () => {
    let skewMs = 0;
    const clock: Clock = { ...systemClock, nowMs: () => Date.now() + skewMs };
    const b = await start({ clock });
    const key = b.issue('w-1');
    const [p1, p2] = [b.peer(key), b.peer(key)];
    const n1 = await challenge(p1, key);
    const n2 = await challenge(p2, key);
    expect(n1).not.toBe(n2);
    // p2 presents p1's nonce (with a right proof for it): refused, and p2's own challenge is used up
    await p2.send(ready(key, { nonce: n1, proof: proofOf(key, n1) }));
    expect(await answer(p2)).toMatchObject({ type: 'error', code: 'unauthorized', message: expect.stringMatching(/nonce/) });
    await p2.send(ready(key, { nonce: n2, proof: proofOf(key, n2) }));
    expect(await answer(p2)).toMatchObject({ type: 'error', code: 'unauthorized', message: expect.stringMatching(/nonce/) });
    // p1's nonce is still good on p1
    await p1.send(ready(key, { nonce: n1, proof: proofOf(key, n1) }));
    expect(await answer(p1)).toMatchObject({ type: 'worker_welcome' });
    // the same message again: the nonce was used
    await p1.send(ready(key, { nonce: n1, proof: proofOf(key, n1) }));
    expect(await answer(p1)).toMatchObject({ type: 'error', code: 'unauthorized', message: expect.stringMatching(/nonce/) });
    expect(b.broker.isRegistered('w-1')).toBe(true); // the live session stands
    // a wrong proof
    const n3 = await challenge(p2, key);
    await p2.send(ready(key, { nonce: n3, proof: randomBytes(32).toString('base64url') }));
    expect(await answer(p2)).toMatchObject({ type: 'error', code: 'unauthorized', message: 'bad key proof' });
    expect(b.broker.stats().takeoverRefused).toBe(1); // p2's wrong proof, for the id live on p1
    // a nonce older than its 10 s
    const n4 = await challenge(p2, key);
    skewMs = 10_001;
    await p2.send(ready(key, { nonce: n4, proof: proofOf(key, n4) }));
    expect(await answer(p2)).toMatchObject({ type: 'error', code: 'unauthorized', message: expect.stringMatching(/nonce/) });
    expect(b.events.filter((e) => e.kind === 'worker_ready')).toHaveLength(1);
    // a malformed nonce or proof never reaches the check
    await p2.send(ready(key, { nonce: 'short', proof: 'x' }));
    expect(await answer(p2)).toMatchObject({ type: 'error', code: 'invalid_message', message: expect.stringMatching(/auth\.nonce/) });
  });

  it('keeps one challenge per connection: a repeated ask gets the same nonce, a flood is dropped', async () => {
    const b = await start();
    const key = b.issue('w-1');
    const p = b.peer(key);
    for (let i = 0; i < 20; i++) await p.send(ready(key, {}));
    await waitFor(() => b.broker.stats().received >= 20, { what: '20 asks received' });
    await p.next('worker_challenge');
    const challenges = p.ofType('worker_challenge');
    expect(new Set(challenges.map((c) => c.nonce)).size).toBe(1);
    expect(challenges.length).toBeLessThanOrEqual(5);
    expect(b.broker.stats()).toMatchObject({ challengesOutstanding: 1, challenges: challenges.length });
    expect(b.broker.stats().refusalsSuppressed).toBeGreaterThanOrEqual(15);
    // its end drops its challenge
    await p.close();
    await waitFor(() => b.broker.stats().challengesOutstanding === 0, { what: 'the challenge dropped with its connection' });
  });

  it('rate-limits the registrations of one key flapping between two connections, and their log lines', async () => {
    const b = await start({ registrationsPerKeyPerS: 1, maxConnectionsPerKey: 4 });
    const key = b.issue('flapper');
    const peers = [b.peer(key), b.peer(key)];
    const answered = new Set<string>();
    const accepted = () => b.events.filter((e) => e.kind === 'worker_ready').length;
    const decided = () => accepted() + b.broker.stats().registrationsRateLimited;
    /** One re-registration on `p`: ask until a new challenge comes, prove it, wait for the decision. */
    const flap = async (p: RawPeer): Promise<void> => {
      const nonce = await waitFor(
        async () => {
          await p.send(ready(key, {}));
          return p.ofType('worker_challenge').find((c) => !answered.has(c.nonce))?.nonce;
        },
        { what: 'a new challenge', intervalMs: 20, timeoutMs: 5_000 },
      );
      answered.add(nonce);
      await p.send(ready(key, { nonce, proof: proofOf(key, nonce) }));
      await waitFor(() => decided() === answered.size, { what: 'the proof decided', intervalMs: 2 });
    };
    const startedAt = Date.now();
    // 600 asks as fast as they go, alternating: challenges are limited per connection, answers too
    for (let i = 0; i < 600; i++) await peers[i % 2]!.send(ready(key, {}));
    await waitFor(() => b.broker.stats().received >= 600, { what: '600 asks received' });
    expect(peers.flatMap((p) => p.ofType('worker_challenge')).length).toBeLessThanOrEqual(2 * 5 * 2);
    // then 30 registrations with right proofs, alternating between the two connections
    for (let i = 0; i < 30; i++) await flap(peers[i % 2]!);
    const elapsedS = (Date.now() - startedAt) / 1000;
    // every accepted registration was welcomed (the last welcome may still be on its way)
    const welcomes = () => peers.reduce((n, p) => n + p.ofType('worker_welcome').length, 0);
    await waitFor(() => welcomes() >= accepted(), { what: 'the welcomes of the accepted registrations', timeoutMs: 5_000 });
    expect(welcomes()).toBe(accepted());
    // a burst of 5, then one per second
    expect(accepted()).toBeGreaterThanOrEqual(5);
    expect(accepted()).toBeLessThanOrEqual(5 + Math.ceil(elapsedS) + 1);
    expect(b.broker.stats().registrationsRateLimited).toBe(30 - accepted());
    expect(peers.flatMap((p) => p.ofType('error')).filter((e) => e.code === 'rate_limited').length).toBeGreaterThan(0);
    // log lines: registration lines at most 10 per 10 s for the key; refusals at most 10 per connection per second
    const registrationLines = b.logs.filter((l) =>
      ['worker registered', 'worker moved to a new connection', 'registration rate-limited'].includes(l.msg),
    );
    expect(registrationLines.length).toBeLessThanOrEqual(10 * Math.ceil(elapsedS / 10));
    expect(b.logs.filter((l) => l.msg === 'refused worker message').length).toBeLessThanOrEqual(2 * 10 * (Math.ceil(elapsedS) + 1));
    expect(b.logs.length).toBeLessThan(100);
    expect(b.broker.stats().logsSuppressed).toBeGreaterThan(0);
  });

  it('reports the key scope on worker_ready, and nothing for a key without one', async () => {
    const b = await start();
    const scoped = b.issue('scoped', { agents: ['support-*', 'billing'] });
    const open = b.issue('open');
    expect(await b.peer(scoped).registerWithKey(scoped)).toMatchObject({ type: 'worker_welcome' });
    expect(await b.peer(open).registerWithKey(open)).toMatchObject({ type: 'worker_welcome' });
    const readies = b.events.filter((e) => e.kind === 'worker_ready');
    expect(readies).toMatchObject([{ workerId: 'scoped', agents: ['support-*', 'billing'] }, { workerId: 'open' }]);
    expect(readies[1]).not.toHaveProperty('agents');
  });
});
