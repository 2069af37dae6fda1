/** Whether a test of the current file failed (its databases are then kept for inspection). */
import { TestRunner } from 'vitest';

let failed = false;

/** Called by test/setup.ts after each failed test. */
export function noteTestFailed(): void {
  failed = true;
}

/**
 * True when the running test failed (its `afterEach` hooks see that before test/setup.ts does)
 * or an earlier test of this file did (for `afterAll` hooks).
 */
export function testFailed(): boolean {
  return failed || TestRunner.getCurrentTest()?.result?.state === 'fail';
}
