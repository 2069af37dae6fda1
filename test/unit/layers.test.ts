/**
 * The architecture's layers, written down once, here, and checked on the sources' imports
 * (static, re-exports, dynamic `import()`, type-only ones too: a type is a dependency of the
 * design even when it is erased at run time):
 *  - a module imports from its own layer or from the layers it builds on, never from above;
 *  - no import cycle, between files or between layers.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = join(import.meta.dirname, '../..');

/**
 * Each layer and the layers it may import from (besides itself), lowest first. `base` holds the
 * leaf modules every layer may use. A feature has one home: `live` (the live stream's contract and
 * its reader), `effects` (what a result carries besides its messages: the limits every side checks,
 * the checks and writes of emits and deliveries), `outbox` (sinks, signing, the delivery loop, the
 * operators' use-cases). The composition root (`daemon`) wires the runtime to the fabric, the queue,
 * the outbox and the supervisor; `host` runs it inside an application's process (with its database,
 * metrics server, HTTP API and local workers) and builds the test environment; the CLI drives the
 * host and the operator use-cases, and never reaches into the runtime itself.
 */
export const LAYERS: { name: string; paths: string[]; uses: string[] }[] = [
  { name: 'base', paths: ['src/base/'], uses: [] },
  { name: 'config', paths: ['src/config.ts'], uses: ['base'] },
  { name: 'supervisor', paths: ['src/supervisor/'], uses: ['base'] },
  // the limits of a result's effects: the wire, the worker SDK and the daemon check the same
  { name: 'effect-limits', paths: ['src/effects/limits.ts'], uses: ['base'] },
  { name: 'fabric', paths: ['src/fabric/'], uses: ['base', 'config', 'effect-limits'] },
  { name: 'worker', paths: ['src/worker/'], uses: ['base', 'config', 'fabric', 'effect-limits'] },
  { name: 'db', paths: ['src/db/'], uses: ['base', 'config'] },
  { name: 'queue', paths: ['src/queue/'], uses: ['base', 'config', 'db', 'fabric'] },
  { name: 'effects', paths: ['src/effects/'], uses: ['base', 'config', 'db', 'queue', 'fabric', 'effect-limits'] },
  { name: 'live', paths: ['src/live/'], uses: ['base', 'config', 'db'] },
  { name: 'outbox', paths: ['src/outbox/'], uses: ['base', 'config', 'db'] },
  { name: 'ops', paths: ['src/ops/'], uses: ['base', 'config', 'db', 'queue', 'outbox'] },
  { name: 'runtime', paths: ['src/runtime/'], uses: ['base', 'config', 'db', 'queue', 'fabric', 'effects', 'effect-limits', 'outbox'] },
  { name: 'client', paths: ['src/client/'], uses: ['base', 'config', 'db', 'queue', 'ops', 'live', 'outbox'] },
  // the HTTP API: the client's use-cases behind bearer tokens, for applications in any language, and
  // the operator console (src/http/console/): the operators' use-cases, the outbox's among them
  { name: 'http', paths: ['src/http/'], uses: ['base', 'config', 'db', 'queue', 'ops', 'live', 'client', 'outbox'] },
  {
    name: 'daemon',
    paths: ['src/daemon/'],
    uses: ['base', 'config', 'db', 'queue', 'fabric', 'supervisor', 'ops', 'runtime', 'outbox', 'effects'],
  },
  {
    name: 'observability',
    paths: ['src/observability/'],
    uses: ['base', 'config', 'db', 'queue', 'fabric', 'supervisor', 'runtime', 'outbox', 'daemon'],
  },
  {
    name: 'host',
    paths: ['src/host/'],
    uses: [
      'base',
      'config',
      'db',
      'queue',
      'fabric',
      'supervisor',
      'worker',
      'ops',
      'live',
      'outbox',
      'client',
      'http',
      'daemon',
      'observability',
    ],
  },
  {
    name: 'cli',
    paths: ['src/cli/'],
    uses: ['base', 'config', 'db', 'queue', 'fabric', 'supervisor', 'worker', 'ops', 'live', 'outbox', 'daemon', 'observability', 'host'],
  },
  {
    // the package's entry points (`corral`, `corral/testing`; `corral/worker` is the worker layer's
    // src/worker/index.ts): what an application imports, re-exported from the layers below
    name: 'package',
    paths: ['src/index.ts', 'src/testing.ts'],
    uses: [
      'base',
      'config',
      'db',
      'queue',
      'fabric',
      'supervisor',
      'worker',
      'ops',
      'live',
      'outbox',
      'client',
      'runtime',
      'daemon',
      'host',
    ],
  },
];

