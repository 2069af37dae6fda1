/**
 * docs/client.md describes the whole client: every member of the `Corral` interface
 * (src/client/api.ts) and of its `sinks` and `outbox` groups appears in the doc's method table and
 * in its `interface Corral` listing, and the doc names no member the interface lacks.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = join(import.meta.dirname, '../..');
const api = readFileSync(join(ROOT, 'src/client/api.ts'), 'utf8');
const doc = readFileSync(join(ROOT, 'docs/client.md'), 'utf8');

/** The members (methods and properties) of `interface <name> {…}` in src/client/api.ts. */
function membersOf(name: string): string[] {
  const m = new RegExp(`export interface ${name}\\b[^{]*\\{([\\s\\S]*?)\\n\\}`).exec(api);
  if (!m) throw new Error(`no interface ${name} in src/client/api.ts`);
  const body = m[1]!.replace(/\/\*[\s\S]*?\*\//g, '');
  return [...body.matchAll(/^\s{2}(?:readonly\s+)?([a-zA-Z]+)[(?:<]/gm)].map((x) => x[1]!);
}

/** The method table of the doc's opening: its first column's names, as code. */
const table = doc.slice(doc.indexOf('| method | what | implemented in |'), doc.indexOf('Errors are `CorralError`s'));
const tableNames = new Set([...table.matchAll(/`([a-zA-Z]+)`/g)].map((m) => m[1]!));
const listing = /```ts\ninterface Corral \{([\s\S]*?)\n\}/.exec(doc)?.[1] ?? '';

describe('docs/client.md', () => {
  it('the reader finds the members of an interface', () => {
    expect(membersOf('Corral')).toEqual(expect.arrayContaining(['send', 'watch', 'watchTurns', 'sinks', 'close', 'databaseUrl']));
    expect(membersOf('SinksApi')).toEqual(['add', 'list', 'remove', 'enable', 'rotateSecret']);
  });

  it('names every member of the client in its method table and its listing of the interface', () => {
    const members = membersOf('Corral');
    expect(
      members.filter((m) => !tableNames.has(m)),
      'missing from the method table',
    ).toEqual([]);
    expect(
      members.filter((m) => !new RegExp(`\\b${m}\\b`).test(listing)),
      'missing from `interface Corral`',
    ).toEqual([]);
    for (const group of ['SinksApi', 'OutboxApi', 'TokensApi']) {
      expect(
        membersOf(group).filter((m) => !tableNames.has(m)),
        `${group} members missing from the method table`,
      ).toEqual([]);
    }
  });

  it('lists no member the client does not have', () => {
    const members = new Set(membersOf('Corral'));
    const listed = [...listing.matchAll(/^\s{2}(?:readonly\s+)?([a-zA-Z]+)[(?:<]/gm)].map((m) => m[1]!);
    expect(listed.filter((m) => !members.has(m))).toEqual([]);
  });
});
