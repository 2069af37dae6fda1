/**
 * The documented configuration is the configuration: the README's table names every environment
 * variable of `ENV_NAMES` once, with the default `DEFAULTS` gives it, and wherever README.md or
 * docs/*.md quote a variable's default in prose ("`CORRAL_LEASE_MS` (default 60 s)"), the value is
 * the real one. Reads only the exports `DEFAULTS` (setting → default) and `ENV_NAMES` (setting →
 * variable) of src/config.ts.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { DEFAULTS, ENV_NAMES } from '../../src/config.ts';

const ROOT = join(import.meta.dirname, '../..');
const README = readFileSync(join(ROOT, 'README.md'), 'utf8');
const DOCS = [
  { file: 'README.md', text: README },
  ...readdirSync(join(ROOT, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => ({ file: `docs/${f}`, text: readFileSync(join(ROOT, 'docs', f), 'utf8') })),
];

/** variable → setting */
const SETTING_OF = new Map(Object.entries(ENV_NAMES as Record<string, string>).map(([setting, name]) => [name, setting]));
const defaultOf = (setting: string): unknown => (DEFAULTS as Record<string, unknown>)[setting];

export interface TableRow {
  line: number;
  name: string;
  /** The default column's text for this variable, e.g. "`60000`", "off", "(embedded)". */
  doc: string;
}

/** The rows of the README's `| variable | default | meaning |` table, one per variable ("`A` / `B`" rows split). */
export function configTable(readme: string): TableRow[] {
  const lines = readme.split('\n');
  const start = lines.findIndex((l) => /^\|\s*variable\s*\|\s*default\s*\|/.test(l));
  if (start < 0) throw new Error('README.md has no | variable | default | … | table');
  const rows: TableRow[] = [];
  for (let i = start + 2; i < lines.length && lines[i]!.startsWith('|'); i++) {
    const cells = lines[i]!.split(/(?<!\\)\|/).slice(1, -1);
    const names = cells[0]!.trim().split(' / ');
    const docs = cells[1]!.trim().split(' / ');
    for (const [k, cell] of names.entries()) {
      const name = /^`([A-Z_]+)`$/.exec(cell.trim())?.[1];
      if (!name) throw new Error(`README.md:${i + 1}: the variable cell ${JSON.stringify(cell)} is not \`NAME\``);
      const doc = docs.length === names.length ? docs[k]! : docs.length === 1 ? docs[0]! : undefined;
      if (doc === undefined) throw new Error(`README.md:${i + 1}: ${names.length} variables but ${docs.length} defaults`);
      rows.push({ line: i + 1, name, doc: doc.trim() });
    }
  }
  return rows;
}

/** Why the table's default text `doc` is not `value`'s, or undefined when it is. */
export function tableMismatch(doc: string, value: unknown): string | undefined {
  if (value === undefined) {
    // no default in DEFAULTS: the text says what happens instead (off, embedded, a folder under
    // CORRAL_HOME); a number there would be one the code does not have
    return /^`\d+`$/.test(doc) ? `documents ${doc}, but the setting has no default` : undefined;
  }
  const expected = typeof value === 'boolean' ? (value ? 'on' : 'off') : `\`${String(value)}\``;
  return doc === expected ? undefined : `documents ${doc}, the default is ${expected}`;
}

const UNITS: Record<string, number> = {
  ms: 1,
  s: 1_000,
  min: 60_000,
  h: 3_600_000,
  day: 86_400_000,
  days: 86_400_000,
  KiB: 1024,
  MiB: 1024 ** 2,
  GiB: 1024 ** 3,
  bytes: 1,
};

/** `amount unit` in the variable's own unit (its name ends in _MS, _S or _BYTES), or undefined. */
export function inUnitOf(name: string, amount: number, unit: string | undefined): number | undefined {
  if (unit === undefined) return amount;
  const time = ['ms', 's', 'min', 'h', 'day', 'days'].includes(unit);
  if (name.endsWith('_MS') && time) return amount * UNITS[unit]!;
  if (name.endsWith('_S') && time) return (amount * UNITS[unit]!) / 1_000;
  if (name.endsWith('_BYTES') && !time) return amount * UNITS[unit]!;
  return undefined;
}

const VALUE = String.raw`(\d[\d ]*(?:\.\d+)?)(?:\s*(ms|s|min|h|days?|KiB|MiB|GiB|bytes))?`;
/** Ways prose quotes a variable's default; group 1 or `name` is the variable, `amount`/`unit` the value. */
const PROSE: RegExp[] = [
  // `VAR` (default 200 ms) · `VAR` retries (default 5) · `VAR` (10 s) · `VAR`, `--flag`; default 60 s
  new RegExp(
    String.raw`\`(?<name>CORRAL_[A-Z_]+|DATABASE_URL)\`[^()\n]{0,30}?(?:\((?:default )?|; default |, default )${VALUE}(?=[,;)]|\s|$)`,
    'g',
  ),
  // (default 2000, `VAR`)
  new RegExp(String.raw`\(default ${VALUE}, \`(?<name>CORRAL_[A-Z_]+)\`\)`, 'g'),
  // `VAR`, 10 s by default
  new RegExp(String.raw`\`(?<name>CORRAL_[A-Z_]+)\`, ${VALUE} by default`, 'g'),
];

export interface ProseDefault {
  where: string;
  name: string;
  quoted: string;
  value: number | undefined;
}

