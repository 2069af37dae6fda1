/**
 * CLI start-up benchmark: how long `corral --help`, `corral send` and `corral transcript` take,
 * as ratios to a bare `node -e 0` measured in the same run (interleaved, so a noisy machine
 * slows all alike). Targets: `--help` ≤ 4×, `send` ≤ 8× (see docs/benchmarks.md).
 *
 *   npm run bench:cli -- [--runs N] [--bin path/to/corral.js] [--json]
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
import { ensureEmbeddedPostgres, stopEmbeddedPostgres } from '../src/db/embedded.ts';

const HELP = `usage: npm run bench:cli -- [--runs N] [--bin path/to/corral.js] [--json]
  --runs N   timed runs of each command (default 15)
  --bin P    the corral.js to measure (default: this checkout's bin/corral.js)
  --json     print the results as JSON`;

interface Sample {
  name: string;
  args: string[];
  ms: number[];
}

function parse() {
  const { values } = parseArgs({
    options: {
      runs: { type: 'string', default: '15' },
      bin: { type: 'string' },
      json: { type: 'boolean', default: false },
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
  return { runs, bin, json: values.json };
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

    const samples: Sample[] = [
      { name: 'node -e 0', args: ['-e', '0'], ms: [] },
      { name: 'corral --help', args: [opts.bin, '--help'], ms: [] },
      { name: 'corral send', args: [opts.bin, 'send', 'bench/cli', '{"text":"x"}'], ms: [] },
      { name: 'corral transcript', args: [opts.bin, 'transcript', 'bench/cli'], ms: [] },
    ];
    for (const s of samples) timeOnce(s.args, env); // warm the OS cache and Node's compile cache
    for (let i = 0; i < opts.runs; i++) {
      for (const s of samples) s.ms.push(timeOnce(s.args, env));
      process.stderr.write(`\rbench:cli: run ${i + 1}/${opts.runs}`);
    }
    process.stderr.write('\n');
    const base = median(samples[0]!.ms);
    const rows = samples.map((s) => ({ command: s.name, medianMs: +median(s.ms).toFixed(1), ratio: +(median(s.ms) / base).toFixed(2) }));
    if (opts.json) console.log(JSON.stringify({ bin: opts.bin, runs: opts.runs, node: process.version, rows }, null, 2));
    else {
      console.log(`CLI start-up (${opts.runs} interleaved runs each, medians; ratio to bare node -e 0; ${process.version})`);
      console.log('command              median ms   ratio');
      for (const r of rows) console.log(`${r.command.padEnd(20)} ${String(r.medianMs).padStart(9)}   ${r.ratio.toFixed(2)}×`);
    }
  } finally {
    if (home) await stopEmbeddedPostgres(home).catch(() => false);
    await rm(cliHome, { recursive: true, force: true });
  }
}

await main();
