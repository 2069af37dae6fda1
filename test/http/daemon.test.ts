/**
 * The HTTP API as `createDaemon` runs it (`httpPort`): served once the daemon runs, an event sent
 * over HTTP runs on a worker and its state moves to committed, the API stops with the daemon; a
 * port in use stops the start with that message; unset or 0, no API.
 */
import { createServer, type Server } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { CorralError } from '../../src/base/errors.ts';
import { createDaemon, type CorralDaemon, type DaemonOptions } from '../../src/host/daemon.ts';
import { freePort } from '../../src/db/postgres/net.ts';
import { createToken } from '../../src/ops/api-tokens.ts';
import { openDatabase } from '../../src/db/client.ts';
import { runExampleWorker } from '../../src/worker/example.ts';
import { testLogger } from '../helpers/daemon.ts';
import { useTestDatabases, type TestDatabase } from '../helpers/db.ts';

// registered before the afterEach below: each test's database is dropped after its daemons stopped
const databases = useTestDatabases();
const cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function daemon(options: DaemonOptions): CorralDaemon {
  const d = createDaemon({
    logger: testLogger,
    endpoint: 'tcp://127.0.0.1:0',
    insecure: true,
    pollIntervalMs: 200,
    drainMs: 0,
    ...options,
  });
  cleanups.push(() => d.stop());
  return d;
}

async function tokenFor(db: TestDatabase): Promise<string> {
  const database = openDatabase(db.url, { max: 1 });
  try {
    return (await createToken(database.db, 'daemon-test', ['read', 'send'])).token;
  } finally {
    await database.close();
  }
}

describe('the daemon’s HTTP API', () => {
  it('is served while the daemon runs: an event sent over HTTP commits on a worker, then the API stops with it', async () => {
    const db = await databases.fresh();
    const httpPort = await freePort();
    const d = daemon({ databaseUrl: db.url, httpPort });
    await d.start();
    expect(d.httpUrl).toBe(`http://127.0.0.1:${httpPort}`);
    const worker = await runExampleWorker({ endpoint: d.endpoint!, workerId: 'http-w1', capacity: 2, logger: testLogger });
    cleanups.push(() => worker.stop());
    const token = await tokenFor(db);
    const auth = { authorization: `Bearer ${token}` };

    const sent = await fetch(`${d.httpUrl}/v1/actors/web/d1/events`, {
      method: 'POST',
      headers: { ...auth, 'content-type': 'application/json' },
      body: JSON.stringify({ text: 'over http' }),
    });
    expect(sent.status).toBe(202);
    const { event_id } = (await sent.json()) as { event_id: string };
    const state = async () =>
      ((await (await fetch(`${d.httpUrl}/v1/events/${event_id}`, { headers: auth })).json()) as { state: string }).state;
    await expect.poll(state, { timeout: 20_000 }).toBe('committed');
    const transcript = (await (await fetch(`${d.httpUrl}/v1/actors/web/d1/transcript`, { headers: auth })).json()) as {
      turns: { messages: { content: unknown }[] }[];
    };
    expect(transcript.turns.flatMap((t) => t.messages.map((m) => m.content))).toEqual([{ text: 'over http' }, { text: 'echo: over http' }]);

    await worker.stop();
    await d.stop();
    await expect(fetch(`http://127.0.0.1:${httpPort}/v1/events/${event_id}`, { headers: auth })).rejects.toThrow();
  });

  it('a port in use stops the start with that message; port 0 or none: no API', async () => {
    const db = await databases.fresh();
    const server: Server = createServer();
    const httpPort = await new Promise<number>((r) => server.listen(0, '127.0.0.1', () => r((server.address() as { port: number }).port)));
    cleanups.push(() => new Promise((r) => server.close(r)));
    const taken = daemon({ databaseUrl: db.url, httpPort });
    const error = await taken.start().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CorralError);
    expect(error).toMatchObject({
      code: 'invalid_config',
      message: expect.stringMatching(`HTTP API cannot listen on 127\\.0\\.0\\.1:${httpPort}: .*EADDRINUSE`),
    });
    expect(taken.state).toBe('stopped');

    for (const off of [{ httpPort: 0 }, {}]) {
      const d = daemon({ databaseUrl: db.url, ...off });
      await d.start();
      expect(d.httpUrl).toBeUndefined();
      await d.stop();
    }
  });
});
