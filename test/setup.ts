/**
 * Runs in every test file (vitest `setupFiles`, all projects):
 *  - the leak check: after the file, no broker (so no daemon), ZeroMQ socket or child process it
 *    started may still be alive; the file fails, naming them, and they are closed / killed;
 *  - failed tests are recorded, so their databases are kept for inspection (test/helpers/db.ts).
 */
import { afterAll, afterEach } from 'vitest';
import { noteTestFailed } from './helpers/failures.ts';
import { installLeakTracking, leaks, releaseLeaks } from './helpers/leaks.ts';

installLeakTracking();

afterEach((ctx) => {
  if (ctx.task.result?.state === 'fail') noteTestFailed();
});

afterAll(async () => {
  const left = await leaks();
  if (left.length === 0) return;
  await releaseLeaks();
  throw new Error(`this test file left ${left.length} resource(s) behind:\n  ${left.join('\n  ')}`);
});
