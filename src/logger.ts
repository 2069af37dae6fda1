/**
 * Structured logs: one JSON object per line (pino). Components take a child logger carrying
 * their name; the live path adds actor key, epoch and event id to every line.
 */
import { pino, type Logger, type LevelWithSilent } from 'pino';

export type { Logger };

export interface LoggerOptions {
  level?: LevelWithSilent;
  pretty?: boolean;
  /** Where to write; defaults to stdout. */
  destination?: number;
}

export function createLogger(opts: LoggerOptions = {}): Logger {
  const level = opts.level ?? 'info';
  if (opts.pretty) {
    return pino({
      level,
      transport: { target: 'pino-pretty', options: { colorize: true, destination: opts.destination ?? 1 } },
    });
  }
  return pino({ level, base: { pid: process.pid } }, pino.destination({ dest: opts.destination ?? 1, sync: false }));
}

/** A logger that drops everything (tests, library use without logging). */
export const silentLogger: Logger = pino({ level: 'silent' });
