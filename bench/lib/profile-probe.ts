/**
 * What bench/profile.ts counts, and how:
 *  - client → server queries of this process (the daemon, pg-boss, the baselines, the bench's
 *    client), by the connection's application_name: `pg.Client.prototype.query` wrapped, one call
 *    = one round trip (`pg` sends Parse/Bind/Execute/Sync of a statement in one write);
 *  - ZeroMQ frames through the daemon's ROUTER (every message has the daemon at one end), by
 *    protocol `type`: `Router.prototype.send`/`receive` wrapped in this process;
 *  - on the server: pg_stat_statements deltas (exact, immediate), the WAL insert position (exact,
 *    cluster-wide), pg_stat_database and pg_stat_user_tables deltas (exact once every backend has
 *    flushed its pending statistics: a backend flushes at most once a second while busy and within
 *    10 s of going idle, hence the settle wait after each window), and /proc CPU.
 * The profile's own connections (application_name `corral-profile`) and the bench client's polls
 * are counted apart and left out.
 */
import { performance } from 'node:perf_hooks';
import pg from 'pg';
import { Router } from 'zeromq';
import { isBenchQuery } from './activity.ts';
import { sleep, type Cleanup } from './common.ts';
import type { ServerCpu } from './database.ts';

/** Named counts. */
export type Tally = Record<string, number>;

/** The profile's own connections: never counted as any system's. */
export const PROFILE_APP = 'corral-profile';
/** The bench client's progress polls and checks (application `corral-bench`), counted apart. */
export const POLLS = 'bench polls';
/** application_name of the corral bench client (bench/lib/corral-session.ts) that enqueues and polls. */
const BENCH_CLIENT_APP = 'corral-bench';

function bump(m: Map<string, number>, k: string, n = 1): void {
  m.set(k, (m.get(k) ?? 0) + n);
}

/** `b - a` per key, zeros left out. */
export function diff(a: Tally, b: Tally): Tally {
  const out: Tally = {};
  for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) {
    const d = (b[k] ?? 0) - (a[k] ?? 0);
    if (d !== 0) out[k] = d;
  }
  return out;
}

export function scale(t: Tally, f: number): Tally {
  return Object.fromEntries(Object.entries(t).map(([k, v]) => [k, v * f]));
}

export const total = (t: Tally, keep: (k: string) => boolean = () => true): number =>
  Object.entries(t).reduce((a, [k, v]) => (keep(k) ? a + v : a), 0);

const TX_BEGIN = /^\s*(begin|start\s+transaction)\b/i;
const TX_END = /^\s*(commit|rollback|end|abort)\b/i;
const ENDS_WITH_COMMIT = /\b(commit|end)\s*;?\s*$/i;

/**
 * Client → server queries of this process, by application_name (see the module comment), and the
 * transactions they make: one per BEGIN (or a multi-statement `BEGIN; …; COMMIT`), one per query
 * outside an explicit transaction (autocommit).
 */
export class QueryCounter {
  private readonly counts = new Map<string, number>();
  private readonly xacts = new Map<string, number>();

  install(): this {
    const proto = pg.Client.prototype as unknown as { query: (...args: unknown[]) => unknown };
    const original = proto.query;
    const counts = this.counts;
    const xacts = this.xacts;
    const inTx = new WeakSet<object>();
    proto.query = function (this: object, ...args: unknown[]) {
      const app = (this as { connectionParameters?: { application_name?: string } }).connectionParameters?.application_name ?? 'unknown';
      const q = args[0];
      const text = typeof q === 'string' ? q : typeof q === 'object' && q !== null && 'text' in q ? String(q.text) : '';
      const key = app === BENCH_CLIENT_APP && isBenchQuery(text) ? POLLS : app;
      bump(counts, key);
      if (TX_BEGIN.test(text)) {
        bump(xacts, key);
        if (!ENDS_WITH_COMMIT.test(text)) inTx.add(this);
      } else if (TX_END.test(text)) inTx.delete(this);
      else if (!inTx.has(this)) bump(xacts, key);
      return original.apply(this, args);
    };
    return this;
  }

  snapshot(): Tally {
    return Object.fromEntries(this.counts);
  }

  transactions(): Tally {
    return Object.fromEntries(this.xacts);
  }
}

