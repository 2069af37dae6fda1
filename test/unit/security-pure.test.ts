/** Pure parts of fabric security and storability: Z85, token checks, config rules, jsonb limits. */
import { describe, expect, it } from 'vitest';
import { isLocalEndpoint, loadConfig } from '../../src/config.ts';
import { newToken, tokenHash, tokenMatches, z85Encode } from '../../src/fabric/keys.ts';
import { storableText, unstorableReason } from '../../src/json-safety.ts';

describe('z85Encode', () => {
  it('matches the ZeroMQ RFC 32 test vector', () => {
    expect(z85Encode(Uint8Array.from([0x86, 0x4f, 0xd2, 0x6f, 0xb5, 0x59, 0xf7, 0x5b]))).toBe('HelloWorld');
  });
  it('encodes a 32-byte key as 40 characters and refuses other lengths', () => {
    expect(z85Encode(new Uint8Array(32).fill(255))).toHaveLength(40);
    expect(() => z85Encode(new Uint8Array(3))).toThrow(/multiple of 4/);
  });
});

describe('registration tokens', () => {
  it('match only their own hash', () => {
    const t = newToken();
    expect(tokenMatches(t, tokenHash(t))).toBe(true);
    expect(tokenMatches(`${t}x`, tokenHash(t))).toBe(false);
    expect(tokenMatches(t, 'not-hex')).toBe(false);
  });
});

describe('security configuration', () => {
  it('knows loopback endpoints', () => {
    for (const e of ['tcp://127.0.0.1:5555', 'tcp://localhost:1', 'tcp://[::1]:5', 'ipc:///tmp/x', 'inproc://a'])
      expect(isLocalEndpoint(e)).toBe(true);
    for (const e of ['tcp://0.0.0.0:5555', 'tcp://*:5555', 'tcp://10.0.0.1:5', 'tcp://host.example:5'])
      expect(isLocalEndpoint(e)).toBe(false);
  });
  it('refuses --insecure on a remote endpoint unless --insecure-remote', () => {
    expect(() => loadConfig({ insecure: true, endpoint: 'tcp://0.0.0.0:5555' })).toThrow(/insecure-remote/);
    expect(loadConfig({ insecure: true, insecureRemote: true, endpoint: 'tcp://0.0.0.0:5555' }).insecure).toBe(true);
    expect(loadConfig({ endpoint: 'tcp://0.0.0.0:5555' }).insecure).toBe(false);
    expect(loadConfig({}, { CORRAL_INSECURE: '1' }).insecure).toBe(true);
  });
  it('keeps the event limit under half the wire limit', () => {
    expect(() => loadConfig({ maxEventBytes: 600_000 })).toThrow(/maxEventBytes/);
  });
});

describe('unstorableReason', () => {
  it('finds NUL, lone surrogates (in values and keys) and non-finite numbers, with a path', () => {
    expect(unstorableReason({ a: [1, 'x\u0000'] })).toMatch(/^\$\.a\[1\]: .*NUL/);
    expect(unstorableReason(['\ud800'])).toMatch(/surrogate/);
    expect(unstorableReason({ ['k\udc00']: 1 })).toMatch(/key .*surrogate/);
    expect(unstorableReason({ n: JSON.parse('1e400') as number })).toMatch(/out of range/);
    expect(unstorableReason({ ok: ['😀', 1.5, null, true, { x: 'y' }] })).toBeNull();
  });
  it('storableText replaces what cannot be stored', () => {
    expect(storableText('a\u0000b\ud800c')).toBe('a\ufffdb\ufffdc');
  });
});
