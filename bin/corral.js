#!/usr/bin/env node
// corral runs its TypeScript sources directly: Node >= 22.18 strips types natively;
// older supported Node versions (>= 22.12) load them through tsx.
if (!process.features.typescript) {
  const { register } = await import('tsx/esm/api');
  register();
}
await import('../src/cli/main.ts');
