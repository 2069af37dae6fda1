/**
 * Live turns: how soon a streamed chunk reaches a watcher, and what a chunk costs the daemon (see
 * docs/benchmarks.md, "Live turns").
 *
 *   npm run bench:stream -- [--via watch|sse] [--turns 200] [--rate 20] [--seconds 5] [--workers 2] [--capacity 128] [--flood] [--json]
 *
 * A daemon with W example workers runs as an OS process (`corral daemon --workers W`, as
 * deployed), with its HTTP API on. Each of `turns` actors is watched by one `corral.watch`
 * iterator in this process (`--via watch`, the default) or one SSE client of the daemon's
 * `GET …/stream` (`--via sse`, each its own HTTP connection),
 * then all get an event at once whose turn streams `rate` chunks per second for `seconds`
 * (`{"stream": N, "streamMs": T, "stamp": true}`: each chunk carries the time it was sent).
 * Latency of a chunk = when the watch yielded it − when the worker sent it (one host, one
 * clock). The same turns with no chunks (`delayMs` instead), run first, are the baseline: the
 * daemon's CPU per chunk is (CPU with chunks − CPU without) ÷ chunks.
 *
 * `--flood`: the streaming round runs once more while another turn streams 32 KiB chunks as fast
 * as its worker can for 10 s (the example worker's `flood`), and the two rounds' latencies are
 * compared: the flooding turn's stream budget (CORRAL_STREAM_TURN_BYTES) stops it at the worker,
 * so the other turns' chunks should not wait behind megabytes the daemon would only drop.
 */
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { connect, type Corral, type LiveEvent } from '../src/client/index.ts';
import { openDatabase } from '../src/db/client.ts';
import { progress, round, runBench, summarise, type Percentiles } from './lib/common.ts';
import { openBenchDatabase } from './lib/database.ts';
import { sseEvents } from '../src/live/sse.ts';
import { freePort } from '../src/db/postgres/net.ts';
import { daemonCpuMs, freshDatabase, startDaemonProcess, waitForWorkers, type DaemonProcess } from './lib/daemon-process.ts';

