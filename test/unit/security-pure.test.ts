/** Pure parts of fabric security and storability: Z85, token checks, config rules, jsonb limits. */
import { describe, expect, it } from 'vitest';
import { isLocalEndpoint, loadConfig } from '../../src/config.ts';
import { newToken, tokenHash, tokenMatches, z85Encode } from '../../src/fabric/keys.ts';
import { loggableError } from '../../src/base/errors.ts';
import { MAX_JSON_DEPTH, TOO_DEEP, pruneDeepJson, storableText, unstorableReason } from '../../src/base/json-safety.ts';

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
  it('refuses values nested deeper than MAX_JSON_DEPTH, at any depth, without recursion', () => {
    const nest = (n: number, inner: unknown = 1) => {
      let v: unknown = inner;
      for (let i = 0; i < n; i++) v = i % 2 ? [v] : { k: v };
      return v;
    };
    expect(MAX_JSON_DEPTH).toBe(100);
    expect(unstorableReason(nest(100))).toBeNull();
    expect(unstorableReason(nest(101))).toMatch(/nested deeper than 100 levels/);
    // a million levels: found at level 101, the path shortened
    const why = unstorableReason(nest(1_000_000), '$.output')!;
    expect(why).toMatch(/^\$\.output.*….*: nested deeper than 100 levels/);
    expect(why.length).toBeLessThan(200);
    expect(unstorableReason(nest(50, TOO_DEEP))).toMatch(/nested deeper/);
    expect(unstorableReason(nest(3, 'fine'), '$', 3)).toBeNull();
    expect(unstorableReason(nest(4), '$', 3)).toMatch(/deeper than 3/);
  });

  it('pruneDeepJson cuts what opens too deep, skipping strings, and leaves the rest as it is', () => {
    const text = '{"a":[[["x"]]],"s":"[[[[\\"[[[","b":{"c":{"d":{}}}}';
    expect(pruneDeepJson(text, 4)).toBe(text);
    expect(JSON.parse(pruneDeepJson(text, 3))).toEqual({ a: [[TOO_DEEP]], s: '[[[["[[[', b: { c: { d: TOO_DEEP } } });
    expect(pruneDeepJson('[[1],[[2]],3]', 1)).toBe(`[${JSON.stringify(TOO_DEEP)},${JSON.stringify(TOO_DEEP)},3]`);
    const million = '['.repeat(1_000_000) + ']'.repeat(1_000_000);
    expect(pruneDeepJson(million, 2)).toBe(`[[${JSON.stringify(TOO_DEEP)}]]`);
  });

  it('loggableError bounds what an error puts in a log line', () => {
    const huge = new Error(`Failed query: insert ... params: ${'['.repeat(500_000)}`, { cause: new Error('x'.repeat(10_000)) });
    Object.assign(huge, { query: 'q'.repeat(100_000), params: ['p'.repeat(100_000)] });
    const logged = loggableError(huge);
    expect(JSON.stringify(logged).length).toBeLessThan(8_000);
    expect(logged).toMatchObject({ type: 'Error', message: expect.stringMatching(/^Failed query.*more characters\)$/) });
    expect(logged).not.toHaveProperty('params');
  });

  it('storableText replaces what cannot be stored', () => {
    expect(storableText('a\u0000b\ud800c')).toBe('a\ufffdb\ufffdc');
  });
});
