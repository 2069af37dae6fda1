#!/usr/bin/env node
// Runs a TypeScript entry point (scripts/, bench/) the same way bin/corral.js runs the CLI.
import { pathToFileURL } from 'node:url';
import { resolve } from 'node:path';

const [entry, ...rest] = process.argv.slice(2);
if (!entry) {
  console.error('usage: run-ts.js <file.ts> [args…]');
  process.exit(2);
}
if (!process.features.typescript) {
  const { register } = await import('tsx/esm/api');
  register();
}
process.argv = [process.argv[0], resolve(entry), ...rest];
await import(pathToFileURL(resolve(entry)).href);
