/**
 * HTML written as template strings, escaped by construction: `markup\`…\`` escapes every value it
 * is given (`& < > " '`) unless that value is itself `markup\`…\``'s result (`Html`), so agent
 * names, transcripts, errors and payloads (whatever an application or a worker put there) reach a
 * page as text, never as markup. Arrays are joined; `null`, `undefined` and `false` are nothing.
 * Attribute values are always quoted in the templates, so an escaped value cannot end one.
 */

/** Markup that is safe as it is: only `markup` makes one. */
export class Html {
  readonly text: string;

  private constructor(text: string) {
    this.text = text;
  }

  /** @internal the one constructor: escaping happens before it */
  static of(text: string): Html {
    return new Html(text);
  }

  toString(): string {
    return this.text;
  }
}

const ESCAPES: Readonly<Record<string, string>> = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };

/** `text` as HTML text (or an attribute's value). */
export function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (ch) => ESCAPES[ch]!);
}

export type HtmlValue = Html | string | number | boolean | null | undefined | readonly HtmlValue[];

function render(v: HtmlValue): string {
  if (v === null || v === undefined || v === false) return '';
  if (v instanceof Html) return v.text;
  if (Array.isArray(v)) return (v as readonly HtmlValue[]).map(render).join('');
  return escapeHtml(String(v));
}

export function markup(strings: TemplateStringsArray, ...values: HtmlValue[]): Html {
  let out = strings[0]!;
  for (let i = 0; i < values.length; i++) out += render(values[i]) + strings[i + 1]!;
  return Html.of(out);
}

/** A query string of `params` (the empty ones left out), for links. */
export function query(params: Record<string, string | number | undefined | null>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.set(k, String(v));
  const s = q.toString();
  return s ? `?${s}` : '';
}

/** A path segment, encoded. */
export const seg = (s: string): string => encodeURIComponent(s);

/** A time as `2026-05-01 16:30:35Z` (UTC), or `-`. */
export function when(d: Date | null | undefined): string {
  return d ? `${d.toISOString().slice(0, 19).replace('T', ' ')}Z` : '-';
}

/** A JSON value for display, at most `max` characters. */
export function shown(value: unknown, max = 2_000): string {
  let text: string;
  try {
    text = JSON.stringify(value, null, 2) ?? 'undefined';
  } catch {
    text = String(value);
  }
  return text.length > max ? `${text.slice(0, max)}… (${text.length} characters)` : text;
}
