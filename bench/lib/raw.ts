/** The raw pg-boss ceiling: fetch (batch 50) and complete with the attempt fence until drained. */
import { performance } from 'node:perf_hooks';
import type { PgBoss } from 'pg-boss';
import { v7 as uuidv7 } from 'uuid';
import { PhaseTimeout, sleep } from './common.ts';

export interface RawResult {
  jobs: number;
  insertMs: number;
  drainMs: number;
  totalMs: number;
  /** jobs / (insert + drain): the same window as corral's turns/s. */
  jobsPerSec: number;
  /** jobs / drain only: fetch+complete. */
  drainJobsPerSec: number;
  fetches: number;
  /** Every repetition's rate when this is a slice's median repetition. */
  repsJobsPerSec?: number[];
  /** CPU of this process per job (the pg-boss client; the idle daemon lives here too). */
  processCpuMsPerJob?: number;
  /** CPU of the (embedded) PostgreSQL per job, when measurable. */
  serverCpuMsPerJob?: number;
}

export const RAW_BATCH = 50;

/** Inserts `n` jobs over `actors` singleton keys, then fetches (batch 50) and completes until drained. */
export async function rawBaseline(boss: PgBoss, queue: string, n: number, actors: number, deadline: number): Promise<RawResult> {
  const jobs = Array.from({ length: n }, (_, i) => {
    const s = `s${i % actors}`;
    return {
      id: uuidv7(),
      singletonKey: `bench/${s}`,
      data: { agentUid: 'bench', sessionId: s, payload: { text: `e${i}` }, enqueuedAt: new Date().toISOString() },
    };
  });
  const t0 = performance.now();
  await boss.insert(queue, jobs);
  const t1 = performance.now();
  let done = 0;
  let fetches = 0;
  let emptyStreak = 0;
  while (done < n) {
    if (performance.now() > deadline) throw new PhaseTimeout(`raw baseline: ${done}/${n} jobs done at the deadline`);
    const batch = await boss.fetch<object>(queue, { batchSize: RAW_BATCH });
    fetches++;
    if (batch.length === 0) {
      // key_strict_fifo with nothing active should never come back empty while jobs remain
      if (++emptyStreak > 100) throw new Error(`raw baseline: queue ${queue} returned nothing with ${n - done} jobs left`);
      await sleep(5);
      continue;
    }
    emptyStreak = 0;
    // Fenced by attempt, like corral's commit.
    const res = (await boss.complete(
      queue,
      batch.map((j) => ({ id: j.id, retryCount: j.retryCount })),
    )) as { affected?: number };
    if (res.affected !== batch.length) throw new Error(`raw baseline: completed ${res.affected}/${batch.length}`);
    done += batch.length;
  }
  const t2 = performance.now();
  return {
    jobs: n,
    insertMs: t1 - t0,
    drainMs: t2 - t1,
    totalMs: t2 - t0,
    jobsPerSec: (n * 1000) / (t2 - t0),
    drainJobsPerSec: (n * 1000) / (t2 - t1),
    fetches,
  };
}
