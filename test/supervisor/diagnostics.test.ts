/** truncateUtf8 and describeError. */
import { describe, expect, it } from 'vitest';
import { CorralError } from '../../src/base/errors.ts';
import { MAX_DIAGNOSTIC_BYTES, describeError, truncateUtf8 } from '../../src/supervisor/index.ts';

const bytes = (s: string): number => Buffer.byteLength(s, 'utf8');

describe('truncateUtf8', () => {
  it('keeps text that fits', () => {
    expect(truncateUtf8('', 0)).toBe('');
    expect(truncateUtf8('hello', 5)).toBe('hello');
    expect(truncateUtf8('hello', 4)).toBe('hell');
    expect(truncateUtf8('héllo', 6)).toBe('héllo');
  });

  it('never splits a 2-, 3- or 4-byte character', () => {
    expect(truncateUtf8('éé', 3)).toBe('é'); // 2 + 2
    expect(truncateUtf8('a€', 3)).toBe('a'); // 1 + 3
    expect(truncateUtf8('a€', 4)).toBe('a€');
    expect(truncateUtf8('a😀', 4)).toBe('a'); // 1 + 4, a surrogate pair in UTF-16
    expect(truncateUtf8('a😀', 5)).toBe('a😀');
    expect(truncateUtf8('😀😀', 7)).toBe('😀');
    expect(truncateUtf8('😀', 3)).toBe('');
  });

  it('counts a lone surrogate as 3 bytes, like the encoder', () => {
    const lone = 'a\uD800b';
    expect(bytes(lone)).toBe(5);
    expect(truncateUtf8(lone, 4)).toBe('a\uD800');
    expect(truncateUtf8(lone, 3)).toBe('a');
  });

  it('returns the longest fitting prefix for every limit (exhaustive on a mixed string)', () => {
    const text = 'aé€😀b👩‍👩‍👧x\u0301中🇫🇷z';
    for (let max = 0; max <= bytes(text) + 2; max++) {
      const cut = truncateUtf8(text, max);
      expect(text.startsWith(cut)).toBe(true);
      expect(bytes(cut)).toBeLessThanOrEqual(max);
      const last = cut.charCodeAt(cut.length - 1);
      expect(last >= 0xd800 && last <= 0xdbff).toBe(false); // no dangling high surrogate
      if (cut.length < text.length) {
        const next = String.fromCodePoint(text.codePointAt(cut.length)!);
        expect(bytes(cut + next)).toBeGreaterThan(max); // maximal
      }
    }
  });

  it('rejects a bad limit', () => {
    expect(() => truncateUtf8('x', -1)).toThrow(/maxBytes/);
    expect(() => truncateUtf8('x', 1.5)).toThrow(/maxBytes/);
  });
});

describe('describeError', () => {
  it('names the error class and code, keeps stack frames, and stays within the limit', () => {
    const text = describeError(new CorralError('timeout', 'took too long'));
    expect(text.split('\n')[0]).toBe('CorralError [timeout]: took too long');
    expect(text).toMatch(/\n\s+at /);
    const huge = describeError(new Error('🙂'.repeat(5000)));
    expect(bytes(huge)).toBeLessThanOrEqual(MAX_DIAGNOSTIC_BYTES);
    expect(bytes(huge)).toBeGreaterThan(MAX_DIAGNOSTIC_BYTES - 4);
  });

  it('describes non-errors', () => {
    expect(describeError('plain')).toBe('plain');
    expect(describeError({ reason: 'x' })).toBe('{"reason":"x"}');
    expect(describeError(undefined)).toBe('undefined');
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    expect(describeError(cyclic)).toBe('[object Object]');
  });
});
