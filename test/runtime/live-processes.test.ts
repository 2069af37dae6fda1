/**
 * Live turns on real processes (`corral daemon`, `corral worker`, `corral watch --json`, real
 * PostgreSQL and ZeroMQ):
 *  - a worker streams 50 chunks over 2 s: an SSE client of the HTTP API, a `corral watch --json`
 *    process and a `corral.watch` iterator each get all 50 in order, the first well before the
 *    commit, then the committed turn;
 *  - an SSE client that disconnects after chunk 20 and reconnects to another daemon with
 *    `Last-Event-ID` gets 21–50 exactly once, then the commit; so does `corral watch --url` there;
 *  - the fence: a worker SIGSTOPped mid-stream loses its lease; resumed, it keeps streaming the
 *    old attempt, and none of that reaches a watcher after the `reset`; the retry's chunks do, and
 *    the daemon counts the stale ones.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connect, type Corral, type LiveEvent } from '../../src/client/index.ts';
import { sseEvents } from '../../src/live/sse.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { fastRecoveryEnv, freePort, killAll, spawnCorral, stopGracefully, type Proc, exitOf } from '../helpers/processes.ts';
import { waitFor } from '../helpers/wait.ts';

const tdb = useTestDatabase();
let corral: Corral;
let env: Record<string, string>;
let metricsPort: number;
/** The HTTP APIs of the two daemons, and a token with both scopes. */
let apiA: string;
let apiB: string;
let token: string;
const procs: Proc[] = [];

const start = (args: string[], name: string) => {
  const p = spawnCorral(args, env, name);
  procs.push(p);
  return p;
};
const worker = (id: string) => start(['worker', '--id', id, '--endpoint', env.CORRAL_ENDPOINT!, '--capacity', '4', '--insecure'], id);

/** The `--json` lines a `corral watch` process printed so far. */
const printed = (p: Proc): LiveEvent[] =>
  p
    .log()
    .split('\n')
    .filter((l) => l.startsWith('{"id"'))
    .map((l) => JSON.parse(l) as LiveEvent);

const deltas = (seen: LiveEvent[]) => seen.flatMap((e) => (e.type === 'chunk' ? [(e.data.data as { delta: string }).delta] : []));
const words = (n: number) => Array.from({ length: n }, (_, i) => `w${i + 1} `);

beforeAll(async () => {
  metricsPort = await freePort();
  env = { ...fastRecoveryEnv(tdb.url, `tcp://127.0.0.1:${await freePort()}`), CORRAL_METRICS_PORT: String(metricsPort) };
  const [portA, portB] = [await freePort(), await freePort()];
  apiA = `http://127.0.0.1:${portA}`;
  apiB = `http://127.0.0.1:${portB}`;
  const daemon = start(['daemon', '--http-port', String(portA)], 'daemon');
  // a second daemon of the deployment, with no worker: only its API is used
  const other = spawnCorral(
    ['daemon', '--http-port', String(portB)],
    { ...env, CORRAL_ENDPOINT: `tcp://127.0.0.1:${await freePort()}`, CORRAL_METRICS_PORT: String(await freePort()) },
    'daemon-b',
  );
  procs.push(other);
  worker('lw-1');
  await waitFor(
    async () =>
      (await tdb.client.query(`select 1 from corral.workers where status = 'ready'`).catch(() => ({ rowCount: 0 }))).rowCount! > 0,
    { timeoutMs: 30_000, what: `a worker registered (log: ${daemon.logPath})` },
  );
  corral = await connect({ databaseUrl: tdb.url, env: {} });
  const tokens = start(['tokens', 'create', 'live-test', '--scope', 'read', '--scope', 'send'], 'tokens');
  expect(await exitOf(tokens)).toBe(0);
  token = /crl_[A-Za-z0-9_-]{43}/.exec(tokens.log())![0];
  for (const api of [apiA, apiB]) {
    await waitFor(
      async () => (await fetch(`${api}/v1/events/00000000-0000-4000-8000-000000000000`).catch(() => undefined))?.status === 401,
      {
        timeoutMs: 30_000,
        what: `the HTTP API at ${api}`,
      },
    );
  }
}, 90_000);

/** An SSE client of `api`'s stream of `actor`: its events as they come, until `stop` says so. */
async function sse(api: string, actor: string, stop: (seen: LiveEvent[]) => boolean, lastEventId?: string): Promise<LiveEvent[]> {
  const ctl = new AbortController();
  const res = await fetch(`${api}/v1/actors/${actor}/stream`, {
    headers: { authorization: `Bearer ${token}`, ...(lastEventId ? { 'last-event-id': lastEventId } : {}) },
    signal: ctl.signal,
  });
  expect(res.status).toBe(200);
  expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
  const seen: LiveEvent[] = [];
  try {
    for await (const e of sseEvents(res.body!)) {
      seen.push(e);
      if (stop(seen)) break;
    }
  } finally {
    ctl.abort();
  }
  return seen;
}

afterAll(async () => {
  await corral?.close();
  for (const p of procs) await stopGracefully(p);
  killAll();
});

