/**
 * Idle actors: what a daemon keeps per actor that committed a turn and went idle. A daemon
 * (`corral daemon --workers W`, real processes) runs one real turn for each of N new actors,
 * fed in chunks so the backlog stays small; then its RSS (and V8 heap, from its metrics endpoint)
 * is read once the actors are idle, against the same figures after a warm-up on other actors:
 * bytes per idle actor = growth / N. The same is read again after the idle timeout, once the
 * actors' activations were stopped. Finally single events to old actors, one at a time: they
 * must still wake (enqueue → commit latency). See docs/benchmarks.md.
 *
 *   npm run bench:idle -- [--actors 10000] [--workers 2] [--capacity 32] [--samples 30]
 *                         [--idle-timeout-ms 20000] [--heap-snapshot]
 *
 * `--actors 100000` is the issue's size (several minutes of real turns). `--control` runs as many
 * turns on the warm-up's actors instead (no new actor): the memory the same throughput leaves
 * behind without any actor to remember, to tell per-actor state from allocator retention. `--heap-snapshot` makes
 * the daemon write a V8 heap snapshot (`--heapsnapshot-signal`) after the seeding and lists the
 * constructors whose object counts grew with the actors. Embedded PostgreSQL unless DATABASE_URL.
 */
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { DEFAULT_WORKER_CAPACITY } from '../src/base/defaults.ts';
import { actorKey } from '../src/base/actor-key.ts';
import { freePort } from '../src/db/postgres/net.ts';
import { progress, runBench, sleep, summarise, until } from './lib/common.ts';
import { openBenchDatabase } from './lib/database.ts';
import {
  freshDatabase,
  openBenchClient,
  lazyFreeBytes,
  rssBytes,
  scalar,
  startDaemonProcess,
  waitForWorkers,
  type BenchClient,
  type DaemonProcess,
} from './lib/daemon-process.ts';
import { heapCounts } from './lib/heap-snapshot.ts';

