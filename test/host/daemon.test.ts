/**
 * `createDaemon` (src/host/daemon.ts) in this process, on real PostgreSQL and real sockets:
 * `start()` resolves once the daemon runs and its workers can register, `stop()` releases it;
 * a busy endpoint or metrics port makes `start()` reject with that message, holding nothing; with
 * no `databaseUrl` the embedded PostgreSQL under `homeDir` is started, and stopped with the
 * daemon that started it.
 */
import { createServer, type Server } from 'node:net';
import pg from 'pg';
import { Router } from 'zeromq';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { readTranscript } from '../../src/db/turns/transcript.ts';
import { CorralError } from '../../src/base/errors.ts';
import { createDaemon, type CorralDaemon, type DaemonOptions } from '../../src/host/daemon.ts';
import { daemonInternals } from '../../src/host/internals.ts';
import { silentLogger } from '../../src/base/logger.ts';
import { freePort } from '../../src/db/postgres/net.ts';
import { createWorker, type Worker } from '../../src/worker/create.ts';
import { freshHomes } from '../cli/helpers.ts';
import { useTestDatabases, type TestDatabase } from '../helpers/db.ts';
import { testLogger } from '../helpers/daemon.ts';
import { postmastersOf } from '../helpers/processes.ts';
import { waitFor } from '../helpers/wait.ts';
import { sendEvent } from '../helpers/send.ts';

const homes = freshHomes('corral-host-');
// registered before the afterEach below: each test's database is dropped after its daemons stopped
const databases = useTestDatabases();
const cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});
afterAll(() => homes.removeAll());

function daemon(options: DaemonOptions): CorralDaemon {
  const d = createDaemon({ logger: testLogger, endpoint: 'tcp://127.0.0.1:0', pollIntervalMs: 200, drainMs: 2_000, ...options });
  cleanups.push(() => d.stop());
  return d;
}

/** Connections to `db` other than this query's own. */
async function connectionsTo(db: TestDatabase): Promise<number> {
  const c = new pg.Client({ connectionString: db.url });
  await c.connect();
  try {
    const r = await c.query<{ n: number }>(
      'select count(*)::int as n from pg_stat_activity where datname = $1 and pid <> pg_backend_pid()',
      [db.name],
    );
    return r.rows[0]!.n;
  } finally {
    await c.end();
  }
}

