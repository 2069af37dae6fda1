/**
 * The public `createWorker` (src/worker/create.ts) against a broker with CURVE and the daemon's
 * key files in a temporary CORRAL_HOME (FabricSecurity, as the daemon runs it), on real sockets:
 * a key file from `corral keys add-worker` is all it needs, `start()` resolves on the welcome, and
 * every refusal (unknown key, revoked key, wrong server key, wrong id, CURVE on one side only)
 * makes `start()` reject within 5 s with a typed error, logged.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { systemClock } from '../../src/base/clock.ts';
import { CorralError } from '../../src/base/errors.ts';
import { Broker, type BrokerEvent } from '../../src/fabric/broker.ts';
import {
  addWorkerKey,
  formatWorkerKeyFile,
  keyPaths,
  revokeWorkerKey,
  writePrivateFile,
  type WorkerKeyFile,
} from '../../src/fabric/keys.ts';
import { FabricSecurity } from '../../src/fabric/security.ts';
import { silentLogger } from '../../src/base/logger.ts';
import { freePort } from '../../src/db/postgres/net.ts';
import { createWorker, type CreateWorkerOptions, type TurnHandler, type Worker } from '../../src/worker/create.ts';
import { SERVER_KEY_FAILURES } from '../../src/worker/refusals.ts';
import { CORRAL, run } from '../cli/helpers.ts';
import { makeTurnStart } from '../fabric/helpers.ts';
import { capturingLogger } from '../security/curve-broker.ts';
import { waitFor } from '../helpers/wait.ts';

const cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});
const folders: string[] = [];
afterAll(() => {
  for (const f of folders.splice(0)) rmSync(f, { recursive: true, force: true });
});

function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'corral-create-worker-'));
  folders.push(dir);
  return dir;
}

interface TestDaemonFabric {
  home: string;
  broker: Broker;
  security: FabricSecurity | undefined;
  events: BrokerEvent[];
  /** Issues a key for `workerId` as `corral keys add-worker --out` does; returns the file. */
  issue(workerId: string): { file: string; key: WorkerKeyFile };
}

/** A broker with the daemon's fabric security over a fresh CORRAL_HOME (as src/daemon/daemon.ts wires it); `insecure`: none. */
async function startFabric(opts: { insecure?: boolean; endpoint?: string } = {}): Promise<TestDaemonFabric> {
  const home = tempDir();
  const security = opts.insecure ? undefined : new FabricSecurity({ homeDir: home, pollMs: 50, clock: systemClock, logger: silentLogger });
  const events: BrokerEvent[] = [];
  const broker = new Broker({
    endpoint: opts.endpoint ?? 'tcp://127.0.0.1:0',
    logger: silentLogger,
    heartbeatIntervalMs: 200,
    onEvent: (e) => events.push(e),
    ...(security ? security.brokerOptions() : {}),
  });
  await broker.start();
  cleanups.push(() => broker.stop());
  security?.start((workerId, reason) => void broker.revoke(workerId, reason));
  cleanups.push(() => security?.stop());
  const issue = (workerId: string) => {
    if (!security) throw new Error('an insecure fabric issues no keys');
    const key = addWorkerKey(keyPaths(home), security.keys.publicKey, workerId);
    const file = join(tempDir(), `${workerId}.key`);
    writePrivateFile(file, formatWorkerKeyFile(key));
    return { file, key };
  };
  return { home, broker, security, events, issue };
}

const echo: TurnHandler = async (ctx) => ({ messages: [{ role: 'assistant', content: { echo: ctx.event.data } }] });

function worker(options: Partial<CreateWorkerOptions> & Pick<CreateWorkerOptions, 'endpoint'>): Worker {
  const w = createWorker({ handler: echo, heartbeatIntervalMs: 200, ...options });
  cleanups.push(() => w.stop());
  return w;
}

/** `start()` rejects within 5 s with `code`, and the worker logged an error line carrying it. */
async function expectRefused(w: Worker, lines: Array<Record<string, unknown>>, code: string): Promise<CorralError> {
  const t0 = Date.now();
  const error = await w.start().then(
    () => expect.unreachable('start() resolved'),
    (e: unknown) => e,
  );
  expect(Date.now() - t0).toBeLessThan(5_000);
  expect(error).toBeInstanceOf(CorralError);
  expect((error as CorralError).code).toBe(code);
  expect((error as CorralError).retryable).toBe(code === 'timeout');
  expect(lines.some((l) => l.level === 50 && l.code === code && String(l.msg).includes('worker did not start'))).toBe(true);
  expect(w.isRegistered()).toBe(false);
  return error as CorralError;
}

