/**
 * Where the time goes (e2e --sample-activity, --statements): pg_stat_activity and the daemon's pool
 * sampled during the corral rounds, and pg_stat_statements deltas over the rounds.
 */
import pg from 'pg';
import { progress, round, sleep } from './common.ts';

export interface ActivitySummary {
  samples: number;
  /** The daemon's connection pool: mean clients checked out and callers waiting for one. */
  daemonPool: { max: number; meanInUse: number; meanWaiting: number; maxWaiting: number };
  /** Mean number of corral/pg-boss backends per state/wait, e.g. "active: Lock/transactionid". */
  meanBackends: Record<string, number>;
  /** The most frequent running or waiting statements (first 120 characters). */
  topQueries: { query: string; share: number }[];
}

/**
 * Samples pg_stat_activity every `everyMs` while `on` (the corral rounds only; the raw slices'
 * pg-boss shares the application name) until stopped: where the database's time goes.
 */
export function sampleActivity(url: string, pool: pg.Pool, everyMs = 25): { on: boolean; stop(): Promise<ActivitySummary> } {
  const client = new pg.Client({ connectionString: url, application_name: 'corral-bench-sampler' });
  const states = new Map<string, number>();
  const queries = new Map<string, number>();
  let samples = 0;
  let busy = 0;
  let inUse = 0;
  let waiting = 0;
  let maxWaiting = 0;
  let stopped = false;
  const handle = {
    on: false,
    async stop(): Promise<ActivitySummary> {
      stopped = true;
      await loop;
      const meanBackends = Object.fromEntries(
        [...states.entries()].sort((a, b) => b[1] - a[1]).map(([k, n]) => [k, round(n / Math.max(1, samples), 2)]),
      );
      const topQueries = [...queries.entries()]
        .sort((a, b) => b[1] - a[1])
        .slice(0, 8)
        .map(([query, n]) => ({ query, share: round(n / Math.max(1, busy), 3) }));
      const n = Math.max(1, samples);
      const daemonPool = { max: pool.options.max ?? 10, meanInUse: round(inUse / n, 2), meanWaiting: round(waiting / n, 2), maxWaiting };
      return { samples, daemonPool, meanBackends, topQueries };
    },
  };
  const loop = (async () => {
    await client.connect();
    try {
      await sampleLoop();
    } finally {
      await client.end().catch(() => undefined);
    }
  })().catch((e: Error) => progress(`activity sampler stopped: ${e.message}`));
  async function sampleLoop(): Promise<void> {
    while (!stopped) {
      if (!handle.on) {
        await sleep(everyMs);
        continue;
      }
      const res = await client.query<{ state: string; wait: string | null; query: string }>(
        `select state, wait_event_type || '/' || wait_event as wait, query
           from pg_stat_activity
          where datname = current_database() and pid <> pg_backend_pid()
            and application_name in ('corral', 'corral-boss')`,
      );
      samples++;
      inUse += pool.totalCount - pool.idleCount;
      waiting += pool.waitingCount;
      maxWaiting = Math.max(maxWaiting, pool.waitingCount);
      for (const r of res.rows) {
        const k = `${r.state}${r.wait ? `: ${r.wait}` : ''}`;
        states.set(k, (states.get(k) ?? 0) + 1);
        if (r.state === 'active' || r.state === 'idle in transaction') {
          busy++;
          const q = r.query.replace(/\s+/g, ' ').slice(0, 120);
          queries.set(q, (queries.get(q) ?? 0) + 1);
        }
      }
      await sleep(everyMs);
    }
  }
  return handle;
}

export interface StatementRow {
  query: string;
  callsPerTurn: number;
  meanMs: number;
  /** Server execution time per committed turn. */
  msPerTurn: number;
  /** Server planning time per committed turn (unprepared statements are planned on every call). */
  planMsPerTurn: number;
  /** Share of all statement time in the corral rounds. */
  share: number;
}

/** The bench's own statements (progress polls, samplers), left out of the statement report. */
export const isBenchQuery = (q: string): boolean =>
  q.includes('pg_stat_statements') || q.includes('pg_stat_activity') || q.includes('event_id = any(');

/** Sums pg_stat_statements deltas over the measured corral rounds only (raw slices excluded). */
export class StatementTracker {
  private readonly client: pg.Client;
  private before = new Map<string, { calls: number; ms: number; planMs: number }>();
  private readonly totals = new Map<string, { query: string; calls: number; ms: number; planMs: number }>();

  constructor(client: pg.Client) {
    this.client = client;
  }

  private async snapshot(): Promise<Map<string, { query: string; calls: number; ms: number; planMs: number }>> {
    const res = await this.client.query<{ id: string; query: string; calls: string; ms: number; plan_ms: number }>(
      `select queryid::text as id, query, calls, total_exec_time as ms, total_plan_time as plan_ms
         from pg_stat_statements where dbid = (select oid from pg_database where datname = current_database())`,
    );
    return new Map(res.rows.map((r) => [r.id, { query: r.query, calls: Number(r.calls), ms: Number(r.ms), planMs: Number(r.plan_ms) }]));
  }

  async begin(): Promise<void> {
    this.before = await this.snapshot();
  }

  async end(): Promise<void> {
    for (const [id, now] of await this.snapshot()) {
      const was = this.before.get(id) ?? { calls: 0, ms: 0, planMs: 0 };
      const calls = now.calls - was.calls;
      if (calls <= 0) continue;
      const t = this.totals.get(id) ?? { query: now.query, calls: 0, ms: 0, planMs: 0 };
      t.calls += calls;
      t.ms += now.ms - was.ms;
      t.planMs += now.planMs - was.planMs;
      this.totals.set(id, t);
    }
  }

  /** Totals per turn over every statement of the rounds. */
  totalsPerTurn(turns: number): { statements: number; execMs: number; planMs: number } {
    const rows = [...this.totals.values()].filter((t) => !isBenchQuery(t.query));
    return {
      statements: rows.reduce((a, t) => a + t.calls, 0) / turns,
      execMs: rows.reduce((a, t) => a + t.ms, 0) / turns,
      planMs: rows.reduce((a, t) => a + t.planMs, 0) / turns,
    };
  }

  summary(turns: number, top = 15): StatementRow[] {
    const rows = [...this.totals.values()].filter((t) => !isBenchQuery(t.query));
    const all = rows.reduce((a, t) => a + t.ms, 0);
    return rows
      .sort((a, b) => b.ms - a.ms)
      .slice(0, top)
      .map((t) => ({
        query: t.query.replace(/\s+/g, ' ').trim().slice(0, 110),
        callsPerTurn: t.calls / turns,
        meanMs: t.ms / t.calls,
        msPerTurn: t.ms / turns,
        planMsPerTurn: t.planMs / turns,
        share: t.ms / all,
      }));
  }
}