function options() {
  const { values } = parseArgs({
    options: {
      via: { type: 'string', default: 'watch' },
      turns: { type: 'string', default: '200' },
      rate: { type: 'string', default: '20' },
      seconds: { type: 'string', default: '5' },
      workers: { type: 'string', default: '2' },
      capacity: { type: 'string', default: '128' },
      flood: { type: 'boolean', default: false },
      json: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (values.help) {
    process.stdout.write(
      'usage: npm run bench:stream -- [--via watch|sse] [--turns N] [--rate R] [--seconds S] [--workers W] [--capacity C] [--flood] [--json]\n',
    );
    process.exit(0);
  }
  const int = (name: string, v: string) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < 1) {
      process.stderr.write(`bench:stream: --${name} takes a positive integer\n`);
      process.exit(2);
    }
    return n;
  };
  if (values.via !== 'watch' && values.via !== 'sse') {
    process.stderr.write('bench:stream: --via takes watch or sse\n');
    process.exit(2);
  }
  return {
    via: values.via,
    turns: int('turns', values.turns),
    rate: int('rate', values.rate),
    seconds: int('seconds', values.seconds),
    workers: int('workers', values.workers),
    capacity: int('capacity', values.capacity),
    flood: values.flood,
    json: values.json,
  };
}

type Options = ReturnType<typeof options>;

interface RoundResult {
  chunks: number;
  expected: number;
  latencyMs: Percentiles | undefined;
  /** Worker → the daemon's insert of the chunk (a sample). */
  storedMs: Percentiles | undefined;
  daemonCpuMs: number;
  wallMs: number;
}

/** Every actor watched, one event each at once; resolves when every turn committed. */
let tokensMade = 0;

/**
 * The HTTP API's stream of `actor` as an iterable, closed by `close()`. Each stream has a token of
 * its own, for its actor alone, as an application's backend mints one for each end user's page.
 */
async function sseWatch(
  api: { url: string; corral: Corral },
  actor: string,
): Promise<AsyncIterable<LiveEvent> & { close(): Promise<void> }> {
  const { token } = await api.corral.tokens.create({ name: `bench-${++tokensMade}`, scopes: ['read'], actors: [actor], ttl: '1h' });
  const ctl = new AbortController();
  const res = await fetch(`${api.url}/v1/actors/${actor}/stream`, {
    headers: { authorization: `Bearer ${token}` },
    signal: ctl.signal,
  });
  if (res.status !== 200 || !res.body) throw new Error(`stream of ${actor}: HTTP ${res.status} ${await res.text()}`);
  const events = sseEvents(res.body);
  return {
    [Symbol.asyncIterator]: () => events,
    close: async () => ctl.abort(),
  };
}

let api: { url: string; corral: Corral } | undefined;

async function runRound(
  corral: Corral,
  pool: pg.Pool,
  d: DaemonProcess,
  o: Options,
  tag: string,
  streaming: boolean,
): Promise<RoundResult> {
  const actors = Array.from({ length: o.turns }, (_, i) => `bench-stream/${tag}-${i}`);
  const watches = await Promise.all(actors.map((a) => (o.via === 'sse' ? sseWatch(api!, a) : corral.watch(a))));
  const latencies: number[] = [];
  let chunks = 0;
  const read = watches.map(async (w) => {
    for await (const e of w as AsyncIterable<LiveEvent>) {
      if (e.type === 'chunk') {
        chunks++;
        const t = (e.data.data as { t?: number }).t;
        if (typeof t === 'number') latencies.push(performance.timeOrigin + performance.now() - t);
      }
      if (e.type === 'error') throw new Error(`watch error: ${e.data.message}`);
      if (e.type === 'turn_committed' || e.type === 'turn_failed') break;
    }
  });
  const n = o.rate * o.seconds;
  const data = streaming ? { stream: n, streamMs: o.seconds * 1000, stamp: true } : { delayMs: o.seconds * 1000 };
  // where a chunk waits: worker → the daemon's insert (the row's created_at), sampled while the turns stream
  const stored: number[] = [];
  let sampling = streaming;
  const sampler = (async () => {
    while (sampling) {
      const { rows } = await pool.query<{ ms: number }>(
        `select extract(epoch from created_at) * 1000 - (data->>'t')::float8 as ms from corral.stream_chunks
          where data ? 't' and created_at > now() - interval '250 milliseconds'`,
      );
      for (const r of rows) stored.push(Number(r.ms));
      await new Promise((r) => setTimeout(r, 250));
    }
  })();
  const cpu0 = (await daemonCpuMs(d)).daemon;
  const t0 = performance.now();
  await corral.sendMany(actors.map((actor) => ({ actor, data })));
  await Promise.all(read);
  const wallMs = performance.now() - t0;
  const cpuMs = (await daemonCpuMs(d)).daemon - cpu0;
  sampling = false;
  await sampler;
  for (const w of watches) await w.close();
  // SSE clients whose response was aborted: let their sockets close before the next round
  if (o.via === 'sse') await new Promise((r) => setTimeout(r, 200));
  const expected = streaming ? n * o.turns : 0;
  progress(`${tag}: ${chunks}/${expected} chunks in ${(wallMs / 1000).toFixed(1)} s, daemon CPU ${cpuMs.toFixed(0)} ms`);
  return {
    chunks,
    expected,
    latencyMs: latencies.length ? summarise(latencies) : undefined,
    storedMs: stored.length ? summarise(stored) : undefined,
    daemonCpuMs: cpuMs,
    wallMs,
  };
}

process.exitCode = await runBench(async (cleanup) => {
  const o = options();
  const server = await openBenchDatabase(cleanup);
  const db = await freshDatabase(server.url, cleanup, 'corral_stream');
  const httpPort = await freePort();
  const d = await startDaemonProcess(
    {
      url: db.url,
      workers: o.workers,
      capacity: o.capacity,
      env: {
        CORRAL_HTTP_PORT: String(httpPort),
        CORRAL_HTTP_MAX_STREAMS_PER_ACTOR: '4',
        CORRAL_HTTP_MAX_STREAMS: String(2 * o.turns + 100),
      },
    },
    cleanup,
  );
  const probe = openDatabase(db.url, { max: 1 });
  try {
    await waitForWorkers(probe, o.workers, 120_000, d.proc);
  } finally {
    await probe.close();
  }
  const corral = await connect({ databaseUrl: db.url, env: {}, maxConnections: 8 });
  cleanup.defer('close client', () => corral.close());
  api = { url: `http://127.0.0.1:${httpPort}`, corral };
  const pool = new pg.Pool({ connectionString: db.url, max: 1 });
  cleanup.defer('close pool', () => pool.end());
  await runRound(corral, pool, d, { ...o, turns: Math.min(o.turns, 20), seconds: 1 }, 'warm', true);
  const quiet = await runRound(corral, pool, d, o, 'no-chunks', false);
  const live = await runRound(corral, pool, d, o, 'chunks', true);
  const flooded = o.flood ? await floodRound(corral, pool, d, o) : undefined;
  const cpuPerChunkUs = ((live.daemonCpuMs - quiet.daemonCpuMs) / Math.max(1, live.chunks)) * 1000;
  const report = {
    via: o.via,
    turns: o.turns,
    chunksPerSecondPerTurn: o.rate,
    seconds: o.seconds,
    chunks: { received: live.chunks, expected: live.expected },
    latencyMs: live.latencyMs,
    storedMs: live.storedMs,
    daemonCpuMs: { withoutChunks: round(quiet.daemonCpuMs, 0), withChunks: round(live.daemonCpuMs, 0) },
    daemonCpuPerChunkUs: round(cpuPerChunkUs, 1),
    ...(flooded
      ? {
          flood: {
            latencyMs: flooded.round.latencyMs,
            p95Ratio: round((flooded.round.latencyMs?.p95 ?? NaN) / (live.latencyMs?.p95 ?? NaN), 2),
            floodingTurn: flooded.flood,
          },
        }
      : {}),
  };
  if (o.json) {
    process.stdout.write(`${JSON.stringify(report, null, 2)}\n`);
    return 0;
  }
  const l = live.latencyMs;
  process.stdout.write(
    `${o.turns} turns × ${o.rate} chunks/s for ${o.seconds} s (${o.turns * o.rate} chunks/s): ${live.chunks}/${live.expected} chunks received\n` +
      `chunk latency worker → ${o.via === 'sse' ? 'SSE client' : 'corral.watch'}: p50 ${round(l?.p50 ?? NaN)} ms, p95 ${round(l?.p95 ?? NaN)} ms, p99 ${round(l?.p99 ?? NaN)} ms\n` +
      `  of which worker → the daemon's insert (a sample): p50 ${round(live.storedMs?.p50 ?? NaN)} ms, p95 ${round(live.storedMs?.p95 ?? NaN)} ms\n` +
      `daemon CPU: ${round(quiet.daemonCpuMs, 0)} ms without chunks, ${round(live.daemonCpuMs, 0)} ms with: ${round(cpuPerChunkUs, 1)} µs per chunk\n`,
  );
  if (flooded) {
    const f = flooded.round.latencyMs;
    process.stdout.write(
      `with a turn flooding 32 KiB chunks beside them: ${flooded.round.chunks}/${flooded.round.expected} chunks received, ` +
        `p50 ${round(f?.p50 ?? NaN)} ms, p95 ${round(f?.p95 ?? NaN)} ms (p95 ${report.flood?.p95Ratio}× the round without it)\n` +
        `  the flooding turn: ${JSON.stringify(flooded.flood)}\n`,
    );
  }
  const complete = live.chunks === live.expected && (!flooded || flooded.round.chunks === flooded.round.expected);
  return complete ? 0 : 1;
});

/**
 * `--flood`: the streaming round again, started while another turn floods its stream (32 KiB
 * chunks, as fast as its worker sends, for 10 s); resolves with that round and what the flooding
 * turn says it streamed before its budget stopped it.
 */
async function floodRound(corral: Corral, pool: pg.Pool, d: DaemonProcess, o: Options): Promise<{ round: RoundResult; flood: unknown }> {
  const actor = 'bench-stream/flood';
  const [sent] = await corral.sendMany([{ actor, data: { flood: { chunkBytes: 32 * 1024, ms: 10_000 } } }]);
  // the flood is under way before the measured turns start
  await new Promise((r) => setTimeout(r, 300));
  const measured = await runRound(corral, pool, d, o, 'chunks-beside-a-flood', true);
  const turn = await corral.waitForTurn(sent!.eventId, { timeoutMs: 60_000 });
  const content = turn.messages.find((m) => m.role === 'assistant')?.content as { flood?: unknown } | undefined;
  return { round: measured, flood: content?.flood };
}