function options() {
  const { values } = parseArgs({
    options: {
      actors: { type: 'string', default: '10000' },
      workers: { type: 'string', default: '2' },
      capacity: { type: 'string', default: String(DEFAULT_WORKER_CAPACITY) },
      samples: { type: 'string', default: '30' },
      'idle-timeout-ms': { type: 'string', default: '20000' },
      'heap-snapshot': { type: 'boolean', default: false },
      control: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (values.help) {
    process.stdout.write(
      'usage: npm run bench:idle -- [--actors N] [--workers W] [--capacity C] [--samples S] [--idle-timeout-ms T] [--heap-snapshot] [--control]\n',
    );
    process.exit(0);
  }
  const o = {
    actors: Number(values.actors),
    workers: Number(values.workers),
    capacity: Number(values.capacity),
    samples: Number(values.samples),
    idleTimeoutMs: Number(values['idle-timeout-ms']),
    heapSnapshot: values['heap-snapshot'],
    control: values.control,
  };
  if (![o.actors, o.workers, o.capacity, o.idleTimeoutMs].every((n) => Number.isInteger(n) && n > 0) || !(o.samples >= 0)) {
    process.stderr.write('bench:idle: positive integers expected\n');
    process.exit(2);
  }
  return o;
}

/** The daemon's memory gauges from its Prometheus endpoint (prom-client's default metrics). */
async function gauges(metricsPort: number): Promise<{ heap?: number; heapTotal?: number; external?: number }> {
  try {
    const text = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
    const read = (name: string) => {
      const m = new RegExp(`^corral_${name} (\\S+)`, 'm').exec(text);
      return m ? Number(m[1]) : undefined;
    };
    const heap = read('nodejs_heap_size_used_bytes');
    const heapTotal = read('nodejs_heap_size_total_bytes');
    const external = read('nodejs_external_memory_bytes');
    return {
      ...(heap !== undefined ? { heap } : {}),
      ...(heapTotal !== undefined ? { heapTotal } : {}),
      ...(external !== undefined ? { external } : {}),
    };
  } catch {
    return {};
  }
}

interface Memory {
  rss: number;
  /** V8 heap in use, V8 heap committed (pages it holds), memory outside the heap held by JS objects (Buffers …). */
  heap: number | undefined;
  heapTotal: number | undefined;
  external: number | undefined;
  /** RSS less the pages freed lazily (MADV_FREE) that the kernel has not reclaimed yet. */
  held: number | undefined;
}

/** Memory once settled: each figure the lowest of five reads a second apart (a GC may run in between). */
async function settledMemory(d: DaemonProcess, metricsPort: number): Promise<Memory> {
  const reads: Memory[] = [];
  for (let i = 0; i < 5; i++) {
    await sleep(1_000);
    const g = await gauges(metricsPort);
    const rss = (await rssBytes(d.pid)) ?? Number.NaN;
    const lazy = await lazyFreeBytes(d.pid);
    reads.push({ rss, heap: g.heap, heapTotal: g.heapTotal, external: g.external, held: lazy === undefined ? undefined : rss - lazy });
  }
  const low = (k: keyof Memory) => {
    const xs = reads.map((r) => r[k]).filter((x): x is number => x !== undefined);
    return xs.length ? Math.min(...xs) : undefined;
  };
  return { rss: low('rss')!, heap: low('heap'), heapTotal: low('heapTotal'), external: low('external'), held: low('held') };
}

/** Runs one turn for each of `keys`, keeping at most `window` events queued. */
async function seed(client: BenchClient, prefix: string, n: number, window = 2_000, actors = n): Promise<void> {
  const base = await client.succeeded();
  let enqueued = 0;
  let lastLog = performance.now();
  while (enqueued < n) {
    const done = (await client.succeeded()) - base;
    const room = Math.min(n - enqueued, done + window - enqueued);
    if (room >= Math.min(500, n - enqueued)) {
      await client.enqueue(
        Array.from({ length: room }, (_, i) => ({ key: actorKey(`${prefix}-${(enqueued + i) % actors}`, 's'), event: { text: 'hello' } })),
      );
      enqueued += room;
    } else await sleep(100);
    if (performance.now() - lastLog > 10_000) {
      lastLog = performance.now();
      progress(`seeding ${prefix}: ${done}/${n} turns committed`);
    }
  }
  await until(async () => (await client.succeeded()) - base >= n, performance.now() + 600_000, `${n} ${prefix} turns committed`, 200);
}

async function main(): Promise<number> {
  const opts = options();
  return runBench(async (cleanup) => {
    const server = await openBenchDatabase(cleanup);
    const db = await freshDatabase(server.url, cleanup, 'corral_idle');
    const metricsPort = await freePort();
    const snapDir = await mkdtemp(join(tmpdir(), 'corral-bench-heap-'));
    cleanup.defer('remove heap snapshots', () => rm(snapDir, { recursive: true, force: true }));
    const daemon = await startDaemonProcess(
      {
        url: db.url,
        workers: opts.workers,
        capacity: opts.capacity,
        env: {
          CORRAL_METRICS_PORT: String(metricsPort),
          CORRAL_IDLE_TIMEOUT_MS: String(opts.idleTimeoutMs),
          ...(opts.heapSnapshot ? { NODE_OPTIONS: `--heapsnapshot-signal=SIGUSR2 --diagnostic-dir=${snapDir}` } : {}),
        },
      },
      cleanup,
    );
    const probe = await openBenchClient(db.url, cleanup).catch(async () => {
      // pg-boss's schema may not exist before the daemon's first start has finished
      await sleep(3_000);
      return openBenchClient(db.url, cleanup);
    });
    await waitForWorkers(probe.db, opts.workers, 90_000, daemon.proc);
    const t0 = performance.now();
    // Warm-up on other actors, so the baseline has every code path, pool and buffer already.
    const warm = Math.min(2_000, opts.actors);
    await seed(probe, 'warm', warm);
    await sleep(7_000); // the warm-up's controllers linger 5 s
    const before = await settledMemory(daemon, metricsPort);
    const snapshotsBefore = opts.heapSnapshot ? await snapshot(daemon, snapDir) : undefined;
    progress(
      `baseline after ${warm} warm-up actors: RSS ${(before.rss / 2 ** 20).toFixed(1)} MiB, heap ${((before.heap ?? Number.NaN) / 2 ** 20).toFixed(1)} MiB`,
    );
    const tSeed = performance.now();
    // --control: as many turns, on the warm-up's actors again (no new actor): what the same
    // throughput leaves in the process without any new actor to remember.
    if (opts.control) await seed(probe, 'warm', opts.actors, 2_000, warm);
    else await seed(probe, 'idle', opts.actors);
    const seedSeconds = (performance.now() - tSeed) / 1000;
    progress(`${opts.actors} actors seeded in ${seedSeconds.toFixed(0)} s (${(opts.actors / seedSeconds).toFixed(0)} turns/s)`);
    await sleep(7_000);
    const warmIdle = await settledMemory(daemon, metricsPort);
    const growth =
      opts.heapSnapshot && snapshotsBefore ? diffCounts(snapshotsBefore, await snapshot(daemon, snapDir), opts.actors) : undefined;
    const liveActivations = () =>
      scalar(
        probe.db.pool,
        `select count(*)::int as n from corral.activations where status in ('starting', 'active', 'idle', 'running')`,
      ).catch(() => Number.NaN);
    const liveWarm = await liveActivations();
    // After the idle timeout the activations are stopped (the watchdog): what is left per actor.
    await sleep(opts.idleTimeoutMs + 3_000);
    const afterTimeout = await settledMemory(daemon, metricsPort);
    const liveAfter = await liveActivations();

    // Old actors still wake: one event at a time, to actors chosen across the seeded range.
    const latencies: number[] = [];
    for (let i = 0; i < opts.samples; i++) {
      const key = opts.control
        ? actorKey(`warm-${i % warm}`, 's')
        : actorKey(`idle-${Math.floor(((i + 0.5) * opts.actors) / opts.samples)}`, 's');
      await sleep(50);
      const t = performance.now();
      const [id] = await probe.enqueue([{ key, event: { text: 'wake' } }]);
      await until(
        async () =>
          (await scalar(probe.db.pool, `select count(*)::int as n from corral.turns where event_id = $1 and status = 'succeeded'`, [
            id,
          ])) === 1,
        performance.now() + 30_000,
        `old actor ${key.sessionId} woken`,
        2,
      );
      latencies.push(performance.now() - t);
    }
    const wake = summarise(latencies);
    const perActor = (a: number | undefined, b: number | undefined) =>
      a !== undefined && b !== undefined ? (b - a) / opts.actors : Number.NaN;
    const mib = (x: number | undefined) => (x === undefined ? '?' : `${(x / 2 ** 20).toFixed(1)} MiB`);
    const out = (x: string) => process.stdout.write(`${x}\n`);
    out(
      opts.control
        ? `\ncontrol: ${opts.actors} turns on the ${warm} warm-up actors again (no new actor), daemon process (${opts.workers} worker processes × ${opts.capacity}); "per actor" = per turn`
        : `\nidle actors: ${opts.actors} actors with one committed turn each, daemon process (${opts.workers} worker processes × ${opts.capacity})`,
    );
    out(`seeding                  ${seedSeconds.toFixed(0)} s, ${(opts.actors / seedSeconds).toFixed(0)} turns/s (at most 2,000 queued)`);
    out(`daemon RSS               before ${mib(before.rss)} → idle ${mib(warmIdle.rss)} → after idle timeout ${mib(afterTimeout.rss)}`);
    out(`daemon V8 heap used      before ${mib(before.heap)} → idle ${mib(warmIdle.heap)} → after idle timeout ${mib(afterTimeout.heap)}`);
    out(
      `bytes per idle actor     RSS ${perActor(before.rss, warmIdle.rss).toFixed(0)} B (activations live: ${liveWarm}), ${perActor(before.rss, afterTimeout.rss).toFixed(0)} B after the idle timeout (live: ${liveAfter}); target ≤ 500 B`,
    );
    out(
      `  RSS less lazily freed  ${mib(before.held)} → ${mib(warmIdle.held)} → ${mib(afterTimeout.held)}: ${perActor(before.held, afterTimeout.held).toFixed(0)} B per actor after the idle timeout (pages freed with MADV_FREE stay in RSS until the kernel needs them)`,
    );
    out(
      `  V8 heap in use         ${perActor(before.heap, warmIdle.heap).toFixed(0)} B idle, ${perActor(before.heap, afterTimeout.heap).toFixed(0)} B after the idle timeout`,
    );
    out(
      `  V8 heap committed      ${mib(before.heapTotal)} → ${mib(warmIdle.heapTotal)} → ${mib(afterTimeout.heapTotal)}: ${perActor(before.heapTotal, afterTimeout.heapTotal).toFixed(0)} B per actor after the idle timeout`,
    );
    out(`  external (Buffers …)   ${mib(before.external)} → ${mib(warmIdle.external)} → ${mib(afterTimeout.external)}`);
    const rest = (m: Memory) => (m.heapTotal !== undefined && m.external !== undefined ? m.rss - m.heapTotal - m.external : undefined);
    out(
      `  RSS outside V8 heap and external (code, malloc arenas, libzmq, pg) ${mib(rest(before))} → ${mib(rest(afterTimeout))}: ${perActor(rest(before), rest(afterTimeout)).toFixed(0)} B per actor`,
    );
    out(
      `wake an old actor        p50 ${wake.p50.toFixed(1)} ms  p95 ${wake.p95.toFixed(1)} ms  max ${wake.max.toFixed(1)} ms  (${wake.n} events, enqueue → succeeded turn seen, 2 ms polls)`,
    );
    if (growth) {
      out(`\nV8 live heap (heap snapshots, after a full GC): ${growth.totalPerActor.toFixed(0)} B per idle actor`);
      out('heap objects that grew with the actors (snapshots before and after seeding):');
      out('  per actor   bytes/actor   constructor');
      for (const g of growth.rows) out(`  ${g.perActor.toFixed(2).padStart(9)}   ${g.bytesPerActor.toFixed(0).padStart(11)}   ${g.name}`);
    }
    out(`bench duration           ${((performance.now() - t0) / 1000).toFixed(0)} s`);
    return 0;
  });
}

/** Makes the daemon write a heap snapshot (SIGUSR2) and counts its objects by constructor. */
async function snapshot(d: DaemonProcess, dir: string): Promise<Map<string, { count: number; bytes: number }>> {
  const before = new Set(await readdir(dir));
  process.kill(d.pid, 'SIGUSR2');
  const file = await until(
    async () => (await readdir(dir)).find((f) => f.endsWith('.heapsnapshot') && !before.has(f)),
    performance.now() + 120_000,
    'the heap snapshot',
    500,
  );
  // written in place: wait until its size stops changing
  let size = -1;
  for (;;) {
    await sleep(1_000);
    const s = (await readFile(join(dir, file))).length;
    if (s === size && s > 0) break;
    size = s;
  }
  const counts = heapCounts(await readFile(join(dir, file), 'utf8'));
  await rm(join(dir, file), { force: true });
  return counts;
}

function diffCounts(a: Map<string, { count: number; bytes: number }>, b: Map<string, { count: number; bytes: number }>, actors: number) {
  const rows: { name: string; perActor: number; bytesPerActor: number }[] = [];
  const total = (m: Map<string, { bytes: number }>) => [...m.values()].reduce((x, v) => x + v.bytes, 0);
  for (const [name, v] of b) {
    const w = a.get(name) ?? { count: 0, bytes: 0 };
    const bytes = v.bytes - w.bytes;
    if (bytes / actors >= 4) rows.push({ name, perActor: (v.count - w.count) / actors, bytesPerActor: bytes / actors });
  }
  return { totalPerActor: (total(b) - total(a)) / actors, rows: rows.sort((x, y) => y.bytesPerActor - x.bytesPerActor).slice(0, 15) };
}

process.exitCode = await main();
