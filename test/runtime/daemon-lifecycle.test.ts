/** Daemon lifecycle guards: prepare once; a second stop waits for the first. */
import { describe, expect, it } from 'vitest';
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
});
