// The package test's type check, run with plain `node` in the application folder it installed the
// tarball into, with that folder's own `typescript`:
//   node check-types.js <tsconfig.json> <consumer.ts>
// 1. Every diagnostic of a strict program (the tsconfig's options: no skipLibCheck), as tsc prints it.
// 2. No declaration file of corral's internal dependencies in the program: drizzle-orm's fail a
//    lib check (they name modules it does not depend on), so do pg-boss 12.38's (a type its own
//    files do not export), and `pg` has no types of its own (@types/pg is corral's dev dependency).
//    corral's public types must not reach them.
// 3. The consumer file imports every export (value or type) of each public entry point from it.
// Prints one JSON line { ok, diagnostics, internalFiles, missing, files } and exits 1 unless ok.
import { createRequire } from 'node:module';
import { resolve } from 'node:path';

const require = createRequire(resolve('package.json'));
/** @type {typeof import('typescript')} */
const ts = require('typescript');

const [configPath, consumerPath] = process.argv.slice(2).map((p) => resolve(p));
if (!configPath || !consumerPath) throw new Error('usage: check-types.js <tsconfig.json> <consumer.ts>');

const read = ts.readConfigFile(configPath, (p) => ts.sys.readFile(p));
if (read.error) throw new Error(ts.flattenDiagnosticMessageText(read.error.messageText, '\n'));
const parsed = ts.parseJsonConfigFileContent(read.config, ts.sys, resolve(configPath, '..'));
const program = ts.createProgram({ rootNames: parsed.fileNames, options: parsed.options });

const host = { getCanonicalFileName: (/** @type {string} */ f) => f, getCurrentDirectory: () => process.cwd(), getNewLine: () => '\n' };
const diagnostics = ts.getPreEmitDiagnostics(program).map((d) => ts.formatDiagnostic(d, host).trim());

const files = program.getSourceFiles().map((f) => f.fileName);
const INTERNAL = /\/node_modules\/(drizzle-orm|pg-boss|pg|@types\/pg)\//;
const internalFiles = files.filter((f) => INTERNAL.test(f) && !f.includes('/node_modules/corral/'));

const ENTRY_POINTS = ['corral', 'corral/worker', 'corral/testing'];
const checker = program.getTypeChecker();
const consumer = program.getSourceFile(consumerPath);
if (!consumer) throw new Error(`${consumerPath} is not in the program of ${configPath}`);
/** @type {Record<string, string[]>} */
const missing = {};
/** @type {Map<string, Set<string>>} */
const imported = new Map();
/** @type {Map<string, ts.Symbol>} */
const modules = new Map();
for (const statement of consumer.statements) {
  if (!ts.isImportDeclaration(statement) || !ts.isStringLiteral(statement.moduleSpecifier)) continue;
  const from = statement.moduleSpecifier.text;
  const symbol = checker.getSymbolAtLocation(statement.moduleSpecifier);
  if (symbol) modules.set(from, symbol);
  const names = imported.get(from) ?? new Set();
  const bindings = statement.importClause?.namedBindings;
  if (bindings && ts.isNamedImports(bindings)) for (const el of bindings.elements) names.add((el.propertyName ?? el.name).text);
  imported.set(from, names);
}
for (const entry of ENTRY_POINTS) {
  const symbol = modules.get(entry);
  if (!symbol) {
    missing[entry] = ['(the entry point is not imported)'];
    continue;
  }
  const names = imported.get(entry) ?? new Set();
  const left = checker
    .getExportsOfModule(symbol)
    .map((s) => s.name)
    .filter((n) => !names.has(n));
  if (left.length) missing[entry] = left.sort();
}

const ok = diagnostics.length === 0 && internalFiles.length === 0 && Object.keys(missing).length === 0;
console.log(JSON.stringify({ ok, diagnostics, internalFiles, missing, files: files.length }));
process.exitCode = ok ? 0 : 1;
