/** The per-turn profile's report (bench/profile.ts): per-turn figures from the windows, the table, the JSON. */
import { isForeignKeyCheck, POLLS, PROFILE_APP, total, type StatementStat, type Tally, type WindowCounts } from './profile-probe.ts';

/** One profiled system: what its window counted. */
export interface SystemRun {
  name: string;
  window: WindowCounts;
  /** corral: CPU of the worker processes over the rounds (0 when in-process). */
  workerCpuMs?: number;
  /** The background measured before the window: the server alone (baselines), the idle daemon (corral). */
  idle?: WindowCounts;
  /** corral: turn_start contexts from the daemon's cache, or read by the database. */
  contexts?: { cached: number; read: number };
}

export interface StatementRow {
  query: string;
  /** Distinct texts of this shape (pg-boss's `ANY(ARRAY[$3,$4,…])` per batch size). */
  variants?: number;
  callsPerTurn: number;
  meanMs: number;
  execMsPerTurn: number;
  planMsPerTurn: number;
  rowsPerCall: number;
  walBytesPerTurn: number;
}

export interface SystemProfile {
  name: string;
  turns: number;
  /** Turns (jobs) per second over the window, for orientation only (the profile is not a speed bench). */
  turnsPerSec: number;
  perTurn: {
    /** pg_stat_statements calls (top-level statements), exact; undefined without the extension. */
    statements?: number;
    /** … of which BEGIN / COMMIT / ROLLBACK. */
    txControlStatements?: number;
    /** … of which foreign-key checks (pg-boss's deferred FKs on the job table run at COMMIT, counted as top-level statements). */
    foreignKeyChecks?: number;
    execMs?: number;
    planMs?: number;
    /** This process's queries (one call = one round trip), the bench's polls and the profile's own left out. */
    roundTrips: number;
    /** Transactions of this process's queries (client side: BEGIN … COMMIT, or one autocommit query), exact. */
    transactions: number;
    /** pg_stat_database.xact_commit (server side; autovacuum's too), the profile's own and the polls' left out, background subtracted. */
    serverTransactions: number;
    rollbacks: number;
    /** Rows inserted + updated + deleted in user tables (pg_stat_user_tables). */
    rowsWritten: number;
    rowsInserted: number;
    rowsUpdated: number;
    rowsHotUpdated: number;
    rowsDeleted: number;
    /** pg_stat_database's tup_inserted + tup_updated + tup_deleted (catalogs included). */
    databaseRowsWritten: number;
    /** WAL insert position delta (cluster-wide). */
    walBytes: number;
    /** WAL written inside the statements, as pg_stat_statements counts it (commit records of autocommit statements left out). */
    statementWalBytes?: number;
    serverCpuMs?: number;
    /** This process: the daemon and the bench client (corral), the pg-boss loop or handler (baselines). */
    nodeCpuMs: number;
    /** corral's worker processes. */
    workerCpuMs?: number;
    zmqSent?: number;
    zmqReceived?: number;
  };
  roundTripsByApp: Tally;
  zmqByType?: { sent: Tally; received: Tally };
  rowsByTable: Record<string, { ins: number; upd: number; hot: number; del: number }>;
  statements?: StatementRow[];
  /** The background per second (the server alone, or with the idle daemon); subtracted from pgstat over the settle wait. */
  idlePerSecond?: {
    statements?: number;
    roundTrips: number;
    transactions: number;
    serverTransactions: number;
    rowsWritten: number;
    walBytes: number;
    zmq: number;
  };
  contexts?: { cached: number; read: number };
  /** Connections to the database by application_name at the window's end. */
  connections: Tally;
  /** Seconds between the window's end and the pgstat read (the settle wait). */
  settledAfterS: number;
}

export interface ProfileReport {
  systems: SystemProfile[];
  params: Record<string, unknown>;
  env: Record<string, unknown>;
  notes: string[];
  durationMs: number;
}

const isTxControl = (q: string) => /^\s*(begin|commit|rollback|start transaction|end)\b/i.test(q);
const ownApp = (k: string) => k !== PROFILE_APP && k !== POLLS;

function rowsOf(pgstat: Tally): SystemProfile['rowsByTable'] {
  const out: SystemProfile['rowsByTable'] = {};
  for (const [k, v] of Object.entries(pgstat)) {
    const m = /^table:(.+):(ins|upd|hot|del)$/.exec(k);
    if (!m) continue;
    const t = (out[m[1]!] ??= { ins: 0, upd: 0, hot: 0, del: 0 });
    t[m[2] as 'ins' | 'upd' | 'hot' | 'del'] += v;
  }
  return out;
}