/** Every default quoted in prose in `text` (the README's table excluded: it has its own check). */
export function proseDefaults(file: string, text: string): ProseDefault[] {
  const out: ProseDefault[] = [];
  const lines = text.split('\n');
  lines.forEach((line, i) => {
    if (/^\|\s*`(CORRAL_[A-Z_]+|DATABASE_URL)`/.test(line) && file === 'README.md') return;
    for (const re of PROSE) {
      for (const m of line.matchAll(re)) {
        const groups = m.slice(1).filter((g) => g !== undefined && !/^(CORRAL_|DATABASE_URL)/.test(g));
        const [amountText, unit] = [groups[0]!, groups[1]];
        const name = m.groups!.name!;
        const amount = Number(amountText.replace(/ /g, ''));
        out.push({ where: `${file}:${i + 1}`, name, quoted: m[0], value: inUnitOf(name, amount, unit) });
      }
    }
  });
  return out;
}

describe('documented configuration', () => {
  it('the helpers read tables and prose as intended', () => {
    const readme = [
      '| variable | default | meaning |',
      '|---|---|---|',
      '| `A_MS` / `B` | `1` / off | x |',
      '| `C` | (none) | y |',
      '',
    ].join('\n');
    expect(configTable(readme)).toEqual([
      { line: 3, name: 'A_MS', doc: '`1`' },
      { line: 3, name: 'B', doc: 'off' },
      { line: 4, name: 'C', doc: '(none)' },
    ]);
    expect(tableMismatch('`60000`', 60_000)).toBeUndefined();
    expect(tableMismatch('off', false)).toBeUndefined();
    expect(tableMismatch('(embedded)', undefined)).toBeUndefined();
    expect(tableMismatch('`6000`', 60_000)).toBe('documents `6000`, the default is `60000`');
    expect(tableMismatch('`9464`', undefined)).toBe('documents `9464`, but the setting has no default');
    const prose = [
      'within `CORRAL_KEY_POLL_MS` (default 200 ms): the worker',
      'send it this often (default 2000, `CORRAL_WORKER_HEARTBEAT_MS`) |',
      'up to `CORRAL_DRAIN_MS` (10 s), then',
      'after `CORRAL_RETRY_LIMIT` retries, default 5) is',
      "the stale timeout (its daemon's `CORRAL_WORKER_STALE_MS`, 10 s by default)",
      'next to the lease (`CORRAL_LEASE_MS`, `--lease-ms`; default 60 s, the',
      'limited at enqueue to `CORRAL_MAX_EVENT_BYTES` (default 256 KiB,',
      'past `CORRAL_MAX_TURN_MS` (default 6 h) |',
      'unset = the embedded server under `CORRAL_HOME` (say, a checkout)',
      '`CORRAL_CONTEXT_MESSAGES` is 0',
    ].join('\n');
    expect(proseDefaults('x.md', prose).map((p) => [p.name, p.value])).toEqual([
      ['CORRAL_KEY_POLL_MS', 200],
      ['CORRAL_WORKER_HEARTBEAT_MS', 2000],
      ['CORRAL_DRAIN_MS', 10_000],
      ['CORRAL_RETRY_LIMIT', 5],
      ['CORRAL_WORKER_STALE_MS', 10_000],
      ['CORRAL_LEASE_MS', 60_000],
      ['CORRAL_MAX_EVENT_BYTES', 262_144],
      ['CORRAL_MAX_TURN_MS', 21_600_000],
    ]);
  });

  it("the README's table lists every environment variable once, with its default", () => {
    const rows = configTable(README);
    const names = rows.map((r) => r.name);
    expect(
      names.filter((n, i) => names.indexOf(n) !== i),
      'listed twice',
    ).toEqual([]);
    expect(
      names.filter((n) => !SETTING_OF.has(n)),
      'listed, but not a variable of src/config.ts',
    ).toEqual([]);
    expect([...SETTING_OF.keys()].filter((n) => !names.includes(n)).sort(), 'variables the table leaves out').toEqual([]);
    const wrong = rows.flatMap((r) => {
      const why = tableMismatch(r.doc, defaultOf(SETTING_OF.get(r.name)!));
      return why ? [`README.md:${r.line}: ${r.name} ${why}`] : [];
    });
    expect(wrong).toEqual([]);
  });

  it('every default quoted in README.md and docs/*.md is the real one, of a real variable', () => {
    const quoted = DOCS.flatMap(({ file, text }) => proseDefaults(file, text));
    expect(quoted.length).toBeGreaterThan(10);
    const wrong = quoted.flatMap((q) => {
      const setting = SETTING_OF.get(q.name);
      if (!setting) return [`${q.where}: ${q.name} is not a variable of src/config.ts`];
      const value = defaultOf(setting);
      return q.value === value ? [] : [`${q.where}: "${q.quoted}" says ${q.value}, the default is ${String(value)}`];
    });
    expect(wrong).toEqual([]);
  });

  it('every CORRAL_ variable README.md and docs/*.md name exists', () => {
    const named = DOCS.flatMap(({ file, text }) =>
      [...text.matchAll(/\bCORRAL_[A-Z_]*[A-Z]\b(\*)?/g)].map((m) => ({ file, name: m[0], prefix: m[1] === '*' })),
    );
    const unknown = named.filter(({ name, prefix }) =>
      prefix ? ![...SETTING_OF.keys()].some((n) => n.startsWith(name.slice(0, -1))) : !SETTING_OF.has(name),
    );
    expect(unknown.map((u) => `${u.file}: ${u.name}`)).toEqual([]);
  });
});
