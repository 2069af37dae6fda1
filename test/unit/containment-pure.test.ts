/**
 * Pure parts of fabric containment: the key proof and its documented test vector, Z85 decoding,
 * the authenticator's decisions, allow-list scopes, the rate limits and the connection book.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { curveKeyPair } from 'zeromq';
import { ManualClock } from '../../src/base/clock.ts';
import { silentLogger } from '../../src/base/logger.ts';
import { ConnectionBook, NO_KEY } from '../../src/fabric/admission.ts';
import { KeyAuthenticator } from '../../src/fabric/auth.ts';
import {
  addWorkerKey,
  checkedScope,
  ensureDaemonKey,
  keyPaths,
  readAllowlist,
  tokenHash,
  writeAllowlist,
  z85Decode,
  z85Encode,
} from '../../src/fabric/keys.ts';
import { TokenBuckets, WindowCounter } from '../../src/base/rate-limits.ts';
import { curveSharedSecret, newNonce, proofMatches, registrationProof, workerProof } from '../../src/fabric/proof.ts';
import { FabricSecurity } from '../../src/fabric/security.ts';
import type { ZapDecision } from '../../src/fabric/zap.ts';

// the keys of the zmq_curve(7) manual page; docs/protocol.md §13 gives the same vector
const SERVER = { publicKey: 'rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7', secretKey: 'JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6' };
const CLIENT = { publicKey: 'Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID', secretKey: 'D:)Q[IlAW!ahhC2ac:9*A}h:p?([4%wOTJ%JR%cs' };
const NONCE = 'AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8';
const SHARED_HEX = '535e8ec77a336a164c2484095d83b7e5f902a695c27482af6e07e09e31611b1c';
const PROOF = 'Nx176iIb1F4YfY5UyNc0-1M4wkQrLT8h2Mw9TbhCtWM';

describe('the key proof', () => {
  it('matches the test vector of docs/protocol.md §13, from either end of the key pair', () => {
    expect(Buffer.from(NONCE, 'base64url')).toEqual(Buffer.from(Array.from({ length: 32 }, (_, i) => i)));
    expect(curveSharedSecret(CLIENT.secretKey, SERVER.publicKey).toString('hex')).toBe(SHARED_HEX);
    expect(curveSharedSecret(SERVER.secretKey, CLIENT.publicKey).toString('hex')).toBe(SHARED_HEX);
    expect(workerProof(CLIENT.secretKey, SERVER.publicKey, 'gpu-box-1', NONCE)).toBe(PROOF);
    const doc = readFileSync(join(import.meta.dirname, '../../docs/protocol.md'), 'utf8');
    for (const value of [SERVER.publicKey, SERVER.secretKey, CLIENT.publicKey, CLIENT.secretKey, NONCE, SHARED_HEX, PROOF]) {
      expect(doc).toContain(value);
    }
  });

  it('holds only for its id, nonce and key pair', () => {
    const shared = curveSharedSecret(SERVER.secretKey, CLIENT.publicKey);
    expect(proofMatches(shared, 'gpu-box-1', NONCE, PROOF)).toBe(true);
    expect(proofMatches(shared, 'gpu-box-2', NONCE, PROOF)).toBe(false);
    expect(proofMatches(shared, 'gpu-box-1', newNonce(), PROOF)).toBe(false);
    expect(proofMatches(curveSharedSecret(SERVER.secretKey, curveKeyPair().publicKey), 'gpu-box-1', NONCE, PROOF)).toBe(false);
    for (const bad of ['', PROOF.slice(1), `${PROOF}A`, PROOF.replace('-', '+')])
      expect(proofMatches(shared, 'gpu-box-1', NONCE, bad)).toBe(false);
    expect(registrationProof(shared, 'gpu-box-1', NONCE)).toBe(PROOF);
  });

  it('refuses keys that are not 40 characters of Z85', () => {
    expect(() => curveSharedSecret(CLIENT.secretKey.slice(1), SERVER.publicKey)).toThrow(/secret key/);
    expect(() => curveSharedSecret(CLIENT.secretKey, `${SERVER.publicKey.slice(1)}~`)).toThrow();
  });
});

describe('z85Decode', () => {
  it('inverts z85Encode (ZeroMQ RFC 32 vector) and refuses what is not Z85', () => {
    expect([...z85Decode('HelloWorld')]).toEqual([0x86, 0x4f, 0xd2, 0x6f, 0xb5, 0x59, 0xf7, 0x5b]);
    const { publicKey } = curveKeyPair();
    expect(z85Encode(z85Decode(publicKey))).toBe(publicKey);
    expect(() => z85Decode('abcd')).toThrow(/multiple of 5/);
    expect(() => z85Decode('abcd~')).toThrow(/Z85 character/);
    expect(() => z85Decode('#####')).toThrow(/out of range/);
  });
});

describe('KeyAuthenticator', () => {
  const daemon = curveKeyPair();
  const worker = curveKeyPair();
  const auth = new KeyAuthenticator({ daemonSecretKey: daemon.secretKey }, [
    { worker_id: 'w', public_key: worker.publicKey, token_sha256: tokenHash('t'.repeat(16)), capacity: 2, agents: ['a-*'] },
  ]);
  const token = 't'.repeat(16);
  const nonce = newNonce();
  const proof = workerProof(worker.secretKey, daemon.publicKey, 'w', nonce);
  const ctx = { routingId: 'r', nonce };

  it('asks for a proof, then accepts only the right one over the connection’s own nonce', () => {
    expect(auth.verify('w', { scheme: 'key', credential: token }, { routingId: 'r' })).toMatchObject({ ok: false, challenge: true });
    expect(auth.verify('w', { scheme: 'key', credential: token, nonce, proof }, ctx)).toEqual({
      ok: true,
      key: worker.publicKey,
      maxCapacity: 2,
      agents: ['a-*'],
    });
    expect(auth.verify('w', { scheme: 'key', credential: token, nonce, proof }, { routingId: 'r' })).toMatchObject({ ok: false });
    expect(auth.verify('w', { scheme: 'key', credential: token, nonce, proof }, { routingId: 'r', nonce: newNonce() })).toMatchObject({
      ok: false,
    });
    expect(auth.verify('w', { scheme: 'key', credential: token, nonce, proof: PROOF }, ctx)).toEqual({
      ok: false,
      reason: 'bad key proof',
    });
  });

  it('refuses the token alone, a wrong token (before any challenge) and unknown ids', () => {
    expect(auth.verify('w', { scheme: 'token', credential: token }, ctx)).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/token alone/),
    });
    expect(auth.verify('w', { scheme: 'key', credential: 'wrong-token-000000' }, ctx)).toEqual({ ok: false, reason: 'bad credential' });
    expect(auth.verify('w', undefined, ctx)).toMatchObject({ ok: false });
    expect(auth.verify('other', { scheme: 'key', credential: token }, ctx)).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/allow-list/),
    });
  });
});

describe('agent scopes of allow-list entries', () => {
  it('are checked when issued and when read, and survive the file', () => {
    const home = mkdtempSync(join(tmpdir(), 'corral-scope-'));
    try {
      const paths = keyPaths(home);
      const { keys } = ensureDaemonKey(paths);
      addWorkerKey(paths, keys.publicKey, 'scoped', { agents: ['support-*', 'billing', 'billing'] });
      expect(readAllowlist(paths.allowlist)[0]).toMatchObject({ worker_id: 'scoped', agents: ['support-*', 'billing'] });
      expect(() => addWorkerKey(paths, keys.publicKey, 'x', { agents: ['a b'] })).toThrow(/invalid agent pattern/);
      expect(() => checkedScope([])).toThrow(/at least one/);
      expect(() => checkedScope(Array.from({ length: 65 }, (_, i) => `a${i}`))).toThrow(/at most 64/);
      const [entry] = readAllowlist(paths.allowlist);
      for (const agents of [[], ['ok', 'no*t'], Array.from({ length: 65 }, (_, i) => `a${i}`), ['x'.repeat(130)]]) {
        writeAllowlist(paths.allowlist, [{ ...entry!, agents }]);
        expect(() => readAllowlist(paths.allowlist)).toThrow(/allow-list .* is invalid: workers\.0\.agents/);
      }
    } finally {
      rmSync(home, { recursive: true, force: true });
    }
  });

  it('a changed scope revokes the worker, so it registers again under the new one', () => {
    const home = mkdtempSync(join(tmpdir(), 'corral-scope-'));
    try {
      const security = new FabricSecurity({ homeDir: home, pollMs: 1000, clock: new ManualClock(), logger: silentLogger });
      const paths = keyPaths(home);
      addWorkerKey(paths, security.keys.publicKey, 'w', { agents: ['a'] });
      addWorkerKey(paths, security.keys.publicKey, 'same');
      expect(security.refresh()).toEqual([]);
      const revoked: Array<[string, string]> = [];
      security.start((id, why) => void revoked.push([id, why]));
      const entries = readAllowlist(paths.allowlist);
      writeAllowlist(
        paths.allowlist,
        entries.map((e) => (e.worker_id === 'w' ? { ...e, agents: ['a', 'b'] } : e)),
      );
      expect(security.refresh()).toEqual(['w']);
      expect(revoked).toEqual([['w', 'agent scope changed']]);
      expect(security.authenticator.entry('w')?.agents).toEqual(['a', 'b']);
      security.stop();
    } finally {
      rmSync(home, { recursive: true, force: true });
    }
  });
});

describe('rate limits', () => {
  it('a window counter allows `limit` per window and reports what it left out', async () => {
    const clock = new ManualClock();
    const w = new WindowCounter(clock, 2, 1000);
    expect([w.take('k'), w.take('k'), w.take('k'), w.take('k')].map((r) => r.ok)).toEqual([true, true, false, false]);
    expect(w.take('other').ok).toBe(true);
    await clock.advance(1000);
    expect(w.take('k')).toEqual({ ok: true, refusedBefore: 2 });
    expect(w.take('k')).toEqual({ ok: true, refusedBefore: 0 });
  });

  it('a token bucket gives a burst, then its rate', async () => {
    const clock = new ManualClock();
    const b = new TokenBuckets(clock, 1, 5);
    expect(Array.from({ length: 7 }, () => b.take('k'))).toEqual([true, true, true, true, true, false, false]);
    await clock.advance(999);
    expect(b.take('k')).toBe(false);
    await clock.advance(1);
    expect([b.take('k'), b.take('k')]).toEqual([true, false]);
    expect(b.take('other')).toBe(true);
  });
});

describe('ConnectionBook', () => {
  /** A book whose answers are recorded; `deliver` says whether a reply reaches its peer. */
  function book(over: { maxConnections?: number; maxPerKey?: number } = {}) {
    const clock = new ManualClock();
    const answered: Array<{ decision: ZapDecision; settle: (delivered: boolean) => void }> = [];
    const b = new ConnectionBook({
      maxConnections: over.maxConnections ?? 100,
      maxPerKey: over.maxPerKey ?? 2,
      attachWaitMs: 1000,
      clock,
      log: silentLogger,
    });
    const ask = (key: string) =>
      b.request(key, (decision) => new Promise<boolean>((resolve) => answered.push({ decision, settle: resolve })));
    return { b, clock, answered, ask };
  }
  const flush = () => new Promise((r) => setImmediate(r));

  it('answers one admission at a time and ties the next new routing id to it', async () => {
    const { b, answered, ask } = book();
    expect(ask('A')).toBeUndefined();
    expect(ask('B')).toBeUndefined();
    expect(answered).toHaveLength(1); // B waits until A's connection appears
    answered[0]!.settle(true);
    await flush();
    b.connected('r1');
    expect(b.keyOf('r1')).toBe('A');
    expect(answered).toHaveLength(2);
    answered[1]!.settle(true);
    await flush();
    b.connected('r2');
    expect(b.keyOf('r2')).toBe('B');
    expect(ask('A')).toBeUndefined();
    answered[2]!.settle(true);
    expect(ask('A')).toMatchObject({ ok: false, perKey: true }); // A: r1 + one admitted
    b.disconnected('r1');
    expect(b.stats()).toEqual({ connections: 2, queued: 0, unattributed: 0 });
  });

  it('releases an admission whose reply did not reach its peer; keeps one that never appeared', async () => {
    const { b, clock, answered, ask } = book();
    ask('A');
    answered[0]!.settle(false);
    await flush();
    expect(b.stats().connections).toBe(0);
    ask('A');
    answered[1]!.settle(true);
    await flush();
    await clock.advance(1020);
    expect(b.stats()).toEqual({ connections: 1, queued: 0, unattributed: 1 });
    // a connection that shows up late takes that charge; its end releases it
    b.connected('late');
    expect(b.keyOf('late')).toBe('A');
    expect(b.stats().unattributed).toBe(0);
    b.disconnected('late');
    expect(b.stats().connections).toBe(0);
  });

  it('serves queued keys in turn, and applies no per-key limit without CURVE', async () => {
    const { b, answered, ask } = book({ maxPerKey: 3, maxConnections: 5 });
    for (const k of ['A', 'A', 'A', 'B']) expect(ask(k)).toBeUndefined();
    const order: string[] = [];
    for (let i = 0; i < 4; i++) {
      answered[i]!.settle(true);
      await flush();
      b.connected(`r${i}`);
      order.push(b.keyOf(`r${i}`)!);
    }
    // the first A was answered before the others came; then B is served before A's third
    expect(order).toEqual(['A', 'A', 'B', 'A']);
    expect(ask('C')).toBeUndefined();
    expect(ask('C')).toMatchObject({ ok: false, perKey: false, reason: 'connection limit reached' });
    const open = book({ maxPerKey: 1 });
    expect([open.ask(NO_KEY), open.ask(NO_KEY), open.ask(NO_KEY)]).toEqual([undefined, undefined, undefined]);
  });
});
