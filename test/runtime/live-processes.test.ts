/**
 * Live turns on real processes (`corral daemon`, `corral worker`, `corral watch --json`, real
 * PostgreSQL and ZeroMQ):
 *  - a worker streams 50 chunks over 2 s: a `corral watch --json` process and a `corral.watch`
 *    iterator each get all 50 in order, the first well before the commit, then the committed turn;
 *  - the fence: a worker SIGSTOPped mid-stream loses its lease; resumed, it keeps streaming the
 *    old attempt, and none of that reaches a watcher after the `reset`; the retry's chunks do, and
 *    the daemon counts the stale ones.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { connect, type Corral, type LiveEvent } from '../../src/client/index.ts';
import { createTestDatabase, type TestDatabase } from '../helpers/db.ts';
import { fastRecoveryEnv, freePort, killAll, spawnCorral, stopGracefully, type Proc } from '../helpers/processes.ts';
import { waitFor } from '../helpers/wait.ts';

let db: TestDatabase;
let client: pg.Client;
let corral: Corral;
let env: Record<string, string>;
let metricsPort: number;
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
  db = await createTestDatabase();
  metricsPort = await freePort();
  env = { ...fastRecoveryEnv(db.url, `tcp://127.0.0.1:${await freePort()}`), CORRAL_METRICS_PORT: String(metricsPort) };
  const daemon = start(['daemon'], 'daemon');
  client = new pg.Client({ connectionString: db.url });
  await client.connect();
  worker('lw-1');
  await waitFor(
    async () => (await client.query(`select 1 from corral.workers where status = 'ready'`).catch(() => ({ rowCount: 0 }))).rowCount! > 0,
    { timeoutMs: 30_000, what: `a worker registered (log: ${daemon.logPath})` },
  );
  corral = await connect({ databaseUrl: db.url, env: {} });
}, 60_000);

afterAll(async () => {
  await corral?.close();
  await client?.end();
  for (const p of procs) await stopGracefully(p);
  killAll();
  await db?.drop();
});

describe('live turns on real processes', () => {
  it('a corral watch --json process and a corral.watch iterator each get all 50 chunks in order, then the commit', async () => {
    const cli = start(['watch', 'live/p50', '--json', '--once'], 'watch');
    const watch = await corral.watch('live/p50');
    // the CLI listens once it has printed nothing and its database backend is there: give it that moment
    await waitFor(
      async () => (await client.query(`select 1 from pg_stat_activity where application_name = 'corral-watch'`)).rowCount! > 0,
      {
        timeoutMs: 20_000,
        what: 'corral watch listening',
      },
    );
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
    expect(await cli.exited).toBe(0);
    const lines = printed(cli);
    expect(lines.map((e) => e.type)).toEqual(['turn_started', ...Array<string>(50).fill('chunk'), 'turn_committed']);
    expect(deltas(lines)).toEqual(words(50));
    expect(lines.map((e) => e.id)).toEqual(seen.map((x) => x.e.id));
  }, 60_000);

  it('a paused worker that lost its lease streams on after it resumes: nothing of it reaches a watcher after the reset', async () => {
    const watch = await corral.watch('live/fence');
    const paused = procs.find((p) => p.logPath.endsWith('lw-1.log'))!;
    await corral.send('live/fence', { stream: 40, streamMs: 6000 });
    const seen: LiveEvent[] = [];
    let second: Proc | undefined;
    let resumed = false;
    for await (const e of watch) {
      seen.push(e);
      if (e.type === 'chunk' && e.data.attempt === 1 && e.data.seq === 5 && !second) {
        paused.child.kill('SIGSTOP');
        second = worker('lw-2');
      }
      // the retry streams: let the old attempt's worker go on now
      if (e.type === 'chunk' && e.data.attempt === 2 && e.data.seq === 3 && !resumed) {
        resumed = true;
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
    // the resumed worker did stream on, and the daemon dropped it as stale
    await waitFor(
      async () => {
        const text = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
        const stale = /corral_stream_chunks_total\{outcome="stale"\} (\d+)/.exec(text);
        return stale !== null && Number(stale[1]) > 0;
      },
      { timeoutMs: 15_000, what: 'stale chunks counted' },
    );
  }, 90_000);
});
