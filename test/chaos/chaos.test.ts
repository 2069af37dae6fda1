/**
 * Reduced crash tests for CI: real `corral daemon` / `corral worker` processes on the test run's
 * PostgreSQL (a fresh database per scenario, cloned from the template), real ZeroMQ, real faults.
 * The full runs (300 events, every scenario including the PostgreSQL restart) are
 * `npm run test:chaos`. The scenarios and the invariant checks are shared: see runner.ts, invariants.ts
 * and scenarios.ts. On failure the message names the violations, the seed and the log folder.
 *
 * Knobs: CORRAL_CHAOS_SEED (plan seed), CORRAL_CHAOS_EVENTS (events per scenario),
 * CORRAL_TEST_LOG=1 (progress lines).
 */
import { rm } from 'node:fs/promises';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { useTestDatabases } from '../helpers/db.ts';
import { killAll } from '../helpers/processes.ts';
import type { ChaosEnvironment } from './environment.ts';
import { describeFailure, makeLogRoot, runScenario, type Scenario } from './runner.ts';
import { coalesceKill, coalesceTwoDaemons, daemonKill, duplicateResults, workerKill, workerStop } from './scenarios.ts';

/**
 * The scenario databases, one per test: a passed scenario drops its own; after each test what is
 * left is dropped, or kept and named when the scenario failed (useTestDatabases).
 */
const databases = useTestDatabases();
const env: ChaosEnvironment = {
  describe: "the test run's shared PostgreSQL (not restarted by tests)",
  async createDatabase() {
    return { ...(await databases.fresh()), migrated: true };
  },
};

const SEED = Number(process.env.CORRAL_CHAOS_SEED ?? 20261129);
const EVENTS = Number(process.env.CORRAL_CHAOS_EVENTS ?? 100);
const logRoot = makeLogRoot('corral-chaos-ci-');
/** Logs are kept (their folder is named in the failure message) only when something failed. */
let keepLogs = false;

async function run(scenario: Scenario, seedOffset: number) {
  keepLogs = true; // until this scenario passed
  const result = await runScenario(scenario, env, {
    events: EVENTS,
    actors: 12,
    failures: 2,
    seed: SEED + seedOffset,
    quiescenceTimeoutMs: 110_000,
    settleTimeoutMs: 10_000,
    logRoot: await logRoot,
    ...(process.env.CORRAL_TEST_LOG ? { log: (m: string) => console.log(m) } : {}),
  });
  expect(result.violations, describeFailure(result)).toEqual([]);
  expect(result.committed + result.deadLettered).toBe(result.events);
  keepLogs = false;
  return result;
}

describe('crash tests (real processes, real PostgreSQL, real ZeroMQ)', () => {
  let failures = 0;
  afterEach(() => {
    if (keepLogs) failures++;
  });
  afterAll(async () => {
    killAll();
    if (failures === 0) await rm(await logRoot, { recursive: true, force: true });
  });

  it('a worker killed -9 mid-turn: its turns are retried, each event commits once, in order', { timeout: 240_000 }, async () => {
    await run(workerKill, 0);
  });

  it('a daemon killed -9 mid-run and restarted: nothing lost, nothing doubled', { timeout: 240_000 }, async () => {
    await run(daemonKill, 1);
  });

  it('duplicate results are answered with the committed outcome and written once', { timeout: 240_000 }, async () => {
    const r = await run(duplicateResults, 2);
    expect((r.stats?.duplicates ?? 0) + (r.stats?.rejected.already_committed ?? 0)).toBeGreaterThan(0);
  });

  it('a worker frozen past its lease: its late results are rejected', { timeout: 240_000 }, async () => {
    await run(workerStop, 3);
  });

  it(
    'input policy coalesce, workers and the daemon killed -9 while batches run: each batch commits once, whole, in order',
    { timeout: 240_000 },
    async () => {
      const r = await run(coalesceKill, 4);
      // the scenario's own check (no_batches) already fails a run without a committed batch
      expect(r.summary?.batches.committed ?? 0).toBeGreaterThan(0);
    },
  );

  it(
    'input policy coalesce on two daemons, one killed -9: each batch commits once, on one daemon, in order',
    { timeout: 240_000 },
    async () => {
      const r = await run(coalesceTwoDaemons, 5);
      expect(r.summary?.batches.committed ?? 0).toBeGreaterThan(0);
    },
  );
});