/**
 * Statements of one shape merged: pg-boss spells an array of N ids as N parameters
 * (`ANY(ARRAY[$3,$4,…])`), one pg_stat_statements entry (and one parse and plan) per N.
 */
function byShape(stats: StatementStat[]): (StatementStat & { variants: number })[] {
  const m = new Map<string, StatementStat & { variants: number }>();
  for (const s of stats) {
    const key = s.query
      .replace(/\s+/g, ' ')
      .replace(/\$\d+(\s*,\s*\$\d+)*/g, '$n')
      .trim();
    const t = m.get(key);
    if (!t) m.set(key, { ...s, query: s.query.replace(/\s+/g, ' ').trim(), variants: 1 });
    else {
      t.calls += s.calls;
      t.execMs += s.execMs;
      t.planMs += s.planMs;
      t.rows += s.rows;
      t.walBytes += s.walBytes;
      t.walRecords += s.walRecords;
      t.variants++;
    }
  }
  return [...m.values()].sort((a, b) => b.calls - a.calls);
}

function statementRows(stats: StatementStat[], turns: number): StatementRow[] {
  return byShape(stats).map((s) => ({
    query: s.query,
    ...(s.variants > 1 ? { variants: s.variants } : {}),
    callsPerTurn: s.calls / turns,
    meanMs: s.execMs / s.calls,
    execMsPerTurn: s.execMs / turns,
    planMsPerTurn: s.planMs / turns,
    rowsPerCall: s.rows / s.calls,
    walBytesPerTurn: s.walBytes / turns,
  }));
}

export function profileOf(run: SystemRun): SystemProfile {
  const w = run.window;
  const n = Math.max(1, w.turns);
  const per = (x: number) => x / n;
  const byTable = rowsOf(w.pgstat);
  const tables = Object.values(byTable);
  const sumOf = (k: 'ins' | 'upd' | 'hot' | 'del') => tables.reduce((a, t) => a + t[k], 0);
  const st = w.statements;
  const zmqSent = total(w.zmq.sent);
  const zmqReceived = total(w.zmq.received);
  const corral = run.workerCpuMs !== undefined;
  const p: SystemProfile = {
    name: run.name,
    turns: w.turns,
    turnsPerSec: (w.turns * 1000) / w.ms,
    perTurn: {
      ...(st
        ? {
            statements: per(st.reduce((a, s) => a + s.calls, 0)),
            txControlStatements: per(st.filter((s) => isTxControl(s.query)).reduce((a, s) => a + s.calls, 0)),
            foreignKeyChecks: per(st.filter((s) => isForeignKeyCheck(s.query)).reduce((a, s) => a + s.calls, 0)),
            execMs: per(st.reduce((a, s) => a + s.execMs, 0)),
            planMs: per(st.reduce((a, s) => a + s.planMs, 0)),
            statementWalBytes: per(st.reduce((a, s) => a + s.walBytes, 0)),
          }
        : {}),
      roundTrips: per(total(w.roundTrips, ownApp)),
      transactions: per(total(w.transactions, ownApp)),
      serverTransactions: per(w.pgstat['db:xact_commit'] ?? 0),
      rollbacks: per(w.pgstat['db:xact_rollback'] ?? 0),
      rowsWritten: per(sumOf('ins') + sumOf('upd') + sumOf('del')),
      rowsInserted: per(sumOf('ins')),
      rowsUpdated: per(sumOf('upd')),
      rowsHotUpdated: per(sumOf('hot')),
      rowsDeleted: per(sumOf('del')),
      databaseRowsWritten: per((w.pgstat['db:tup_inserted'] ?? 0) + (w.pgstat['db:tup_updated'] ?? 0) + (w.pgstat['db:tup_deleted'] ?? 0)),
      walBytes: per(w.walBytes),
      ...(w.serverCpuMs !== undefined ? { serverCpuMs: per(w.serverCpuMs) } : {}),
      nodeCpuMs: per(w.processCpuMs),
      ...(corral ? { workerCpuMs: per(run.workerCpuMs!), zmqSent: per(zmqSent), zmqReceived: per(zmqReceived) } : {}),
    },
    roundTripsByApp: Object.fromEntries(Object.entries(w.roundTrips).map(([k, v]) => [k, per(v)])),
    ...(corral
      ? {
          zmqByType: {
            sent: Object.fromEntries(Object.entries(w.zmq.sent).map(([k, v]) => [k, per(v)])),
            received: Object.fromEntries(Object.entries(w.zmq.received).map(([k, v]) => [k, per(v)])),
          },
        }
      : {}),
    rowsByTable: Object.fromEntries(
      Object.entries(byTable)
        .map(([k, t]) => [k, { ins: per(t.ins), upd: per(t.upd), hot: per(t.hot), del: per(t.del) }] as const)
        .filter(([, t]) => t.ins + t.upd + t.del > 0)
        .sort((a, b) => b[1].ins + b[1].upd + b[1].del - (a[1].ins + a[1].upd + a[1].del)),
    ),
    ...(st ? { statements: statementRows(st, n) } : {}),
    ...(run.contexts ? { contexts: run.contexts } : {}),
    connections: w.connections,
    settledAfterS: w.settledAfterMs / 1000,
  };
  if (run.idle) {
    const i = run.idle;
    const s = i.ms / 1000;
    const rows = Object.values(rowsOf(i.pgstat)).reduce((a, t) => a + t.ins + t.upd + t.del, 0);
    p.idlePerSecond = {
      ...(i.statements ? { statements: i.statements.reduce((a, x) => a + x.calls, 0) / s } : {}),
      roundTrips: total(i.roundTrips, ownApp) / s,
      transactions: total(i.transactions, ownApp) / s,
      serverTransactions: (i.pgstat['db:xact_commit'] ?? 0) / s,
      rowsWritten: rows / s,
      walBytes: i.walBytes / s,
      zmq: (total(i.zmq.sent) + total(i.zmq.received)) / s,
    };
  }
  return p;
}

