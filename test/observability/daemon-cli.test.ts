/**
 * `corral daemon --metrics-port P` as a real process: the observability server comes up with the
 * daemon (/readyz 200, /metrics in Prometheus text) and goes away on SIGTERM, exit code 0.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { afterAll, describe, expect, it } from 'vitest';
import { useTestDatabase } from '../helpers/db.ts';
import { waitFor } from '../helpers/wait.ts';
import { CORRAL, ROOT } from '../cli/helpers.ts';
import { freePort } from '../helpers/processes.ts';

describe('corral daemon --metrics-port', () => {
  const tdb = useTestDatabase();
  let child: ChildProcess | undefined;
  let stderr = '';

  afterAll(async () => {
    if (child && child.exitCode === null) child.kill('SIGKILL');
  });

  it('serves /readyz and /metrics while running and exits 0 on SIGTERM', async () => {
    const port = await freePort();
    child = spawn(process.execPath, [CORRAL, 'daemon', '--endpoint', 'tcp://127.0.0.1:0', '--metrics-port', String(port)], {
      cwd: ROOT,
      env: { ...process.env, DATABASE_URL: tdb.url, CORRAL_LOG_LEVEL: 'warn' },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    child.stderr!.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const exited = new Promise<number | null>((resolve) => child!.on('exit', (code) => resolve(code)));
    const base = `http://127.0.0.1:${port}`;
    await waitFor(async () => (await fetch(`${base}/readyz`)).status === 200, {
      what: `readyz (stderr: ${stderr})`,
      timeoutMs: 45_000,
      intervalMs: 200,
    });
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
    const text = await (await fetch(`${base}/metrics`)).text();
    expect(text).toContain('corral_turns_committed_total 0');
    expect(text).toContain('corral_dead_letters 0');
    expect(text).toContain('corral_metrics_database_up 1');
    child.kill('SIGTERM');
    expect(await exited).toBe(0);
    await expect(fetch(`${base}/healthz`)).rejects.toThrow();
  });
});
