/**
 * What PostgreSQL's jsonb cannot keep: the NUL character (`\u0000`) and lone UTF-16 surrogates in
 * any string or key, and numbers JSON cannot represent (`1e400` parses to Infinity, which
 * `JSON.stringify` would silently turn into `null`). Found here, such a value is refused with a
 * clear reason instead of failing deep inside a transaction (or being changed without a word).
 */

/** Why `value` cannot be stored as jsonb, with the path of the first offender; null when it can. */
export function unstorableReason(value: unknown): string | null {
  const stack: Array<{ v: unknown; path: string }> = [{ v: value, path: '$' }];
  while (stack.length > 0) {
    const { v, path } = stack.pop()!;
    if (typeof v === 'string') {
      const why = badString(v);
      if (why) return `${path}: ${why}`;
    } else if (typeof v === 'number') {
      if (!Number.isFinite(v)) return `${path}: number out of range for JSON (${String(v)})`;
    } else if (Array.isArray(v)) {
      for (let i = v.length - 1; i >= 0; i--) stack.push({ v: v[i], path: `${path}[${i}]` });
    } else if (v !== null && typeof v === 'object') {
      for (const [k, child] of Object.entries(v)) {
        const why = badString(k);
        if (why) return `${path}: key ${why}`;
        stack.push({ v: child, path: `${path}.${k.slice(0, 40)}` });
      }
    }
  }
  return null;
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

function badString(s: string): string | null {
  if (s.includes('\u0000')) return 'contains \\u0000 (NUL), which PostgreSQL cannot store';
  if (LONE_SURROGATE.test(s)) return 'contains a lone UTF-16 surrogate, which PostgreSQL cannot store';
  return null;
}

const LONE_SURROGATES = new RegExp(LONE_SURROGATE.source, 'g');

/** `s` with NULs and lone surrogates replaced by U+FFFD: for diagnostic text that must be kept. */
export function storableText(s: string): string {
  return s.replace(/\u0000/g, '\uFFFD').replace(LONE_SURROGATES, '\uFFFD');
}
