/** A daemon and example workers on a fresh test database, and clients connected to it. */
import pg from 'pg';
import { connect, type ConnectOptions, type Corral, type TurnWatch, type WatchEvent } from '../../src/client/index.ts';
import type { Config } from '../../src/config.ts';
import { runExampleWorker } from '../../src/worker/example.ts';
import type { Worker } from '../../src/worker/sdk.ts';
import { startTestDaemon, testLogger, type TestDaemon } from '../helpers/daemon.ts';
import { waitFor } from '../helpers/wait.ts';

export interface ClientSetup {
  t: TestDaemon;
  corral: Corral;
  workers: Worker[];
  /** A plain pg client of the test database (for transactions of the caller's own). */
  pg: pg.Client;
  /** Another client of the same database. */
  connect(opts?: ConnectOptions): Promise<Corral>;
  stop(): Promise<void>;
}

export async function startClientSetup(
  overrides: Partial<Config> = {},
  opts: { workers?: number; capacity?: number } = {},
): Promise<ClientSetup> {
  const t = await startTestDaemon({ drainMs: 0, ...overrides });
  const workers: Worker[] = [];
  const clients: Corral[] = [];
  let raw: pg.Client | undefined;
  const stop = async () => {
    for (const c of clients) await c.close();
    for (const w of workers) await w.stop();
    await raw?.end();
    await t.stop();
  };
  try {
    const n = opts.workers ?? 1;
    for (let i = 0; i < n; i++) {
      workers.push(
        await runExampleWorker({
          endpoint: t.daemon.broker.endpoint,
          workerId: `cw-${i}`,
          capacity: opts.capacity ?? 4,
          logger: testLogger,
        }),
      );
    }
    await waitFor(() => t.daemon.runtime.workers.freeSlots() > 0 || n === 0, { what: 'workers registered' });
    const open = async (o: ConnectOptions = {}) => {
      const c = await connect({ databaseUrl: t.db.url, env: {}, ...o });
      clients.push(c);
      return c;
    };
    const corral = await open();
    raw = new pg.Client({ connectionString: t.db.url });
    await raw.connect();
    return { t, corral, workers, pg: raw, connect: open, stop };
  } catch (e) {
    await stop();
    throw e;
  }
}

/** The jobs of an actor in the actor queue (any state), oldest first. */
export async function jobsOf(c: pg.Client, actor: string): Promise<{ id: string; state: string; data: { payload: unknown } }[]> {
  const r = await c.query<{ id: string; state: string; data: { payload: unknown } }>(
    `select id, state::text as state, data from pgboss.job where name = 'actor-events' and singleton_key = $1 order by created_on, id`,
    [actor],
  );
  return r.rows;
}

/** The assistant texts of an actor's committed transcript, in order. */
export async function replies(corral: Corral, actor: string): Promise<string[]> {
  const tr = await corral.transcript(actor);
  return tr.map((t) => (t.messages.find((m) => m.role === 'assistant')?.content as { text?: string } | undefined)?.text ?? '');
}

/** A watch's events as `kind#attempt` (gaps as `gap:reason`). */
export const kinds = (seen: WatchEvent[]) => seen.map((e) => (e.kind === 'gap' ? `gap:${e.reason}` : `${e.kind}#${e.attempt}`));

/** Reads `watch` (leaving it open) until `until` holds for what was read, the watch ends or the deadline passes. */
export async function read(watch: TurnWatch, until: (seen: WatchEvent[]) => boolean, timeoutMs = 20_000): Promise<WatchEvent[]> {
  const seen: WatchEvent[] = [];
  const deadline = Date.now() + timeoutMs;
  while (!until(seen)) {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<'late'>((r) => (timer = setTimeout(() => r('late'), Math.max(0, deadline - Date.now()))));
    const next = await Promise.race([watch.next(), late]).finally(() => clearTimeout(timer));
    if (next === 'late') throw new Error(`read only ${JSON.stringify(kinds(seen))} before the deadline`);
    if (next.done) break;
    seen.push(next.value);
  }
  return seen;
}