describe('createDaemon', () => {
  it('start() resolves once it runs: a worker with a key issued under its home registers and its turn commits; stop() releases it', async () => {
    const db = await databases.fresh();
    const home = await homes.make();
    const d = daemon({ databaseUrl: db.url, homeDir: home });
    expect([d.state, d.endpoint, d.databaseUrl]).toEqual(['idle', undefined, undefined]);
    await d.start();
    expect(d.state).toBe('running');
    expect(d.endpoint).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
    expect(d.endpoint).not.toBe('tcp://127.0.0.1:0');
    expect(d.databaseUrl).toBe(db.url);
    expect(d.serverPublicKey).toMatch(/^.{40}$/);
    expect(d.metricsUrl).toBeUndefined();

    const w: Worker = createWorker({
      endpoint: d.endpoint!,
      homeDir: home,
      workerId: 'host-w1',
      handler: async (ctx) => ({ messages: [{ role: 'assistant', content: { got: ctx.event.data } }] }),
    });
    cleanups.push(() => w.stop());
    await w.start();
    const inner = daemonInternals(d)!;
    const key = actorKey('host', 's1');
    await sendEvent(inner.database.db, key, { text: 'hi' });
    const reply = await waitFor(
      async () => (await readTranscript(inner.database.db, key)).flatMap((t) => t.messages).find((m) => m.role === 'assistant'),
      { what: 'the reply committed' },
    );
    expect(reply.content).toEqual({ got: { text: 'hi' } });
    await w.stop();

    await d.stop();
    expect(d.state).toBe('stopped');
    await expect(d.done).resolves.toBeUndefined();
    await waitFor(async () => (await connectionsTo(db)) === 0, { what: 'every connection closed' });
    // stopping again is harmless; starting again is not possible
    await d.stop();
    await expect(d.start()).resolves.toBeUndefined(); // the same start, settled
  });

  it('a busy endpoint or metrics port: start() rejects with that message within 5 s and holds nothing', async () => {
    const db = await databases.fresh();
    const busy = new Router();
    const port = await freePort();
    await busy.bind(`tcp://127.0.0.1:${port}`);
    cleanups.push(() => busy.close());
    const taken = daemon({ databaseUrl: db.url, homeDir: await homes.make(), endpoint: `tcp://127.0.0.1:${port}` });
    let t0 = Date.now();
    await expect(taken.start()).rejects.toThrow(/broker cannot bind .*[Aa]ddress already in use/);
    expect(Date.now() - t0).toBeLessThan(5_000);
    expect(taken.state).toBe('stopped');
    await expect(taken.done).rejects.toThrow(/already in use/);
    await waitFor(async () => (await connectionsTo(db)) === 0, { what: "the failed daemon's connections closed" });

    const server: Server = createServer();
    const metricsPort = await new Promise<number>((r) =>
      server.listen(0, '127.0.0.1', () => r((server.address() as { port: number }).port)),
    );
    cleanups.push(() => new Promise((r) => server.close(r)));
    const noMetrics = daemon({ databaseUrl: db.url, homeDir: await homes.make(), metricsPort });
    t0 = Date.now();
    const error = await noMetrics.start().catch((e: unknown) => e);
    expect(Date.now() - t0).toBeLessThan(5_000);
    expect(error).toBeInstanceOf(CorralError);
    expect(error).toMatchObject({
      code: 'invalid_config',
      message: expect.stringMatching(`metrics server cannot listen on 127\\.0\\.0\\.1:${metricsPort}: .*EADDRINUSE`),
    });
    await waitFor(async () => (await connectionsTo(db)) === 0, { what: "the second failed daemon's connections closed" });

    // the same settings with the port free: metrics served
    await new Promise((r) => server.close(r));
    const served = daemon({ databaseUrl: db.url, homeDir: await homes.make(), metricsPort });
    await served.start();
    expect(served.metricsUrl).toBe(`http://127.0.0.1:${metricsPort}`);
    expect((await fetch(`${served.metricsUrl}/readyz`)).status).toBe(200);
    await served.stop();
    await expect(fetch(`${served.metricsUrl}/healthz`)).rejects.toThrow();
  });

  it('with no databaseUrl: starts the embedded PostgreSQL under homeDir, and stops it with itself (after a failed start too)', async () => {
    const home = await homes.make();
    const busy = new Router();
    const port = await freePort();
    await busy.bind(`tcp://127.0.0.1:${port}`);
    cleanups.push(() => busy.close());
    const failing = daemon({ homeDir: home, endpoint: `tcp://127.0.0.1:${port}` });
    await expect(failing.start()).rejects.toThrow(/already in use/);
    expect(postmastersOf(home)).toBe(0);

    const d = daemon({ homeDir: home });
    const t0 = Date.now();
    await d.start();
    const startMs = Date.now() - t0;
    expect(d.databaseUrl).toMatch(/^postgres:\/\/postgres:/);
    expect(postmastersOf(home)).toBeGreaterThan(0);
    await d.stop();
    expect(postmastersOf(home)).toBe(0);
    console.info(`createDaemon on the embedded PostgreSQL (cluster made already): start() took ${startMs} ms`);
  }, 120_000);

  it('stop() during start() makes it reject `shutdown` and leaves nothing; before start(), start() then rejects', async () => {
    const db = await databases.fresh();
    const d = daemon({ databaseUrl: db.url, homeDir: await homes.make() });
    const started = d.start();
    await d.stop();
    await expect(started).rejects.toMatchObject({ code: 'shutdown' });
    expect(d.state).toBe('stopped');
    await expect(d.done).resolves.toBeUndefined();
    await waitFor(async () => (await connectionsTo(db)) === 0, { what: 'every connection closed' });

    const never = daemon({ databaseUrl: db.url });
    await never.stop();
    await expect(never.start()).rejects.toMatchObject({ code: 'shutdown' });
  });

  it('refuses an option it does not know, and bad settings, at once', () => {
    expect(() => createDaemon({ logger: silentLogger, databaseURL: 'postgres://x/y' } as DaemonOptions)).toThrow(
      expect.objectContaining({ code: 'invalid_argument', message: 'createDaemon: unknown option "databaseURL"' }),
    );
    expect(() => createDaemon({ logger: silentLogger, leaseMs: 5 })).toThrow(expect.objectContaining({ code: 'invalid_config' }));
    expect(() => createDaemon({ logger: silentLogger, localWorkers: { count: 65 } })).toThrow(
      expect.objectContaining({ code: 'invalid_argument' }),
    );
  });

  it('runs local example worker processes, with keys issued under its home, and stops them with itself', async () => {
    const db = await databases.fresh();
    const d = daemon({ databaseUrl: db.url, homeDir: await homes.make(), localWorkers: { count: 1, capacity: 2 } });
    await d.start();
    const inner = daemonInternals(d)!;
    await waitFor(() => inner.broker.stats().workers > 0, {
      timeoutMs: 30_000,
      what: 'the local worker registered',
    });
    const key = actorKey('local', 's');
    await sendEvent(inner.database.db, key, { text: 'x' });
    await waitFor(async () => (await readTranscript(inner.database.db, key)).some((t) => t.messages.some((m) => m.role === 'assistant')), {
      timeoutMs: 30_000,
      what: 'the example reply',
    });
    await d.stop();
    // the leak check after this file fails it if the worker process outlived the daemon
  }, 60_000);
});
