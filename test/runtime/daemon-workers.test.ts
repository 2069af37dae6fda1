/**
 * Crash test on real processes: `corral daemon --workers 3`, kill -9 the local worker running a
 * turn. The supervisor restarts that worker process only, and the event is run again and
 * committed exactly once.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { useTestDatabase } from '../helpers/db.ts';
import { childPids, freePort, killAll, spawnCorral, type Proc, stopGracefully, exitOf } from '../helpers/processes.ts';
import { waitFor } from '../helpers/wait.ts';

describe('corral daemon --workers 3', () => {
  const tdb = useTestDatabase();
  let daemon: Proc | undefined;

  afterAll(async () => {
    await stopGracefully(daemon);
    killAll();
  });

  it('restarts a killed worker process, leaves the others alone, and commits its event', async () => {
    const port = await freePort();
    const env = {
      DATABASE_URL: tdb.url,
      CORRAL_ENDPOINT: `tcp://127.0.0.1:${port}`,
      CORRAL_LEASE_MS: '3000',
      CORRAL_PROGRESS_INTERVAL_MS: '500',
      CORRAL_WORKER_HEARTBEAT_MS: '200',
      CORRAL_WORKER_STALE_MS: '1500',
      CORRAL_WATCHDOG_INTERVAL_MS: '200',
      CORRAL_RETRY_DELAY_S: '1',
      CORRAL_RETRY_DELAY_MAX_S: '2',
      CORRAL_LOG_LEVEL: 'debug',
    };
    daemon = spawnCorral(['daemon', '--workers', '3'], env, 'daemon');
    const daemonPid = daemon.child.pid!;
    const c = tdb.client;
    await waitFor(async () => (await c.query(`select count(*)::int as n from corral.workers where status = 'ready'`)).rows[0].n === 3, {
      timeoutMs: 30_000,
      what: `3 workers registered (log: ${daemon.logPath})`,
    });
    const pidsBefore = new Map<string, number>();
    for (const i of [1, 2, 3]) {
      const [pid] = childPids(daemonPid, `-${i} --endpoint`);
      expect(pid, `worker ${i} pid`).toBeDefined();
      pidsBefore.set(String(i), pid!);
    }

    const send = spawnCorral(['send', 'crash/one', '{"delayMs": 4000, "text": "slow"}'], env, 'send');
    expect(await exitOf(send)).toBe(0);
    const eventId = send.log().trim().split('\n').at(-1)!;
    const accepted = await waitFor(
      async () =>
        (await c.query(`select worker_id from corral.deliveries where event_id = $1 and state = 'accepted'`, [eventId])).rows[0]
          ?.worker_id as string | undefined,
      { timeoutMs: 20_000, what: 'the turn accepted by a worker' },
    );
    // on another endpoint than the default, the ids carry a tag of it: <host>-local-<tag>-<n>
    expect(accepted).toMatch(/-local-[0-9a-f]{6}-\d+$/);
    const index = accepted.match(/-(\d+)$/)![1]!;
    const victim = pidsBefore.get(index)!;
    process.kill(victim, 'SIGKILL');

    // the supervisor starts a new process for that worker; the two others keep their pids
    const replacement = await waitFor(
      () => {
        const [pid] = childPids(daemonPid, `-${index} --endpoint`);
        return pid !== undefined && pid !== victim ? pid : undefined;
      },
      { timeoutMs: 20_000, what: 'the killed worker restarted' },
    );
    expect(replacement).not.toBe(victim);
    for (const [i, pid] of pidsBefore) {
      if (i !== index) expect(childPids(daemonPid, `-${i} --endpoint`)).toEqual([pid]);
    }

    // the event it was running is run again and committed exactly once
    await waitFor(
      async () =>
        (await c.query(`select count(*)::int as n from corral.turns where event_id = $1 and status = 'succeeded'`, [eventId])).rows[0].n ===
        1,
      { timeoutMs: 40_000, what: `the event committed (log: ${daemon.logPath})` },
    );
    const turns = await c.query(`select status from corral.turns where event_id = $1 order by started_at`, [eventId]);
    expect(turns.rows.map((r) => r.status)).toEqual(['failed', 'succeeded']);
    const msgs = await c.query(
      `select m.role, m.content from corral.messages m join corral.turns t on t.id = m.turn_id where t.event_id = $1 order by m.seq`,
      [eventId],
    );
    expect(msgs.rows).toEqual([
      { role: 'user', content: { delayMs: 4000, text: 'slow' } },
      { role: 'assistant', content: { text: 'echo: slow' } },
    ]);

    // graceful stop on SIGTERM
    daemon.child.kill('SIGTERM');
    expect(await Promise.race([daemon.exited, new Promise((r) => setTimeout(() => r('timeout'), 15_000))])).toBe(0);
  });
});
