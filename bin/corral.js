#!/usr/bin/env node
// Start-up time matters for a command line: reuse V8's compiled code (and, on Node >= 23, the
// type-stripped sources) across runs. The cache lives in the OS temp folder and is optional.
import module from 'node:module';
import { existsSync } from 'node:fs';
module.enableCompileCache?.();
// A checkout runs its TypeScript sources (no build step): Node >= 22.18 strips types natively;
// older supported Node versions (>= 22.12) load them through tsx, a development dependency.
// The installed package holds no sources (see "files" in package.json), and Node never strips
// types under node_modules: it runs the compiled dist/ that `npm pack` builds.
const sources = new URL('../src/cli/main.ts', import.meta.url);
if (existsSync(sources)) {
  if (!process.features.typescript) {
    const { register } = await import('tsx/esm/api');
    register();
  }
  await import(sources.href);
} else {
  await import('../dist/cli/main.js');
}
