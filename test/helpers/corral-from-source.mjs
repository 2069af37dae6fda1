// `node --import ./test/helpers/corral-from-source.mjs <example.js>`: runs an example that
// imports the package by its name (`import … from 'corral'`) against this checkout's sources.
// The package's own name resolves to its `exports`, the built dist/, which a checkout does not
// have (an application that installed the package has it); this hook maps each entry point to
// its source module instead (src/index.ts, src/worker/index.ts, src/testing.ts), the way
// bin/corral.js runs src/cli/main.ts. Node >= 22.15 (module.registerHooks); the sources are
// type-stripped by Node, or by tsx where Node does not strip types.
import { registerHooks } from 'node:module';

const SOURCES = {
  corral: '../../src/index.ts',
  'corral/worker': '../../src/worker/index.ts',
  'corral/testing': '../../src/testing.ts',
};

if (typeof registerHooks !== 'function') throw new Error(`corral-from-source: Node ${process.version} has no module.registerHooks (22.15 or later)`);
if (!process.features.typescript) {
  const { register } = await import('tsx/esm/api');
  register();
}
registerHooks({
  resolve(specifier, context, next) {
    const source = Object.hasOwn(SOURCES, specifier) ? SOURCES[specifier] : undefined;
    if (source === undefined) return next(specifier, context);
    return { url: new URL(source, import.meta.url).href, shortCircuit: true };
  },
});