describe('live turns on real processes', () => {
  it('an SSE client, a corral watch --json process and a corral.watch iterator each get all 50 chunks in order, then the commit', async () => {
    const cli = start(['watch', 'live/p50', '--json', '--once'], 'watch');
    const watch = await corral.watch('live/p50');
    // the CLI listens once it has printed nothing and its database backend is there: give it that moment
    await waitFor(
      async () => (await tdb.client.query(`select 1 from pg_stat_activity where application_name = 'corral-watch'`)).rowCount! > 0,
      {
        timeoutMs: 20_000,
        what: 'corral watch listening',
      },
    );
    const overHttp = sse(apiA, 'live/p50', (x) => x.some((e) => e.type === 'turn_committed'));
    await new Promise((r) => setTimeout(r, 300));
    const sentAt = performance.now();
    await corral.send('live/p50', { text: 'go', stream: 50, streamMs: 2000 });
    const seen: { e: LiveEvent; at: number }[] = [];
    for await (const e of watch) {
      seen.push({ e, at: performance.now() - sentAt });
      if (e.type === 'turn_committed') break;
    }
    const firstChunkAt = seen.find((x) => x.e.type === 'chunk')!.at;
    const committedAt = seen.at(-1)!.at;
    expect(committedAt - firstChunkAt, 'the first chunk came well before the commit').toBeGreaterThan(1000);
    expect(deltas(seen.map((x) => x.e))).toEqual(words(50));
    expect(await exitOf(cli)).toBe(0);
    const lines = printed(cli);
    expect(lines.map((e) => e.type)).toEqual(['turn_started', ...Array<string>(50).fill('chunk'), 'turn_committed']);
    expect(deltas(lines)).toEqual(words(50));
    expect(lines.map((e) => e.id)).toEqual(seen.map((x) => x.e.id));
    const http = await overHttp;
    expect(http.map((e) => e.id)).toEqual(seen.map((x) => x.e.id));
    expect(deltas(http)).toEqual(words(50));
  }, 60_000);

  it('an SSE client that leaves after chunk 20 and comes back to another daemon with Last-Event-ID gets 21–50 once', async () => {
    const first = sse(apiA, 'live/resume', (x) => x.filter((e) => e.type === 'chunk').length === 20);
    await new Promise((r) => setTimeout(r, 300));
    await corral.send('live/resume', { stream: 50, streamMs: 2500 });
    const before = await first;
    const last = before.at(-1)!;
    expect(last.type).toBe('chunk');
    const cli = spawnCorral(
      ['watch', 'live/resume', '--json', '--once', '--url', apiB, '--last-event-id', last.id],
      { ...env, CORRAL_TOKEN: token },
      'watch-url',
    );
    procs.push(cli);
    const after = await sse(apiB, 'live/resume', (x) => x.some((e) => e.type === 'turn_committed'), last.id);
    expect(after[0]!.type).toBe('chunk');
    expect(deltas(after)).toEqual(words(50).slice(20));
    expect(after.at(-1)!.type).toBe('turn_committed');
    expect(await exitOf(cli)).toBe(0);
    expect(printed(cli).map((e) => e.id)).toEqual(after.map((e) => e.id));
  }, 60_000);

  it('a paused worker that lost its lease streams on after it resumes: nothing of it reaches a watcher after the reset', async () => {
    const watch = await corral.watch('live/fence');
    const paused = procs.find((p) => p.logPath.endsWith('lw-1.log'))!;
    await corral.send('live/fence', { stream: 40, streamMs: 6000 });
    const seen: LiveEvent[] = [];
    let second: Proc | undefined;
    let resumed = false;
    let refusedBefore = 0;
    for await (const e of watch) {
      seen.push(e);
      if (e.type === 'chunk' && e.data.attempt === 1 && e.data.seq === 5 && !second) {
        paused.child.kill('SIGSTOP');
        second = worker('lw-2');
      }
      // the retry streams: let the old attempt's worker go on now
      if (e.type === 'chunk' && e.data.attempt === 2 && e.data.seq === 3 && !resumed) {
        resumed = true;
        refusedBefore = await refusedStale();
        paused.child.kill('SIGCONT');
      }
      if (e.type === 'turn_committed') break;
    }
    const reset = seen.findIndex((e) => e.type === 'reset');
    expect(reset, seen.map((e) => e.type).join(' ')).toBeGreaterThan(0);
    const before = seen.slice(0, reset);
    const after = seen.slice(reset);
    expect(before.at(-1)).toMatchObject({ type: 'turn_failed', data: { attempt: 1, reason: 'failed' } });
    expect(deltas(before)).toEqual(words(deltas(before).length));
    expect(after.filter((e) => e.type === 'chunk').every((e) => e.type === 'chunk' && e.data.attempt === 2)).toBe(true);
    expect(deltas(after)).toEqual(words(40));
    expect(after.at(-1)).toMatchObject({ type: 'turn_committed', data: { attempt: 2 } });
    // the resumed worker went on with its attempt, and the daemon's fence refused what it sent:
    // its chunks dropped as stale, or its reply answered `turn_rejected` stale_epoch (its
    // connection outlives the pause, so the daemon may answer its first message before it streams)
    await waitFor(async () => (await refusedStale()) > refusedBefore, {
      timeoutMs: 15_000,
      what: 'the resumed attempt refused by the fence',
    });
  }, 90_000);

  /** Stale chunks dropped plus replies refused for a stale epoch, so far (the daemon's metrics). */
  async function refusedStale(): Promise<number> {
    const text = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
    const count = (re: RegExp) => Number(re.exec(text)?.[1] ?? 0);
    return (
      count(/corral_stream_chunks_total\{outcome="stale"\} (\d+)/) + count(/corral_fence_rejections_total\{reason="stale_epoch"\} (\d+)/)
    );
  }
});
