/**
 * Recovery after kill -9: a daemon (`corral daemon --workers W`, real processes) runs slow turns
 * until at least `--in-flight` of them are in flight, then it and its worker processes are killed
 * with SIGKILL and a second daemon is started on the same database. Reports the time from the kill
 * until every event is committed, next to the lease (`CORRAL_LEASE_MS`), and checks from the
 * database that every event committed exactly once (one succeeded turn, two transcript messages).
 * See docs/benchmarks.md.
 *
 *   npm run bench:recovery -- [--events 1000] [--in-flight 500] [--workers 2] [--capacity 300]
 *                             [--delay-ms 3000] [--lease-ms 60000] [--timeout-seconds 300]
 *
 * The other settings are the defaults (job heartbeat 30 s, recovery pass every 30 s, …): what a
 * user gets. Embedded PostgreSQL unless DATABASE_URL is set.
 */
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { actorKey } from '../src/base/actor-key.ts';
import { DEFAULTS } from '../src/config.ts';
import { openDatabase } from '../src/db/client.ts';
import { progress, runBench, sleep, until } from './lib/common.ts';
import { openBenchDatabase } from './lib/database.ts';
import { freshDatabase, openBenchClient, scalar, startDaemonProcess, waitForWorkers } from './lib/daemon-process.ts';

