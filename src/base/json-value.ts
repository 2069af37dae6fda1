/** JSON values on the wire: the type, and the one check every message's free-form fields pass. */
import { z } from 'zod';

/** Any JSON value (what `JSON.parse` can return). */
export type JsonValue = string | number | boolean | null | JsonValue[] | { [key: string]: JsonValue };

/** True when `value` is a JSON value: null, a string, a boolean, a finite number, or arrays and plain objects of those. */
export function isJsonValue(value: unknown): value is JsonValue {
  const stack: unknown[] = [value];
  while (stack.length > 0) {
    const v = stack.pop();
    if (v === null || typeof v === 'string' || typeof v === 'boolean') continue;
    if (typeof v === 'number') {
      if (!Number.isFinite(v)) return false;
      continue;
    }
    if (Array.isArray(v)) {
      for (const item of v) stack.push(item);
      continue;
    }
    if (typeof v !== 'object') return false;
    const proto = Object.getPrototypeOf(v) as unknown;
    if (proto !== Object.prototype && proto !== null) return false;
    for (const key in v) stack.push((v as Record<string, unknown>)[key]);
  }
  return true;
}

/**
 * Any JSON value. A plain check instead of zod's recursive `z.json()` union: it runs on every
 * message content and context entry, where the union cost more than the rest of the message.
 */
export const jsonValueSchema = z.custom<JsonValue>((value) => isJsonValue(value), { message: 'expected a JSON value' });