function filesUnder(dir: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(join(ROOT, dir), { withFileTypes: true })) {
    const path = join(dir, e.name);
    if (e.isDirectory()) out.push(...filesUnder(path));
    else if (e.name.endsWith('.ts')) out.push(path);
  }
  return out;
}

const specificity = (l: { paths: string[] }) => Math.max(...l.paths.map((p) => (p.endsWith('/') ? p.length : 10_000)));

function layerOf(file: string): string | undefined {
  // the most specific path first: a file named on its own beats its folder
  return [...LAYERS]
    .sort((a, b) => specificity(b) - specificity(a))
    .find((l) => l.paths.some((p) => (p.endsWith('/') ? file.startsWith(p) : file === p)))?.name;
}

const IMPORT = /(?:^|[\s;])(?:import|export)\s[^'"`;]*?from\s*['"]([^'"]+)['"]|\bimport\s*\(\s*['"]([^'"]+)['"]\s*\)/g;

/** The project files `file` imports (relative specifiers only: packages are not layers). */
export function importsOf(file: string, text: string): string[] {
  const code = text.replace(/\/\*[\s\S]*?\*\//g, '').replace(/(^|[^:])\/\/.*$/gm, '$1');
  const out: string[] = [];
  for (const m of code.matchAll(IMPORT)) {
    const spec = m[1] ?? m[2]!;
    if (spec.startsWith('.')) out.push(normalize(join(dirname(file), spec)));
  }
  return out;
}

/** Strongly connected components of more than one file (Tarjan), each sorted. */
export function cycles(graph: Map<string, string[]>): string[][] {
  let index = 0;
  const stack: string[] = [];
  const on = new Set<string>();
  const idx = new Map<string, number>();
  const low = new Map<string, number>();
  const out: string[][] = [];
  const visit = (v: string): void => {
    idx.set(v, index);
    low.set(v, index++);
    stack.push(v);
    on.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!idx.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (on.has(w)) low.set(v, Math.min(low.get(v)!, idx.get(w)!));
    }
    if (low.get(v) === idx.get(v)) {
      const scc: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        on.delete(w);
        scc.push(w);
      } while (w !== v);
      if (scc.length > 1 || (graph.get(v) ?? []).includes(v)) out.push(scc.sort());
    }
  };
  for (const v of graph.keys()) if (!idx.has(v)) visit(v);
  return out;
}

const files = filesUnder('src').map((f) => relative(ROOT, join(ROOT, f)));
const graph = new Map(files.map((f) => [f, importsOf(f, readFileSync(join(ROOT, f), 'utf8'))]));

describe('layers', () => {
  it('the import reader and the cycle finder see what they should', () => {
    const text = [
      "import { a } from './a.ts';",
      "import type { B } from '../b.ts';",
      "export { c } from './c/index.ts';",
      "const d = await import('./d.ts');",
      "import pg from 'pg';",
      "// import { e } from './e.ts';",
      '/* import { f } from "./f.ts"; */',
    ].join('\n');
    expect(importsOf('src/x/y.ts', text)).toEqual(['src/x/a.ts', 'src/b.ts', 'src/x/c/index.ts', 'src/x/d.ts']);
    const g = new Map([
      ['a', ['b']],
      ['b', ['c']],
      ['c', ['a']],
      ['d', ['a']],
      ['e', ['e']],
    ]);
    expect(cycles(g).sort()).toEqual([['a', 'b', 'c'], ['e']]);
  });

  it('every source file belongs to a layer, and every layer named exists', () => {
    expect(files.filter((f) => layerOf(f) === undefined)).toEqual([]);
    const names = new Set(LAYERS.map((l) => l.name));
    expect(LAYERS.flatMap((l) => l.uses).filter((u) => !names.has(u))).toEqual([]);
  });

  it('no module imports from a layer it does not build on', () => {
    const uses = new Map(LAYERS.map((l) => [l.name, new Set([l.name, ...l.uses])]));
    const offenders = [...graph].flatMap(([file, targets]) =>
      targets
        .filter((t) => !uses.get(layerOf(file)!)!.has(layerOf(t) ?? '?'))
        .map((t) => `${file} (${layerOf(file)}) imports ${t} (${layerOf(t) ?? 'no layer'})`),
    );
    expect(offenders, offenders.join('\n')).toEqual([]);
  });

  it('has no import cycle between files', () => {
    expect(cycles(graph)).toEqual([]);
  });

  it('the layers themselves form no cycle', () => {
    const g = new Map(LAYERS.map((l) => [l.name, l.uses]));
    expect(cycles(g)).toEqual([]);
  });
});
