/** What the child processes logged: their JSON log lines, and the daemons' statistics. */
import { existsSync, readFileSync } from 'node:fs';

/** JSON lines of a pino log file (non-JSON lines, e.g. Node warnings, are returned as `raw`). */
export function readLogLines(path: string): Record<string, unknown>[] {
  if (!existsSync(path)) return [];
  const out: Record<string, unknown>[] = [];
  for (const line of readFileSync(path, 'utf8').split('\n')) {
    if (!line.trim()) continue;
    if (line.startsWith('{')) {
      try {
        out.push(JSON.parse(line) as Record<string, unknown>);
        continue;
      } catch {
        // fall through
      }
    }
    out.push({ raw: line });
  }
  return out;
}

export function tailFile(path: string, lines = 20): string {
  if (!existsSync(path)) return '(no log)';
  return readFileSync(path, 'utf8')
    .split('\n')
    .slice(-lines - 1)
    .join('\n');
}

export interface LogStats {
  committed: number;
  duplicates: number;
  rejected: Record<string, number>;
  rejectedTotal: number;
  deadLettered: number;
  errors: number;
  /** Error lines whose error is a lost database connection (known issue B3 when not retried). */
  connectionErrors: number;
  errorSamples: string[];
}

const CONNECTION_TEXT =
  /terminating connection|Connection terminated|connection error|ECONNREFUSED|ECONNRESET|database system is (starting up|shutting down)/i;

/** What the daemons said: commits, duplicate results, fence rejections, error lines. */
export function daemonLogStats(paths: string[]): LogStats {
  const s: LogStats = {
    committed: 0,
    duplicates: 0,
    rejected: {},
    rejectedTotal: 0,
    deadLettered: 0,
    errors: 0,
    connectionErrors: 0,
    errorSamples: [],
  };
  for (const p of paths) {
    for (const l of readLogLines(p)) {
      const msg = String(l.msg ?? '');
      if (msg === 'turn committed') s.committed++;
      else if (msg.startsWith('duplicate result')) s.duplicates++;
      else if (msg === 'fence rejected') {
        const r = String(l.reason);
        s.rejected[r] = (s.rejected[r] ?? 0) + 1;
        s.rejectedTotal++;
      } else if (msg.startsWith('event dead-lettered')) s.deadLettered++;
      if (typeof l.level === 'number' && l.level >= 50) {
        s.errors++;
        const err = l.err as { message?: string } | string | undefined;
        const text = `${msg}${err ? `: ${typeof err === 'string' ? err : err.message}` : ''}`;
        if (CONNECTION_TEXT.test(text)) s.connectionErrors++;
        if (s.errorSamples.length < 5) s.errorSamples.push(`${p.split('/').pop()}: ${text.replace(/\s+/g, ' ')}`);
      }
    }
  }
  return s;
}
