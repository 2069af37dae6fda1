/** Daemon lifecycle guards: prepare once; a second stop waits for the first; every step of a stop is bounded. */
import pino from 'pino';
import { describe, expect, it } from 'vitest';
import { Daemon } from '../../src/daemon/daemon.ts';
import { Capture } from '../helpers/capture.ts';
import { startTestDaemon } from '../helpers/daemon.ts';

describe('Daemon lifecycle', () => {
  it('refuses a second prepare, and a second stop waits for the stop under way', async () => {
    const t = await startTestDaemon();
    await expect(t.daemon.prepare()).rejects.toThrow(/prepare\(\) called on a daemon that is running/);
    const first = t.daemon.stop();
    const second = t.daemon.stop();
    expect(t.daemon.state).toBe('stopping');
    await second;
    // The second call returned only once the daemon had really stopped.
    expect(t.daemon.state).toBe('stopped');
    expect(await first).toBe(await second);
    await t.stop();
  });

  it('a step that would wait forever (a pool client never released) is given up after its bound, and the stop ends', async () => {
    const t = await startTestDaemon({}, { start: false });
    const log = new Capture();
    const daemon = new Daemon({ config: t.config, databaseUrl: t.db.url, logger: pino({ level: 'warn' }, log), skipMigrations: true });
    await daemon.start();
    // a connection checked out and never given back: pool.end() waits for it without end
    const held = await daemon.database.pool.connect();
    const startedAt = Date.now();
    await daemon.stop({ drainMs: 0 });
    const tookMs = Date.now() - startedAt;
    expect(daemon.state).toBe('stopped');
    expect(tookMs).toBeLessThan(10_000);
    expect(log.text).toMatch(/"step":"the database pool".*"a stop step did not end in time; going on without it"/);
    held.release();
    await daemon.database.pool.end().catch(() => undefined);
    await t.db.drop();
  });
});
