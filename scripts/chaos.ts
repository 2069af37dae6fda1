/**
 * `npm run test:chaos [-- options]`: crash tests on real processes, real PostgreSQL, real ZeroMQ.
 *
 * Runs every scenario of test/chaos/scenarios.ts (or those named with --scenario), each on a fresh
 * database, and prints a table: scenario, events, committed, dead-lettered, violations. Exits 1 if
 * any scenario has a violation.
 *
 * The database server is DATABASE_URL (an admin URL: a database per scenario is created on it;
 * the PostgreSQL-restart scenario is then skipped) or, when unset, an embedded PostgreSQL started
 * in a temporary folder for the run (restartable).
 *
 * Options:
 *   --scenario <ids>   comma-separated (a, b, …, or full ids like c-daemon-kill); repeatable
 *   --events <n>       events per scenario (default 300)
 *   --actors <n>       actors per scenario (default 30)
 *   --failures <n>     {"fail": true} events per scenario (default 5)
 *   --seed <n>         plan seed (default: random, printed)
 *   --repeat <n>       run the selection n times (default 1)
 *   --timeout <ms>     quiescence deadline per scenario (default 150000)
 *   --keep             keep databases, logs and the embedded server's folder
 *   --json <path>      also write the results as JSON
 *   --quiet            no progress lines
 */
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { ensureEmbeddedPostgres, stopEmbeddedPostgres } from '../src/db/postgres/embedded.ts';
import { maskUrl } from '../src/config.ts';
import { serverEnvironment, type ChaosEnvironment } from '../test/chaos/environment.ts';
import { describeFailure, makeLogRoot, runScenario, type ScenarioResult } from '../test/chaos/runner.ts';
import { sleep } from '../test/helpers/wait.ts';
import { SCENARIOS, findScenario } from '../test/chaos/scenarios.ts';

const { values } = parseArgs({
  options: {
    scenario: { type: 'string', multiple: true },
    events: { type: 'string', default: '300' },
    actors: { type: 'string', default: '30' },
    failures: { type: 'string', default: '5' },
    seed: { type: 'string' },
    repeat: { type: 'string', default: '1' },
    timeout: { type: 'string', default: '150000' },
    keep: { type: 'boolean', default: false },
    json: { type: 'string' },
    quiet: { type: 'boolean', default: false },
    help: { type: 'boolean', short: 'h', default: false },
  },
});

if (values.help) {
  console.log(
    'usage: npm run test:chaos -- [--scenario a,c] [--events 300] [--actors 30] [--failures 5] [--seed N] [--repeat N] [--timeout ms] [--keep] [--json path]',
  );
  console.log(`scenarios: ${SCENARIOS.map((s) => `${s.id} (${s.title})`).join('\n           ')}`);
  process.exit(0);
}

const int = (name: string, v: string | undefined): number => {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) {
    console.error(`chaos: --${name} expects a non-negative integer`);
    process.exit(2);
  }
  return n;
};

const selected = (values.scenario ?? []).flatMap((s) => s.split(',')).filter(Boolean);
const scenarios =
  selected.length === 0
    ? SCENARIOS
    : selected.map((id) => {
        const s = findScenario(id);
        if (!s) {
          console.error(`chaos: unknown scenario ${id}; known: ${SCENARIOS.map((x) => x.id).join(', ')}`);
          process.exit(2);
        }
        return s;
      });
const events = int('events', values.events);
const actors = Math.max(1, int('actors', values.actors));
const failures = int('failures', values.failures);
const repeat = Math.max(1, int('repeat', values.repeat));
const timeoutMs = int('timeout', values.timeout);
const baseSeed = values.seed !== undefined ? int('seed', values.seed) : Math.floor(Math.random() * 2 ** 31);
const log = values.quiet ? undefined : (m: string) => console.log(m);

// ---- the database server ------------------------------------------------------------------

let embeddedHome: string | undefined;
let env: ChaosEnvironment;
if (process.env.DATABASE_URL) {
  env = serverEnvironment(process.env.DATABASE_URL, undefined, 'external DATABASE_URL');
  console.log(`chaos: using DATABASE_URL ${maskUrl(process.env.DATABASE_URL)} (PostgreSQL restart scenario skipped)`);
} else {
  embeddedHome = await mkdtemp(join(tmpdir(), 'corral-chaos-pg-'));
  await chmod(embeddedHome, 0o755);
  const home = embeddedHome;
  const t0 = Date.now();
  const server = await ensureEmbeddedPostgres({ homeDir: home, ephemeral: true, database: 'postgres' });
  console.log(`chaos: embedded PostgreSQL in ${home} (${Date.now() - t0} ms)`);
  env = serverEnvironment(
    server.url,
    async (downMs) => {
      await stopEmbeddedPostgres(home);
      if (downMs > 0) await sleep(downMs);
      const again = await ensureEmbeddedPostgres({ homeDir: home, ephemeral: true, database: 'postgres' });
      if (again.url !== server.url) throw new Error(`embedded PostgreSQL came back on another URL: ${maskUrl(again.url)}`);
    },
    'embedded PostgreSQL',
  );
}

