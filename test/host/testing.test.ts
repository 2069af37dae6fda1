/**
 * `createTestEnvironment` (src/host/testing.ts) as an application's test uses it: one call starts
 * an embedded PostgreSQL, a daemon with CURVE and registered workers running the test's handler;
 * the handler's reply commits; `stop()` leaves nothing (no process, socket or folder: the leak
 * check of test/setup.ts runs after this file). Prints how long the start took.
 */
import { existsSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { Router } from 'zeromq';
import { afterEach, describe, expect, it } from 'vitest';
import { actorKey, type ActorKey } from '../../src/base/actor-key.ts';
import { readTranscript } from '../../src/db/turns/transcript.ts';
import { daemonInternals } from '../../src/host/internals.ts';
import { createTestEnvironment, type TestEnvironment } from '../../src/host/testing.ts';
import { freePort } from '../../src/db/postgres/net.ts';
import { createWorker, type TurnHandler } from '../../src/worker/create.ts';
import { useTestDatabases } from '../helpers/db.ts';
import { postmastersOf } from '../helpers/processes.ts';
import { waitFor } from '../helpers/wait.ts';
import { sendEvent } from '../helpers/send.ts';

// registered before the afterEach below: a test's database is dropped after its environments stopped
const databases = useTestDatabases();
const cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** Enqueues `data` for `key` through the daemon's own queue (a client does the same with `databaseUrl`). */
async function send(env: TestEnvironment, key: ActorKey, data: unknown): Promise<void> {
  const inner = daemonInternals(env.daemon)!;
  await sendEvent(inner.database.db, key, data);
}

async function reply(env: TestEnvironment, key: ActorKey): Promise<unknown> {
  const inner = daemonInternals(env.daemon)!;
  const message = await waitFor(
    async () => (await readTranscript(inner.database.db, key)).flatMap((t) => t.messages).find((m) => m.role === 'assistant'),
    { what: `the reply of ${key.agentUid}/${key.sessionId}` },
  );
  return message.content;
}

const envDirs = () => new Set(readdirSync(tmpdir()).filter((n) => n.startsWith('corral-test-env-')));

describe('createTestEnvironment', () => {
  it("starts PostgreSQL, a CURVE daemon and a worker in one call; the handler's reply commits; stop() leaves nothing", async () => {
    const seen: unknown[] = [];
    const handler: TurnHandler = async (ctx) => {
      seen.push(ctx.event.data);
      return { messages: [{ role: 'assistant', content: { text: `re: ${JSON.stringify(ctx.event.data)}` } }] };
    };
    const t0 = Date.now();
    const env = await createTestEnvironment({ handler });
    const startMs = Date.now() - t0;
    cleanups.push(() => env.stop());
    expect(env.workers).toHaveLength(1);
    expect(env.workers[0]!.isRegistered()).toBe(true);
    expect(env.daemon.state).toBe('running');
    expect(env.daemon.serverPublicKey).toBeDefined(); // CURVE on
    expect(env.endpoint).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
    expect(postmastersOf(env.homeDir)).toBeGreaterThan(0);

    // the environment's client sends and waits as an application does
    const { eventId } = await env.corral.send('app/chat-1', { text: 'hello' });
    const turn = await env.corral.waitForTurn(eventId, { timeoutMs: 20_000 });
    expect(turn.messages.filter((m) => m.role === 'assistant').map((m) => m.content)).toEqual([{ text: 're: {"text":"hello"}' }]);
    expect(seen).toEqual([{ text: 'hello' }]);

    const t1 = Date.now();
    await env.stop();
    const stopMs = Date.now() - t1;
    expect(env.daemon.state).toBe('stopped');
    expect(env.workers[0]!.isRegistered()).toBe(false);
    expect(postmastersOf(env.homeDir)).toBe(0);
    expect(existsSync(env.homeDir)).toBe(false);
    await expect(env.corral.send('app/chat-1', { text: 'late' })).rejects.toMatchObject({ code: 'closed' });
    await env.stop(); // idempotent
    console.info(`createTestEnvironment: started in ${startMs} ms (embedded PostgreSQL, daemon, 1 worker), stopped in ${stopMs} ms`);
  }, 60_000);

  it('on a given database, insecure, with two workers and one more started later (or run by the test with an issued key)', async () => {
    const db = await databases.fresh();
    const tag =
      (name: string): TurnHandler =>
      async () => ({ messages: [{ role: 'assistant', content: { by: name } }] });
    const t0 = Date.now();
    const env = await createTestEnvironment({ handler: tag('first'), workers: 2, capacity: 1, databaseUrl: db.url, insecure: true });
    const startMs = Date.now() - t0;
    cleanups.push(() => env.stop());
    expect(env.databaseUrl).toBe(db.url);
    expect(env.daemon.serverPublicKey).toBeUndefined();
    expect(env.workers.map((w) => [w.workerId, w.capacity()])).toEqual([
      ['test-worker-1', 1],
      ['test-worker-2', 1],
    ]);
    const third = await env.startWorker({ handler: tag('third'), workerId: 'w-third' });
    expect(third.isRegistered()).toBe(true);
    await env.stop();
    expect(existsSync(env.homeDir)).toBe(false);
    await expect(env.startWorker({ handler: tag('late') })).rejects.toMatchObject({ code: 'shutdown' });
    console.info(`createTestEnvironment on a test database, insecure, 2 workers: started in ${startMs} ms`);

    // with CURVE, a worker the test runs itself takes a key the environment issues
    const secure = await createTestEnvironment({ databaseUrl: db.url });
    cleanups.push(() => secure.stop());
    expect(secure.workers).toEqual([]);
    const own = createWorker({ endpoint: secure.endpoint, keyFile: secure.issueWorkerKey('w-own'), handler: tag('own') });
    cleanups.push(() => own.stop());
    await own.start();
    const key = actorKey('own', 's');
    await send(secure, key, { x: 1 });
    expect(await reply(secure, key)).toEqual({ by: 'own' });
  }, 60_000);

  it('a start that fails (its endpoint in use) stops what it started and removes its folder', async () => {
    const busy = new Router();
    const port = await freePort();
    await busy.bind(`tcp://127.0.0.1:${port}`);
    cleanups.push(() => busy.close());
    const before = envDirs();
    await expect(
      createTestEnvironment({ handler: async () => ({ messages: [] }), config: { endpoint: `tcp://127.0.0.1:${port}` } }),
    ).rejects.toThrow(/already in use/);
    const left = [...envDirs()].filter((d) => !before.has(d));
    expect(left).toEqual([]);
    expect(postmastersOf('corral-test-env-')).toBe(0);
  }, 60_000);
});
