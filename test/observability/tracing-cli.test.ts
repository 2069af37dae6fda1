/**
 * `corral daemon --workers 1` as real processes with OpenTelemetry's variables: the daemon and
 * the local worker it starts each export their spans (services `corral-daemon`, `corral-worker`)
 * to a real OTLP/HTTP receiver, in one trace under the sender's context; a malformed variable
 * stops the daemon at start, exit 2, with a message naming it.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connect } from '../../src/client/index.ts';
import { CORRAL, ROOT } from '../cli/helpers.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { OtlpReceiver, SPAN_KIND } from '../helpers/otlp-receiver.ts';
import { freePort } from '../helpers/processes.ts';
import { waitFor } from '../helpers/wait.ts';

const TP = '00-7a3f92f3577b34da6a3ce929d0e0e473-11f067aa0ba902b7-01';

describe('corral daemon and its local workers export their spans', () => {
  const tdb = useTestDatabase();
  const otlp = new OtlpReceiver();
  const home = mkdtempSync(join(tmpdir(), 'corral-tracing-cli-'));
  let child: ChildProcess | undefined;
  let stderr = '';

  beforeAll(() => otlp.start());
  afterAll(async () => {
    if (child && child.exitCode === null) child.kill('SIGKILL');
    await otlp.stop();
    rmSync(home, { recursive: true, force: true });
  });

  const env = () => ({
    ...process.env,
    DATABASE_URL: tdb.url,
    CORRAL_HOME: home,
    CORRAL_LOG_LEVEL: 'warn',
    OTEL_EXPORTER_OTLP_ENDPOINT: otlp.endpoint,
    OTEL_BSP_SCHEDULE_DELAY: '100',
  });

  /** `corral daemon --workers 1` with `extraEnv`, once it is ready, and its exit code to come. */
  async function startDaemon(extraEnv: Record<string, string>): Promise<{ daemon: ChildProcess; exited: Promise<number | null> }> {
    const port = await freePort();
    stderr = '';
    child = spawn(
      process.execPath,
      [CORRAL, 'daemon', '--endpoint', 'tcp://127.0.0.1:0', '--workers', '1', '--metrics-port', String(port)],
      { cwd: ROOT, env: { ...env(), ...extraEnv }, stdio: ['ignore', 'ignore', 'pipe'] },
    );
    child.stderr!.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const exited = new Promise<number | null>((resolve) => child!.on('exit', (code) => resolve(code)));
    await waitFor(async () => (await fetch(`http://127.0.0.1:${port}/readyz`)).status === 200, {
      what: () => `readyz (stderr: ${stderr})`,
      timeoutMs: 45_000,
      intervalMs: 200,
    });
    return { daemon: child, exited };
  }

  it('a malformed OTEL_* setting: exit 2, naming it', () => {
    const res = spawnSync(process.execPath, [CORRAL, 'daemon', '--endpoint', 'tcp://127.0.0.1:0'], {
      cwd: ROOT,
      env: { ...env(), OTEL_TRACES_SAMPLER: 'sometimes' },
      encoding: 'utf8',
      timeout: 30_000,
    });
    expect(res.status).toBe(2);
    expect(res.stderr).toContain('OTEL_TRACES_SAMPLER=sometimes');
  });

  it('one trace: the daemon’s attempt and its local worker’s handler span; SIGTERM still exits 0', async () => {
    const { daemon, exited } = await startDaemon({});
    const corral = await connect({ databaseUrl: tdb.url, env: {} });
    try {
      const sent = await corral.send('cli/s1', { text: 'hi' }, { traceparent: TP });
      const traceId = TP.slice(3, 35);
      const spans = await otlp.waitFor(
        (all) => {
          const mine = all.filter((s) => s.traceId === traceId);
          return mine.some((s) => s.name === 'corral.handler') && mine.some((s) => s.name === 'invoke_agent cli') && mine;
        },
        `the trace (stderr: ${stderr})`,
        30_000,
      );
      const invoke = spans.find((s) => s.name === 'invoke_agent cli')!;
      const handler = spans.find((s) => s.name === 'corral.handler')!;
      expect([invoke.service, invoke.kind, invoke.parentSpanId, invoke.attributes['corral.event.id']]).toEqual([
        'corral-daemon',
        SPAN_KIND.server,
        TP.slice(36, 52),
        sent.eventId,
      ]);
      expect([handler.service, handler.parentSpanId]).toEqual(['corral-worker', invoke.spanId]);
      expect(otlp.problems).toEqual([]);
    } finally {
      await corral.close();
    }
    daemon.kill('SIGTERM');
    expect(await exited).toBe(0);
  });

  it('a collector that is not there costs the turns nothing: they commit, and the daemon stops in time', async () => {
    const deadCollector = `http://127.0.0.1:${await freePort()}`;
    const { daemon, exited } = await startDaemon({ OTEL_EXPORTER_OTLP_ENDPOINT: deadCollector });
    const corral = await connect({ databaseUrl: tdb.url, env: {} });
    try {
      const sent = await Promise.all(Array.from({ length: 5 }, (_, i) => corral.send(`cli/dead-${i}`, { text: `hi ${i}` })));
      for (const s of sent) expect((await corral.waitForTurn(s.eventId, { timeoutMs: 20_000 })).eventId).toBe(s.eventId);
    } finally {
      await corral.close();
    }
    const stoppedAt = Date.now();
    daemon.kill('SIGTERM');
    expect(await exited).toBe(0);
    // the flushes are bounded (the daemon's 3 s, its worker's 2 s), not by the exporter's 30 s of
    // retries, nor by the daemon's 10 s deadline for its local workers
    console.log('STOP MS', Date.now() - stoppedAt);
    expect(Date.now() - stoppedAt).toBeLessThan(8_000);
  });
});