async function shutdownServer(keepFiles: boolean): Promise<void> {
  if (!embeddedHome) return;
  await stopEmbeddedPostgres(embeddedHome).catch(() => undefined);
  if (!keepFiles) await rm(embeddedHome, { recursive: true, force: true }).catch(() => undefined);
}

let interrupted = false;
const onSignal = () => {
  if (interrupted) process.exit(130);
  interrupted = true;
  console.error('chaos: interrupted; killing children and stopping PostgreSQL');
  // The harness's exit hook SIGKILLs every child it started.
  void shutdownServer(true).finally(() => process.exit(130));
};
process.on('SIGINT', onSignal);
process.on('SIGTERM', onSignal);

// ---- run ------------------------------------------------------------------------------------

const logRoot = await makeLogRoot();
console.log(
  `chaos: ${scenarios.length} scenario(s) × ${repeat}, ${events} events over ${actors} actors (${failures} failing), seed ${baseSeed}; logs in ${logRoot}`,
);
const results: ScenarioResult[] = [];
const started = Date.now();
for (let r = 0; r < repeat; r++) {
  for (const [i, s] of scenarios.entries()) {
    const seed = baseSeed + r * 1000 + i;
    const res = await runScenario(s, env, {
      events,
      actors,
      failures,
      seed,
      quiescenceTimeoutMs: timeoutMs,
      logRoot: repeat > 1 ? join(logRoot, `run${r + 1}`) : logRoot,
      keepDatabase: values.keep,
      ...(log ? { log } : {}),
    });
    results.push(res);
    const verdict = res.skipped ? `skipped: ${res.skipped}` : res.ok ? 'ok' : `FAILED (${res.violations.length} violations)`;
    console.log(`chaos: ${s.id} ${verdict} in ${(res.durationMs / 1000).toFixed(1)} s`);
    if (!res.ok) console.log(describeFailure(res));
  }
}

// ---- report ---------------------------------------------------------------------------------

function violationsCell(r: ScenarioResult): string {
  const known = [...new Set(r.violations.map((v) => v.knownIssue).filter(Boolean))];
  return `${r.violations.length}${known.length > 0 ? ` (${known.join(',')})` : ''}`;
}

const header = ['scenario', 'events', 'committed', 'dead-lettered', 'violations', 'rejected', 'dup results', 'max epoch', 'time (s)'];
const rows = results.map((r) => [
  `${r.scenario}${repeat > 1 ? ` (seed ${r.seed})` : ''}`,
  r.skipped ? '-' : String(r.events),
  r.skipped ? '-' : String(r.committed),
  r.skipped ? '-' : `${r.deadLettered}/${r.expectedDeadLetters}`,
  r.skipped ? 'skipped' : violationsCell(r),
  r.skipped ? '-' : String(r.stats?.rejectedTotal ?? 0),
  r.skipped ? '-' : String(r.stats?.duplicates ?? 0),
  r.skipped ? '-' : String(r.summary?.maxEpoch ?? 0),
  (r.durationMs / 1000).toFixed(1),
]);
const widths = header.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i]!.length)));
const line = (cells: string[]) => cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ');
console.log('');
console.log(line(header));
console.log(widths.map((w) => '-'.repeat(w)).join('  '));
for (const row of rows) console.log(line(row));
console.log('');
for (const r of results) {
  if (r.skipped) continue;
  const extra = [
    ...r.notes,
    r.stats && r.stats.errors > 0 ? `${r.stats.errors} error log line(s), e.g. ${r.stats.errorSamples.join(' | ')}` : '',
    r.stats && r.stats.rejectedTotal > 0 ? `rejections: ${JSON.stringify(r.stats.rejected)}` : '',
    r.summary && Object.values(r.summary.residue).some((n) => n > 0) && r.summary
      ? `residue after quiescence: ${JSON.stringify(r.summary.residue)}`
      : '',
  ].filter(Boolean);
  for (const n of extra) console.log(`${r.scenario}: ${n}`);
}
const failed = results.filter((r) => !r.ok);
console.log(
  `\nchaos: ${results.length - failed.length}/${results.length} ok in ${((Date.now() - started) / 1000).toFixed(1)} s; logs in ${logRoot}`,
);
if (values.json) await writeFile(values.json, JSON.stringify(results, null, 2));

await shutdownServer(values.keep || failed.length > 0);
if (failed.length === 0 && !values.keep) await rm(logRoot, { recursive: true, force: true }).catch(() => undefined);
else if (embeddedHome)
  console.log(`chaos: embedded PostgreSQL data kept in ${embeddedHome} (start it with ensureEmbeddedPostgres({ homeDir }))`);
process.exit(failed.length > 0 ? 1 : 0);