describe('createWorker: start() resolves on the welcome', () => {
  it('with the key file `corral keys add-worker` wrote, and nothing else; the id is the key file’s', async () => {
    const fabric = await startFabric();
    const file = join(tempDir(), 'gpu-box-1.key');
    const issued = await run([CORRAL, 'keys', 'add-worker', 'gpu-box-1', '--out', file], { CORRAL_HOME: fabric.home });
    expect(issued.code, issued.stderr).toBe(0);
    await waitFor(() => fabric.security!.describeKey((JSON.parse(readFileSync(file, 'utf8')) as WorkerKeyFile).public_key), {
      what: 'the daemon to read the new allow-list',
    });

    const w = worker({ endpoint: fabric.broker.endpoint, keyFile: file, capacity: 2 });
    expect(w.workerId).toBe('gpu-box-1');
    expect(fabric.broker.isRegistered('gpu-box-1')).toBe(false);
    await w.start();
    // resolved on the welcome: registered on both sides already, no waiting
    expect(w.isRegistered()).toBe(true);
    expect(fabric.broker.isRegistered('gpu-box-1')).toBe(true);
    expect(w.capacity()).toBe(2);

    // and it runs turns through its handler
    const start = makeTurnStart({ text: 'hi' });
    expect(await fabric.broker.send('gpu-box-1', start)).toEqual({ ok: true });
    const result = await waitFor(() => fabric.events.find((e) => e.kind === 'turn_result'), { what: 'the result' });
    expect(result).toMatchObject({ workerId: 'gpu-box-1', messages: [{ role: 'assistant', content: { echo: { text: 'hi' } } }] });
  });

  it('with the key file’s content, or a workerId repeating it; another id throws invalid_argument at once', async () => {
    const fabric = await startFabric();
    const { file, key } = fabric.issue('w-content');
    const text = readFileSync(file, 'utf8');
    expect(() => createWorker({ endpoint: fabric.broker.endpoint, handler: echo, key: text, workerId: 'w-other' })).toThrow(
      expect.objectContaining({
        code: 'invalid_argument',
        message: expect.stringContaining("differs from the key file's worker id w-content"),
      }),
    );
    const w = worker({ endpoint: fabric.broker.endpoint, key: text, workerId: 'w-content' });
    await w.start();
    expect(fabric.broker.isRegistered('w-content')).toBe(true);
    await w.stop();
    const again = worker({ endpoint: fabric.broker.endpoint, key });
    await again.start();
    expect(again.isRegistered()).toBe(true);
  });

  it('on the daemon’s host, with no key: the one issued under its CORRAL_HOME (homeDir, or CORRAL_HOME through env)', async () => {
    const fabric = await startFabric();
    const a = worker({ endpoint: fabric.broker.endpoint, homeDir: fabric.home, workerId: 'local-a' });
    await a.start();
    const b = worker({ endpoint: fabric.broker.endpoint, env: { CORRAL_HOME: fabric.home }, workerId: 'local-b' });
    await b.start();
    expect([fabric.broker.isRegistered('local-a'), fabric.broker.isRegistered('local-b')]).toEqual([true, true]);
  });

  it('waits for a daemon that is not up yet, and times out with `timeout` when none comes', async () => {
    const port = await freePort();
    const endpoint = `tcp://127.0.0.1:${port}`;
    const lines: Array<Record<string, unknown> & { msg: string }> = [];
    const lonely = worker({ endpoint, insecure: true, workerId: 'w-lonely', startTimeoutMs: 300, logger: capturingLogger(lines) });
    const error = await expectRefused(lonely, lines, 'timeout');
    expect(error.message).toContain(`no welcome from the daemon at ${endpoint} within 300 ms`);

    const early = worker({ endpoint, insecure: true, workerId: 'w-early' });
    const started = early.start();
    let resolved = false;
    void started.then(() => (resolved = true));
    await new Promise((r) => setTimeout(r, 300));
    expect(resolved).toBe(false);
    const fabric = await startFabric({ insecure: true, endpoint });
    await started;
    expect(fabric.broker.isRegistered('w-early')).toBe(true);
  });

  it('stop() during start() makes it reject `shutdown`', async () => {
    const w = worker({ endpoint: `tcp://127.0.0.1:${await freePort()}`, insecure: true, workerId: 'w-stopped' });
    const started = w.start();
    await w.stop();
    await expect(started).rejects.toMatchObject({ code: 'shutdown' });
  });
});

