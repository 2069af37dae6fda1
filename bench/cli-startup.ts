/**
 * CLI start-up benchmark: how long `corral --help`, `corral send` and the read commands
 * (`transcript`, `status`, `actor`, `dlq list`) take, as ratios to a bare `node -e 0` measured in
 * the same run (interleaved, so a noisy machine slows all alike). Each command's best run is
 * compared with the bare start's best run, its median with the median. Targets, on the best of
 * the runs: `--help` ≤ 4×, `send` and every read command ≤ 8× (see docs/benchmarks.md); a last
 * line says whether they are met, and `--check` makes a missed target exit 1.
 *
 *   npm run bench:cli -- [--runs N] [--bin path/to/corral.js] [--json] [--check]
 *
 * `--bin` measures another checkout's CLI against the same database (a before/after pair).
 * Uses DATABASE_URL when set, else an embedded PostgreSQL in a temporary folder, started once
 * (and migrated) before the timed runs, stopped and deleted at the end.
 */
import { spawnSync } from 'node:child_process';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { ensureEmbeddedPostgres, stopEmbeddedPostgres } from '../src/db/postgres/embedded.ts';

const HELP = `usage: npm run bench:cli -- [--runs N] [--bin path/to/corral.js] [--json] [--check]
  --runs N   timed runs of each command (default 15)
  --bin P    the corral.js to measure (default: this checkout's bin/corral.js)
  --json     print the results as JSON
  --check    exit 1 when a command misses its target`;

interface Sample {
  name: string;
  args: string[];
  /** Most times a bare `node -e 0` this command may take (best runs compared); none for the baseline. */
  target?: number;
  ms: number[];
}

function parse() {
  const { values } = parseArgs({
    options: {
      runs: { type: 'string', default: '15' },
      bin: { type: 'string' },
      json: { type: 'boolean', default: false },
      check: { type: 'boolean', default: false },
      help: { type: 'boolean', default: false },
    },
  });
  if (values.help) {
    console.log(HELP);
    process.exit(0);
  }
  const runs = Number(values.runs);
  if (!Number.isInteger(runs) || runs < 1 || runs > 1000) {
    console.error(`bench:cli: --runs must be an integer in 1..1000\n${HELP}`);
    process.exit(2);
  }
  const bin = resolve(values.bin ?? fileURLToPath(new URL('../bin/corral.js', import.meta.url)));
  return { runs, bin, json: values.json, check: values.check };
}

function timeOnce(args: string[], env: NodeJS.ProcessEnv): number {
  const t0 = process.hrtime.bigint();
  const res = spawnSync(process.execPath, args, { env, stdio: ['ignore', 'ignore', 'pipe'], encoding: 'utf8' });
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  if (res.status !== 0) throw new Error(`${args.join(' ')} exited ${res.status}: ${res.stderr}`);
  return ms;
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
};
const best = (xs: number[]) => Math.min(...xs);

async function main(): Promise<void> {
  const opts = parse();
  let home: string | undefined;
  let url = process.env.DATABASE_URL;
  const cliHome = await mkdtemp(join(tmpdir(), 'corral-bench-cli-'));
  await chmod(cliHome, 0o755);
  try {
    if (!url) {
      home = cliHome;
      url = (await ensureEmbeddedPostgres({ homeDir: home, ephemeral: true })).url;
    }
    const env = { ...process.env, DATABASE_URL: url, CORRAL_HOME: cliHome, CORRAL_LOG_LEVEL: 'warn' };
    const migrate = spawnSync(process.execPath, [opts.bin, 'db', 'migrate'], { env, encoding: 'utf8' });
    if (migrate.status !== 0) throw new Error(`corral db migrate failed: ${migrate.stderr}`);

    // `send` runs first in every round, so `actor` always finds the actor it sent to.
    const samples: Sample[] = [
      { name: 'node -e 0', args: ['-e', '0'], ms: [] },
      { name: 'corral --help', args: [opts.bin, '--help'], target: 4, ms: [] },
      { name: 'corral send', args: [opts.bin, 'send', 'bench/cli', '{"text":"x"}'], target: 8, ms: [] },
      { name: 'corral transcript', args: [opts.bin, 'transcript', 'bench/cli'], target: 8, ms: [] },
      { name: 'corral status', args: [opts.bin, 'status'], target: 8, ms: [] },
      { name: 'corral actor', args: [opts.bin, 'actor', 'bench/cli'], target: 8, ms: [] },
      { name: 'corral dlq list', args: [opts.bin, 'dlq', 'list'], target: 8, ms: [] },
    ];
    for (const s of samples) timeOnce(s.args, env); // warm the OS cache and Node's compile cache
    for (let i = 0; i < opts.runs; i++) {
      for (const s of samples) s.ms.push(timeOnce(s.args, env));
      process.stderr.write(`\rbench:cli: run ${i + 1}/${opts.runs}`);
    }
    process.stderr.write('\n');
    const baseBest = best(samples[0]!.ms);
    const baseMedian = median(samples[0]!.ms);
    const rows = samples.map((s) => {
      const ratio = best(s.ms) / baseBest;
      return {
        command: s.name,
        bestMs: +best(s.ms).toFixed(1),
        ratio: +ratio.toFixed(2),
        medianMs: +median(s.ms).toFixed(1),
        medianRatio: +(median(s.ms) / baseMedian).toFixed(2),
        ...(s.target !== undefined ? { target: s.target, pass: ratio <= s.target } : {}),
      };
    });
    const missed = rows.filter((r) => r.pass === false);
    if (opts.json)
      console.log(JSON.stringify({ bin: opts.bin, runs: opts.runs, node: process.version, rows, pass: missed.length === 0 }, null, 2));
    else {
      console.log(
        `CLI start-up (${opts.runs} interleaved runs each; ratios to a bare node -e 0, best to best and median to median; ${process.version})`,
      );
      console.log('command              best ms   ratio   median ms   ratio   target');
      for (const r of rows) {
        const target = r.target === undefined ? '' : `≤ ${r.target}× ${r.pass ? 'ok' : 'MISSED'}`;
        console.log(
          `${r.command.padEnd(20)} ${r.bestMs.toFixed(1).padStart(7)}   ${r.ratio.toFixed(2).padStart(5)}×` +
            `   ${r.medianMs.toFixed(1).padStart(9)}   ${r.medianRatio.toFixed(2).padStart(5)}×   ${target}`,
        );
      }
      console.log(
        missed.length === 0
          ? `PASS: every command within its target (best of ${opts.runs})`
          : `FAIL: ${missed.map((r) => `${r.command} ${r.ratio.toFixed(2)}× > ${r.target}×`).join(', ')} (best of ${opts.runs})`,
      );
    }
    if (opts.check && missed.length > 0) process.exitCode = 1;
  } finally {
    if (home) await stopEmbeddedPostgres(home).catch(() => false);
    await rm(cliHome, { recursive: true, force: true });
  }
}

await main();
