#!/usr/bin/env node
// Start-up time matters for a command line: reuse V8's compiled code (and, on Node >= 23, the
// type-stripped sources) across runs. The cache lives in the OS temp folder and is optional.
import module from 'node:module';
module.enableCompileCache?.();
// corral runs its TypeScript sources directly: Node >= 22.18 strips types natively;
// older supported Node versions (>= 22.12) load them through tsx.
if (!process.features.typescript) {
  const { register } = await import('tsx/esm/api');
  register();
}
await import('../src/cli/main.ts');