/** The `type` of a protocol frame (one JSON object), without parsing it. */
function frameType(frame: unknown): string {
  const text = typeof frame === 'string' ? frame : Buffer.isBuffer(frame) ? frame.toString('utf8', 0, Math.min(frame.length, 4096)) : '';
  if (text.length === 0) return 'connection notice (empty frame)';
  const m = /"type"\s*:\s*"([A-Za-z_]{1,40})"/.exec(text);
  return m ? m[1]! : 'other';
}

/** ZeroMQ frames through the ROUTER sockets of this process (the daemon's broker), by type. */
export class ZmqCounter {
  private readonly sentBy = new Map<string, number>();
  private readonly receivedBy = new Map<string, number>();

  install(): this {
    const proto = Router.prototype as unknown as { send: (m: unknown) => Promise<void>; receive: () => Promise<unknown[]> };
    const send = proto.send;
    const receive = proto.receive;
    const sent = this.sentBy;
    const received = this.receivedBy;
    // The native methods are read-only on the base prototype: own properties of Router's shadow them.
    Object.defineProperty(proto, 'send', {
      configurable: true,
      writable: true,
      value(this: unknown, m: unknown) {
        return send.call(this, m).then(() => bump(sent, frameType(Array.isArray(m) ? m.at(-1) : m)));
      },
    });
    Object.defineProperty(proto, 'receive', {
      configurable: true,
      writable: true,
      value(this: unknown) {
        return receive.call(this).then((frames) => {
          bump(received, frameType(frames.at(-1)));
          return frames;
        });
      },
    });
    return this;
  }

  snapshot(): { sent: Tally; received: Tally } {
    return { sent: Object.fromEntries(this.sentBy), received: Object.fromEntries(this.receivedBy) };
  }
}

/** One pg_stat_statements entry, or its delta over a window. */
export interface StatementStat {
  query: string;
  /** false: run inside a function or trigger (only with pg_stat_statements.track = all). */
  toplevel: boolean;
  calls: number;
  execMs: number;
  planMs: number;
  rows: number;
  walBytes: number;
  walRecords: number;
}

/** A foreign-key check (RI trigger); pg-boss's job FKs are deferred, so they run at COMMIT, as top-level statements. */
export const isForeignKeyCheck = (q: string): boolean => /^\s*SELECT \$?\d+ FROM ONLY \S+ x WHERE .* FOR KEY SHARE OF x\s*$/is.test(q);

/** The profile's own statements and the bench client's polls, left out of the statement counts. */
export const isProfileStatement = (q: string): boolean =>
  isBenchQuery(q) || /pg_stat_|pg_current_wal|pg_wal_lsn_diff|^\s*analyze\b|pg_reload_conf/i.test(q);

/** A connection of the profile's own to one database: the server-side counters of that database. */
export class ServerProbe {
  readonly database: string;
  statementsAvailable = false;
  private readonly client: pg.Client;

  private constructor(client: pg.Client, database: string) {
    this.client = client;
    this.database = database;
  }

  static async open(url: string, cleanup: Cleanup, wantStatements: boolean): Promise<ServerProbe> {
    const client = new pg.Client({ connectionString: url, application_name: PROFILE_APP });
    await client.connect();
    cleanup.defer('close the profile connection', () => client.end());
    const db = (await client.query<{ db: string }>('select current_database() as db')).rows[0]!.db;
    const probe = new ServerProbe(client, db);
    if (wantStatements) {
      try {
        await client.query('create extension if not exists pg_stat_statements');
        await client.query('select 1 from pg_stat_statements limit 1');
        probe.statementsAvailable = true;
      } catch {
        probe.statementsAvailable = false; // not in shared_preload_libraries, or no privilege
      }
    }
    return probe;
  }

  query(text: string): Promise<unknown> {
    return this.client.query(text);
  }

  /** pg_stat_database and pg_stat_user_tables of this database (as flushed so far). */
  async counters(): Promise<Tally> {
    const out: Tally = {};
    const d = await this.client.query<Record<string, string>>(
      `select xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted
         from pg_stat_database where datname = current_database()`,
    );
    for (const [k, v] of Object.entries(d.rows[0] ?? {})) out[`db:${k}`] = Number(v);
    const t = await this.client.query<{ rel: string; ins: string; upd: string; hot: string; del: string }>(
      `select schemaname || '.' || relname as rel, n_tup_ins as ins, n_tup_upd as upd, n_tup_hot_upd as hot, n_tup_del as del
         from pg_stat_user_tables where n_tup_ins + n_tup_upd + n_tup_del > 0`,
    );
    for (const r of t.rows) {
      for (const k of ['ins', 'upd', 'hot', 'del'] as const) out[`table:${r.rel}:${k}`] = Number(r[k]);
    }
    return out;
  }

