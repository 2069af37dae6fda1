/**
 * Rules of the code base's layout, checked on the files themselves:
 *  - SQL text lives in src/db only (a schema change then touches src/db alone);
 *  - no source, test, benchmark or script file exceeds 600 lines;
 *  - a test file takes its databases from the fixtures of test/helpers/db.ts (`useTestDatabase`,
 *    `useTestDatabases`), never from `createTestDatabase` itself, which the helpers build on.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = join(import.meta.dirname, '../..');
const SOURCE = /\.(ts|mts|js|mjs|cjs)$/;

function filesUnder(dir: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(join(ROOT, dir), { withFileTypes: true })) {
    const path = join(dir, e.name);
    if (e.isDirectory()) out.push(...filesUnder(path));
    else if (SOURCE.test(e.name)) out.push(path);
  }
  return out;
}

/** The text without comments (a comment may quote SQL; it runs nowhere). */
function code(text: string): string {
  return text.replace(/\/\*[\s\S]*?\*\//g, (c) => c.replace(/[^\n]/g, ' ')).replace(/(^|\s)\/\/.*$/gm, '$1');
}

const SQL_KEYWORD = /\b(select|insert|update|delete|with|create|drop|alter|truncate|listen|notify|begin|commit|rollback|set)\b/i;

/** Ways SQL text shows up in TypeScript; each names what it found. */
const SQL_PATTERNS: { what: string; re: RegExp; keyword?: boolean }[] = [
  { what: 'drizzle sql`…` template', re: /\bsql\s*`/g },
  { what: 'sql.raw(…)', re: /\bsql\.raw\s*\(/g },
  {
    what: '.query/.execute/.executeSql with SQL text',
    re: /\.(query|execute|executeSql)\s*(<[^>()]*>)?\s*\(\s*[`'"][^`'"]*/g,
    keyword: true,
  },
  {
    what: 'SQL statement in a string',
    re: /[`'"][^`'"]*?\b(select\s[^`'"]*?\sfrom\s|insert\s+into\s|delete\s+from\s|update\s+[\w."]+\s+set\s)/gi,
  },
];

/** `path:line: what` for each SQL text found in `text`. */
export function findSql(path: string, text: string): string[] {
  const src = code(text);
  const out: string[] = [];
  for (const p of SQL_PATTERNS) {
    for (const m of src.matchAll(p.re)) {
      if (p.keyword && !SQL_KEYWORD.test(m[0])) continue;
      const line = src.slice(0, m.index).split('\n').length;
      out.push(`${path}:${line}: ${p.what}`);
    }
  }
  return out;
}

/** Files others are splitting; remove an entry once its file is under the limit. */
const OVER_600_ALLOWED = new Set<string>([]);

describe('layout', () => {
  it('the SQL detector finds SQL text in its usual forms, and not in comments', () => {
    const sample = [
      "await pool.query('select 1');",
      'await db.execute(sql`select * from corral.turns`);',
      'const q = sql.raw(`drop table x`);',
      'const text = "insert into corral.actors (a) values ($1)";',
      '// select x from y: a comment',
      'await client.query<{ version: string }>(getVersion(schema));',
      "log.info('selected a worker from the pool');",
      "await boss.getDb().executeSql('select corral.tune_boss_job_tables($1)', [schema]);",
      'await db.executeSql(text, values);',
    ].join('\n');
    const lines = new Set(findSql('sample.ts', sample).map((x) => Number(x.split(':')[1])));
    // lines 1–4 and 8 carry SQL; the comment, pg-boss's own statement, the log line and a statement
    // passed on do not
    expect([...lines].sort((a, b) => a - b)).toEqual([1, 2, 3, 4, 8]);
  });

  it('has no SQL text outside src/db', () => {
    const offenders = filesUnder('src')
      .map((f) => relative(ROOT, join(ROOT, f)))
      .filter((f) => !f.startsWith('src/db/'))
      .flatMap((f) => findSql(f, readFileSync(join(ROOT, f), 'utf8')));
    expect(offenders, `SQL belongs in src/db (a named function taking db first):\n${offenders.join('\n')}`).toEqual([]);
  });

  it('has no file over 600 lines in src, test, bench or scripts', () => {
    const lines = (f: string) => readFileSync(join(ROOT, f), 'utf8').split('\n').length - 1;
    const over = ['src', 'test', 'bench', 'scripts']
      .flatMap(filesUnder)
      .map((f) => ({ f, n: lines(f) }))
      .filter(({ f, n }) => n > 600 && !OVER_600_ALLOWED.has(f));
    expect(
      over.map(({ f, n }) => `${f}: ${n} lines`),
      'split these files by concern',
    ).toEqual([]);
  });

  it('has no test file that calls createTestDatabase: its databases come from the fixtures', () => {
    const offenders = filesUnder('test')
      .filter((f) => f.endsWith('.test.ts'))
      .filter((f) => /\bcreateTestDatabase\s*\(/.test(code(readFileSync(join(ROOT, f), 'utf8'))));
    expect(offenders, 'use useTestDatabase() (one for the file) or useTestDatabases() (one per test) from test/helpers/db.ts').toEqual([]);
  });
});
