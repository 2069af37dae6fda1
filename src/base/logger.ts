/**
 * Structured logs: one JSON object per line (pino). Components take a child logger carrying
 * their name; the live path adds actor key, epoch and event id to every line.
 */
import { pino, type Logger, type LevelWithSilent } from 'pino';
import { loggableError } from './errors.ts';

export type { Logger };

export interface LoggerOptions {
  level?: LevelWithSilent;
  pretty?: boolean;
  /** Where to write; defaults to stdout. */
  destination?: number;
}

/** Every `err` field is logged bounded (src/base/errors.ts, `loggableError`). */
const serializers = { err: loggableError };

export function createLogger(opts: LoggerOptions = {}): Logger {
  const level = opts.level ?? 'info';
  if (opts.pretty) {
    return pino({
      level,
      serializers,
      transport: { target: 'pino-pretty', options: { colorize: true, destination: opts.destination ?? 1 } },
    });
  }
  return pino({ level, base: { pid: process.pid }, serializers }, pino.destination({ dest: opts.destination ?? 1, sync: false }));
}

/** A logger that drops everything (tests, library use without logging). */
export const silentLogger: Logger = pino({ level: 'silent' });