  /** The WAL insert position (cluster-wide). */
  async walLsn(): Promise<string> {
    return (await this.client.query<{ lsn: string }>('select pg_current_wal_insert_lsn()::text as lsn')).rows[0]!.lsn;
  }

  async walSince(lsn: string): Promise<number> {
    const r = await this.client.query<{ n: string }>('select pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::text as n', [lsn]);
    return Number(r.rows[0]!.n);
  }

  /** pg_stat_statements of this database by queryid, the profile's own left out. */
  async statements(): Promise<Map<string, StatementStat> | undefined> {
    if (!this.statementsAvailable) return undefined;
    const res = await this.client.query<{
      id: string;
      query: string;
      calls: string;
      exec_ms: number;
      plan_ms: number;
      rows: string;
      wal_bytes: string;
      wal_records: string;
      toplevel: boolean;
    }>(
      `select queryid::text || '/' || toplevel::text as id, query, calls, total_exec_time as exec_ms, total_plan_time as plan_ms,
              rows, wal_bytes::text as wal_bytes, wal_records, toplevel
         from pg_stat_statements where dbid = (select oid from pg_database where datname = current_database())`,
    );
    const m = new Map<string, StatementStat>();
    for (const r of res.rows) {
      if (isProfileStatement(r.query)) continue;
      m.set(r.id, {
        query: r.query,
        toplevel: r.toplevel,
        calls: Number(r.calls),
        execMs: Number(r.exec_ms),
        planMs: Number(r.plan_ms),
        rows: Number(r.rows),
        walBytes: Number(r.wal_bytes),
        walRecords: Number(r.wal_records),
      });
    }
    return m;
  }

  /** Connections to this database by application_name (the profile's own left out). */
  async connections(): Promise<Tally> {
    const r = await this.client.query<{ app: string; n: number }>(
      `select coalesce(nullif(application_name, ''), '(none)') as app, count(*)::int as n
         from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid() group by 1`,
    );
    return Object.fromEntries(r.rows.filter((x) => x.app !== PROFILE_APP).map((x) => [x.app, x.n]));
  }
}

function statementDeltas(a: Map<string, StatementStat>, b: Map<string, StatementStat>): StatementStat[] {
  const out: StatementStat[] = [];
  for (const [id, now] of b) {
    const was = a.get(id);
    const calls = now.calls - (was?.calls ?? 0);
    if (calls <= 0) continue;
    out.push({
      query: now.query,
      toplevel: now.toplevel,
      calls,
      execMs: now.execMs - (was?.execMs ?? 0),
      planMs: now.planMs - (was?.planMs ?? 0),
      rows: now.rows - (was?.rows ?? 0),
      walBytes: now.walBytes - (was?.walBytes ?? 0),
      walRecords: now.walRecords - (was?.walRecords ?? 0),
    });
  }
  return out.sort((x, y) => y.calls - x.calls);
}

/** What one measured window counted (totals, not per turn). */
export interface WindowCounts {
  /** Committed turns (raw: completed jobs) in the window. */
  turns: number;
  /** Wall time of the window, the profile's own steps (ANALYZE) left out. */
  ms: number;
  /** This process's queries by application_name (`corral-profile` and `bench polls` apart). */
  roundTrips: Tally;
  /** The transactions those queries made, by application_name (see QueryCounter). */
  transactions: Tally;
  zmq: { sent: Tally; received: Tally };
  /** pg_stat_statements deltas, the profile's own left out; undefined without the extension. */
  statements: StatementStat[] | undefined;
  /** WAL insert position delta (cluster-wide), the profile's ANALYZE steps left out. */
  walBytes: number;
  /** This process's CPU (user + system), the profile's steps left out. */
  processCpuMs: number;
  /** The local server's processes (embedded only). */
  serverCpuMs: number | undefined;
  /**
   * pg_stat_database (`db:…`) and pg_stat_user_tables (`table:<rel>:ins|upd|hot|del`) deltas,
   * read after the settle wait, the background of that wait subtracted; `db:xact_commit` also less
   * the profile's own and the polls' transactions (one per query).
   */
  pgstat: Tally;
  /** How long after the window's end pgstat was read (ms). */
  settledAfterMs: number;
  connections: Tally;
}