const APP_LABELS: Record<string, string> = {
  corral: 'daemon: corral pool',
  'corral-boss': 'pg-boss',
  'corral-bench': 'bench client: enqueue',
  'corral-bench-hand': 'handler pool',
};

export function printProfile(r: ProfileReport, write: (s: string) => void = (s) => process.stdout.write(s)): void {
  const systems = r.systems;
  const f = (x: number | undefined, d = 2) => (x === undefined || !Number.isFinite(x) ? '–' : x.toFixed(d));
  const rows: [string, ...string[]][] = [];
  const row = (label: string, get: (s: SystemProfile) => string) => rows.push([label, ...systems.map(get)]);
  row('turns (raw: jobs) measured', (s) => String(s.turns));
  row('  turns/s in the window', (s) => f(s.turnsPerSec, 0));
  row('statements / turn (pg_stat_statements)', (s) => f(s.perTurn.statements));
  row('  deferred FK checks at COMMIT', (s) => f(s.perTurn.foreignKeyChecks));
  row('  sent by clients', (s) => f(s.perTurn.statements === undefined ? undefined : s.perTurn.statements - s.perTurn.foreignKeyChecks!));
  row('    of which BEGIN/COMMIT', (s) => f(s.perTurn.txControlStatements));
  row('  server exec + plan ms / turn', (s) =>
    s.perTurn.execMs === undefined ? '–' : `${f(s.perTurn.execMs, 3)} + ${f(s.perTurn.planMs, 3)}`,
  );
  row('round trips / turn (client queries)', (s) => f(s.perTurn.roundTrips));
  const apps = [...new Set(systems.flatMap((s) => Object.keys(s.roundTripsByApp)))].filter((a) => a !== PROFILE_APP && a !== POLLS);
  for (const app of apps) row(`  ${APP_LABELS[app] ?? app}`, (s) => f(s.roundTripsByApp[app]));
  if (systems.some((s) => s.perTurn.workerCpuMs !== undefined))
    row('  worker processes', (s) => (s.perTurn.workerCpuMs !== undefined ? '0' : ''));
  row('transactions / turn (client side)', (s) => f(s.perTurn.transactions));
  row('  xact_commit / turn (server side)', (s) => f(s.perTurn.serverTransactions));
  if (systems.some((s) => s.perTurn.rollbacks > 0.005)) row('  rollbacks / turn', (s) => f(s.perTurn.rollbacks));
  row('rows written / turn (ins+upd+del)', (s) => f(s.perTurn.rowsWritten));
  row(
    '  inserted / updated (HOT) / deleted',
    (s) => `${f(s.perTurn.rowsInserted)} / ${f(s.perTurn.rowsUpdated)} (${f(s.perTurn.rowsHotUpdated)}) / ${f(s.perTurn.rowsDeleted)}`,
  );
  row('WAL bytes / turn (LSN delta)', (s) => f(s.perTurn.walBytes, 0));
  row('  inside statements (pg_stat_statements)', (s) => f(s.perTurn.statementWalBytes, 0));
  row('PostgreSQL CPU ms / turn', (s) => f(s.perTurn.serverCpuMs, 3));
  row('Node CPU ms / turn: this process', (s) => f(s.perTurn.nodeCpuMs, 3));
  if (systems.some((s) => s.perTurn.workerCpuMs !== undefined)) row('  + worker processes', (s) => f(s.perTurn.workerCpuMs, 3));
  if (systems.some((s) => s.perTurn.zmqSent !== undefined)) {
    row('ZeroMQ messages / turn: sent / received', (s) =>
      s.perTurn.zmqSent === undefined ? '–' : `${f(s.perTurn.zmqSent)} / ${f(s.perTurn.zmqReceived)}`,
    );
    const types = [
      ...new Set(systems.flatMap((s) => [...Object.keys(s.zmqByType?.sent ?? {}), ...Object.keys(s.zmqByType?.received ?? {})])),
    ];
    for (const t of types.sort()) {
      row(`  ${t}`, (s) => {
        if (!s.zmqByType) return '';
        const out = s.zmqByType.sent[t];
        const inn = s.zmqByType.received[t];
        return [out !== undefined ? `${f(out, 3)} out` : '', inn !== undefined ? `${f(inn, 3)} in` : ''].filter(Boolean).join(', ') || '–';
      });
    }
  }
  if (systems.some((s) => s.idlePerSecond)) {
    row('idle, per second: statements / round trips', (s) =>
      s.idlePerSecond ? `${f(s.idlePerSecond.statements, 1)} / ${f(s.idlePerSecond.roundTrips, 1)}` : '',
    );
    row('  transactions: client / server', (s) =>
      s.idlePerSecond ? `${f(s.idlePerSecond.transactions, 1)} / ${f(s.idlePerSecond.serverTransactions, 1)}` : '',
    );
    row('  rows / WAL bytes / ZeroMQ messages', (s) =>
      s.idlePerSecond ? `${f(s.idlePerSecond.rowsWritten, 1)} / ${f(s.idlePerSecond.walBytes, 0)} / ${f(s.idlePerSecond.zmq, 1)}` : '',
    );
  }
  if (systems.some((s) => s.contexts))
    row('turn_start contexts: cached / read', (s) => (s.contexts ? `${s.contexts.cached} / ${s.contexts.read}` : ''));

  const header: [string, ...string[]] = ['per committed turn', ...systems.map((s) => s.name)];
  const all = [header, ...rows];
  const widths = header.map((_, i) => Math.max(...all.map((x) => (x[i] ?? '').length)));
  const line = (x: string[]) => x.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ');
  write(`\ncorral per-turn profile\n${line(header)}\n${widths.map((w) => '-'.repeat(w)).join('  ')}\n`);
  for (const x of rows) write(`${line(x)}\n`);

  for (const s of systems) {
    if (s.statements?.length) {
      const top = s.statements.slice(0, s.name.startsWith('corral') ? 15 : 6);
      write(`\n${s.name}: top statements by calls per turn (pg_stat_statements)\n`);
      write(
        `${'calls/turn'.padStart(10)}  ${'mean ms'.padStart(8)}  ${'ms/turn'.padStart(8)}  ${'plan/turn'.padStart(9)}  ${'rows/call'.padStart(9)}  ${'WAL B/turn'.padStart(10)}  statement\n`,
      );
      for (const t of top) {
        write(
          `${f(t.callsPerTurn, 3).padStart(10)}  ${f(t.meanMs, 3).padStart(8)}  ${f(t.execMsPerTurn, 3).padStart(8)}  ${f(t.planMsPerTurn, 3).padStart(9)}  ${f(t.rowsPerCall, 1).padStart(9)}  ${f(t.walBytesPerTurn, 0).padStart(10)}  ` +
            `${t.variants ? `[${t.variants} texts] ` : ''}${t.query.slice(0, 90)}\n`,
        );
      }
    }
    const tables = Object.entries(s.rowsByTable).slice(0, 8);
    if (tables.length) {
      write(`${s.statements?.length ? '' : '\n'}${s.name}: rows written per turn by table (ins / upd (HOT) / del)\n`);
      for (const [t, v] of tables) write(`  ${t.padEnd(44)} ${f(v.ins)} / ${f(v.upd)} (${f(v.hot)}) / ${f(v.del)}\n`);
    }
  }
  write(
    `\n${Object.entries(r.params)
      .map(([k, v]) => `${k} ${String(v)}`)
      .join(', ')}\n`,
  );
  write(
    `${Object.entries(r.env)
      .map(([k, v]) => `${k}: ${String(v)}`)
      .join('; ')}\n`,
  );
  for (const n of r.notes) write(`note: ${n}\n`);
  write(`duration ${(r.durationMs / 1000).toFixed(1)} s\n`);
}