function options() {
  const { values } = parseArgs({
    options: {
      events: { type: 'string', default: '1000' },
      'in-flight': { type: 'string', default: '500' },
      workers: { type: 'string', default: '2' },
      capacity: { type: 'string', default: '300' },
      'delay-ms': { type: 'string', default: '3000' },
      'lease-ms': { type: 'string', default: String(DEFAULTS.leaseMs) },
      'timeout-seconds': { type: 'string', default: '300' },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (values.help) {
    process.stdout.write(
      'usage: npm run bench:recovery -- [--events N] [--in-flight M] [--workers W] [--capacity C] [--delay-ms D] [--lease-ms L] [--timeout-seconds T]\n',
    );
    process.exit(0);
  }
  const o = {
    events: Number(values.events),
    inFlight: Number(values['in-flight']),
    workers: Number(values.workers),
    capacity: Number(values.capacity),
    delayMs: Number(values['delay-ms']),
    leaseMs: Number(values['lease-ms']),
    timeoutSeconds: Number(values['timeout-seconds']),
  };
  if (!Object.values(o).every((n) => Number.isInteger(n) && n > 0) || o.inFlight > Math.min(o.events, o.workers * o.capacity)) {
    process.stderr.write('bench:recovery: positive integers, and --in-flight at most --events and workers × capacity\n');
    process.exit(2);
  }
  return o;
}

async function main(): Promise<number> {
  const opts = options();
  return runBench(async (cleanup) => {
    const server = await openBenchDatabase(cleanup);
    const db = await freshDatabase(server.url, cleanup, 'corral_recovery');
    const env = {
      CORRAL_LEASE_MS: String(opts.leaseMs),
      // A progress report extends the lease: a quarter of it, as the default (10 s of 60 s) does.
      CORRAL_PROGRESS_INTERVAL_MS: String(Math.max(50, Math.min(DEFAULTS.progressIntervalMs, Math.floor(opts.leaseMs / 4)))),
    };
    const first = await startDaemonProcess({ url: db.url, workers: opts.workers, capacity: opts.capacity, env, name: 'daemon-1' }, cleanup);
    const probe = openDatabase(db.url, { max: 2 });
    cleanup.defer('close probe', () => probe.close());
    await waitForWorkers(probe, opts.workers, 90_000, first.proc);
    const client = await openBenchClient(db.url, cleanup);
    const ids = await client.enqueue(
      Array.from({ length: opts.events }, (_, i) => ({
        key: actorKey(`recover-${i}`, 's'),
        event: { text: `e${i}`, delayMs: opts.delayMs },
      })),
    );
    const inFlight = () => scalar(probe.pool, `select count(*)::int as n from corral.turns where status = 'started'`);
    const running = await until(
      async () => {
        const n = await inFlight();
        return n >= opts.inFlight ? n : undefined;
      },
      performance.now() + 120_000,
      `${opts.inFlight} turns in flight`,
      20,
    );
    const committedBefore = await client.succeeded();
    await first.kill9();
    const tKill = performance.now();
    const killedAt = new Date();
    progress(`killed daemon ${first.pid} (kill -9) with ${running} turns in flight, ${committedBefore} committed`);

    await startDaemonProcess(
      { url: db.url, workers: opts.workers, capacity: opts.capacity, env, home: first.home, name: 'daemon-2' },
      cleanup,
    );
    let tReady = Number.NaN;
    let tFirstCommit = Number.NaN;
    // Ready: its workers registered (rows registered after the kill; the dead ones stay 'ready').
    void until(
      async () =>
        (await scalar(probe.pool, `select count(*)::int as n from corral.workers where status = 'ready' and last_heartbeat_at > $1`, [
          killedAt,
        ])) >= opts.workers,
      performance.now() + 90_000,
      "the second daemon's workers",
      50,
    )
      .then(() => (tReady = performance.now()))
      .catch(() => undefined);
    let last = 0;
    await until(
      async () => {
        const n = await client.succeeded();
        if (n > committedBefore && Number.isNaN(tFirstCommit)) tFirstCommit = performance.now();
        if (performance.now() - last > 5_000) {
          last = performance.now();
          progress(`recovery: ${n}/${opts.events} committed, ${((performance.now() - tKill) / 1000).toFixed(0)} s after the kill`);
        }
        return n >= opts.events;
      },
      tKill + opts.timeoutSeconds * 1000,
      'every event committed after the restart',
      100,
    );
    const tDone = performance.now();
    await sleep(500); // a late duplicate would show up here
    const check = (
      await probe.pool.query<{ events: number; once: number; twice: number; missing: number; messages_off: number; failed: number }>(
        `with per_event as (
           select e.id, count(t.*) filter (where t.status = 'succeeded') as ok, count(t.*) filter (where t.status = 'failed') as failed
             from unnest($1::uuid[]) as e(id) left join corral.turns t on t.event_id = e.id group by e.id),
         msgs as (
           select t.event_id, count(m.*) as n from corral.turns t join corral.messages m on m.turn_id = t.id
            where t.event_id = any($1::uuid[]) group by t.event_id)
         select count(*)::int as events,
                count(*) filter (where ok = 1)::int as once,
                count(*) filter (where ok > 1)::int as twice,
                count(*) filter (where ok = 0)::int as missing,
                (select count(*) from per_event p left join msgs on msgs.event_id = p.id where coalesce(msgs.n, 0) <> 2)::int as messages_off,
                sum(failed)::int as failed
           from per_event`,
        [ids],
      )
    ).rows[0]!;
    const s = (ms: number) => `${(ms / 1000).toFixed(1)} s`;
    const recoveryMs = tDone - tKill;
    const target = opts.leaseMs + 10_000;
    const out = (x: string) => process.stdout.write(`${x}\n`);
    out('\nrecovery after kill -9');
    out(
      `events                     ${opts.events} to ${opts.events} actors, turns of ${opts.delayMs} ms, ${opts.workers} worker processes × ${opts.capacity} slots`,
    );
    out(`at the kill                ${running} turns in flight, ${committedBefore} committed`);
    out(
      `lease                      ${s(opts.leaseMs)} (CORRAL_LEASE_MS); job heartbeat ${DEFAULTS.jobHeartbeatSeconds} s, recovery pass every ${s(DEFAULTS.recoveryIntervalMs)}`,
    );
    out(`kill → second daemon ready ${Number.isNaN(tReady) ? '?' : s(tReady - tKill)}`);
    out(`kill → first new commit    ${Number.isNaN(tFirstCommit) ? '?' : s(tFirstCommit - tKill)}`);
    out(
      `kill → every event committed  ${s(recoveryMs)}  (target lease + 10 s = ${s(target)}: ${recoveryMs <= target ? 'met' : 'MISSED'}; includes re-running the turns, ${s(opts.delayMs)} each)`,
    );
    out(
      `exactly once               ${check.once}/${check.events} events with one succeeded turn; ${check.twice} with more; ${check.missing} with none; ${check.messages_off} without exactly 2 transcript messages; ${check.failed} failed attempts (the killed ones)`,
    );
    return check.twice === 0 && check.missing === 0 && check.messages_off === 0 ? 0 : 1;
  });
}

process.exitCode = await main();