/** A window in progress: lets the profile run its own steps (ANALYZE) without counting them. */
export class Window {
  excludedMs = 0;
  excludedWal = 0;
  excludedProcessCpuMs = 0;
  excludedServerCpuMs = 0;
  private readonly probe: ServerProbe;
  private readonly serverCpu: ServerCpu;

  constructor(probe: ServerProbe, serverCpu: ServerCpu) {
    this.probe = probe;
    this.serverCpu = serverCpu;
  }

  /** Runs `fn` (the profile's own work) and leaves its time, WAL and CPU out of the window. */
  async exclude<T>(fn: () => Promise<T>): Promise<T> {
    const t0 = performance.now();
    const c0 = process.cpuUsage();
    const s0 = await this.serverCpu?.();
    const lsn = await this.probe.walLsn();
    const value = await fn();
    this.excludedWal += await this.probe.walSince(lsn);
    const s1 = await this.serverCpu?.();
    if (s0 !== undefined && s1 !== undefined) this.excludedServerCpuMs += s1 - s0;
    const c = process.cpuUsage(c0);
    this.excludedProcessCpuMs += (c.user + c.system) / 1000;
    this.excludedMs += performance.now() - t0;
    return value;
  }
}

export interface Meter {
  queries: QueryCounter;
  zmq: ZmqCounter;
  serverCpu: ServerCpu;
}

/** pgstat counts per ms of an idle system (see `measureWindow`'s `background`). */
export type Background = Tally;

/**
 * Measures `fn` (which returns the turns it committed). Immediate counters are read when it
 * returns; pg_stat_database/pg_stat_user_tables after `settleMs`, less `background` × the wait.
 */
export async function measureWindow(
  meter: Meter,
  probe: ServerProbe,
  fn: (w: Window) => Promise<number>,
  opts: { settleMs: number; background?: Background },
): Promise<WindowCounts> {
  const w = new Window(probe, meter.serverCpu);
  const pg0 = await probe.counters();
  const rtAtPg0 = meter.queries.snapshot();
  const st0 = await probe.statements();
  const lsn0 = await probe.walLsn();
  const rt0 = meter.queries.snapshot();
  const x0 = meter.queries.transactions();
  const z0 = meter.zmq.snapshot();
  const s0 = await meter.serverCpu?.();
  const c0 = process.cpuUsage();
  const t0 = performance.now();

  const turns = await fn(w);

  const t1 = performance.now();
  const c = process.cpuUsage(c0);
  const s1 = await meter.serverCpu?.();
  const rt1 = meter.queries.snapshot();
  const x1 = meter.queries.transactions();
  const z1 = meter.zmq.snapshot();
  const walBytes = (await probe.walSince(lsn0)) - w.excludedWal;
  const st1 = await probe.statements();
  const connections = await probe.connections();
  if (opts.settleMs > 0) await sleep(opts.settleMs);
  const rtAtPg1 = meter.queries.snapshot();
  const pg1 = await probe.counters();
  const settledAfterMs = performance.now() - t1;

  let pgstat = diff(pg0, pg1);
  if (opts.background) pgstat = diff(scale(opts.background, settledAfterMs), pgstat);
  // One transaction per query of the profile's own connection and of the polls (autocommit).
  const own = diff(rtAtPg0, rtAtPg1);
  const ownXacts = (own[PROFILE_APP] ?? 0) + (own[POLLS] ?? 0);
  pgstat['db:xact_commit'] = (pgstat['db:xact_commit'] ?? 0) - ownXacts;

  return {
    turns,
    ms: t1 - t0 - w.excludedMs,
    roundTrips: diff(rt0, rt1),
    transactions: diff(x0, x1),
    zmq: { sent: diff(z0.sent, z1.sent), received: diff(z0.received, z1.received) },
    statements: st0 && st1 ? statementDeltas(st0, st1) : undefined,
    walBytes,
    processCpuMs: (c.user + c.system) / 1000 - w.excludedProcessCpuMs,
    serverCpuMs: s0 !== undefined && s1 !== undefined ? s1 - s0 - w.excludedServerCpuMs : undefined,
    pgstat,
    settledAfterMs,
    connections,
  };
}

/** The pgstat background per ms of an idle window (measured without a settle wait: steady on both ends). */
export function backgroundOf(idle: WindowCounts): Background {
  const pgstat = { ...idle.pgstat };
  return scale(pgstat, 1 / Math.max(1, idle.ms));
}