describe('createWorker: start() rejects within 5 s, with a typed error and a log line, when the daemon refuses', () => {
  it('an unknown key: key_refused', async () => {
    const fabric = await startFabric();
    const elsewhere = await startFabric();
    const { file } = elsewhere.issue('w-unknown');
    const lines: Array<Record<string, unknown> & { msg: string }> = [];
    // the right daemon public key, but a key this daemon never listed
    const w = worker({
      endpoint: fabric.broker.endpoint,
      keyFile: file,
      serverKey: fabric.security!.keys.publicKey,
      logger: capturingLogger(lines),
    });
    const error = await expectRefused(w, lines, 'key_refused');
    expect(error.message).toMatch(/refused the key of worker w-unknown: it is not on the daemon's allow-list \(unknown, or revoked\)/);
    expect(lines.some((l) => l.msg.includes("the daemon refused this worker's key"))).toBe(true);
  });

  it('a revoked key: key_refused', async () => {
    const fabric = await startFabric();
    const { file, key } = fabric.issue('w-revoked');
    const first = worker({ endpoint: fabric.broker.endpoint, keyFile: file });
    await first.start();
    await first.stop();
    expect(revokeWorkerKey(keyPaths(fabric.home), 'w-revoked')).toBe(true);
    await waitFor(() => !fabric.security!.isKeyAllowed(key.public_key), { what: 'the daemon to drop the key' });
    const lines: Array<Record<string, unknown> & { msg: string }> = [];
    await expectRefused(worker({ endpoint: fabric.broker.endpoint, keyFile: file, logger: capturingLogger(lines) }), lines, 'key_refused');
  });

  it('a wrong server key (another daemon’s): server_key_mismatch', async () => {
    const fabric = await startFabric();
    const elsewhere = await startFabric();
    const { file } = elsewhere.issue('w-astray');
    const lines: Array<Record<string, unknown> & { msg: string }> = [];
    const error = await expectRefused(
      worker({ endpoint: fabric.broker.endpoint, keyFile: file, logger: capturingLogger(lines) }),
      lines,
      'server_key_mismatch',
    );
    expect(error.message).toMatch(/failed \d+ times in a row without detail: the daemon's public key \(server_key\)/);
    expect(Number(/failed (\d+) times/.exec(error.message)?.[1])).toBeGreaterThanOrEqual(SERVER_KEY_FAILURES);
  });

  it('a wrong id (a key file whose worker id was changed): registration_refused, for an unlisted id and for another worker’s', async () => {
    const fabric = await startFabric();
    const { key } = fabric.issue('w-real');
    fabric.issue('w-neighbour');
    for (const [id, reason] of [
      ['w-made-up', 'worker id not on the allow-list'],
      ['w-neighbour', 'bad credential'],
    ] as const) {
      const lines: Array<Record<string, unknown> & { msg: string }> = [];
      const edited = join(tempDir(), 'edited.key');
      writeFileSync(edited, formatWorkerKeyFile({ ...key, worker_id: id }), { mode: 0o600 });
      const error = await expectRefused(
        worker({ endpoint: fabric.broker.endpoint, keyFile: edited, logger: capturingLogger(lines) }),
        lines,
        'registration_refused',
      );
      expect(error.message).toBe(`the daemon at ${fabric.broker.endpoint} refused to register worker ${id}: ${reason}`);
      expect(error.details).toMatchObject({ protocolCode: 'unauthorized', workerId: id });
    }
    expect(fabric.broker.isRegistered('w-made-up') || fabric.broker.isRegistered('w-neighbour')).toBe(false);
  });

  it('CURVE on one side only: curve_mismatch, either way', async () => {
    const curve = await startFabric();
    const open = await startFabric({ insecure: true });
    const { file } = curve.issue('w-keyed');
    for (const w of [
      { endpoint: curve.broker.endpoint, insecure: true, workerId: 'w-open' },
      { endpoint: open.broker.endpoint, keyFile: file },
    ]) {
      const lines: Array<Record<string, unknown> & { msg: string }> = [];
      await expectRefused(worker({ ...w, logger: capturingLogger(lines) }), lines, 'curve_mismatch');
    }
  });
});
