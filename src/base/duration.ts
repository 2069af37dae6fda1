/**
 * Parses operator durations such as `--since 2h`: compact forms (`30s`, `30m`, `2h`, `1d`, `1w`,
 * `1h30m`, `1.5h`) and ISO 8601 durations (`PT2H`, `P1D`), through luxon's Duration.
 */
import { Duration, type DurationLikeObject } from 'luxon';
import { CorralError } from './errors.ts';

const UNITS: Record<string, keyof DurationLikeObject> = {
  ms: 'milliseconds',
  s: 'seconds',
  sec: 'seconds',
  m: 'minutes',
  min: 'minutes',
  h: 'hours',
  d: 'days',
  w: 'weeks',
};

const COMPACT = /^(?:\d+(?:\.\d+)?(?:ms|sec|min|s|m|h|d|w))+$/i;
const PART = /(\d+(?:\.\d+)?)(ms|sec|min|s|m|h|d|w)/gi;

/** The duration in milliseconds; throws `invalid_argument` naming the accepted forms. */
export function parseDurationMs(text: string, what = 'duration'): number {
  const raw = text.trim();
  let d: Duration | undefined;
  if (/^P/i.test(raw)) {
    const iso = Duration.fromISO(raw.toUpperCase());
    if (iso.isValid) d = iso;
  } else if (COMPACT.test(raw)) {
    const parts: DurationLikeObject = {};
    for (const [, n, unit] of raw.matchAll(PART)) {
      const key = UNITS[unit!.toLowerCase()]!;
      parts[key] = (parts[key] ?? 0) + Number(n);
    }
    d = Duration.fromObject(parts);
  }
  const ms = d?.isValid ? d.as('milliseconds') : NaN;
  if (!Number.isFinite(ms) || ms <= 0) {
    throw new CorralError(
      'invalid_argument',
      `invalid ${what} ${JSON.stringify(text)}: expected e.g. 30m, 2h, 1d, 1h30m or an ISO 8601 duration (PT2H)`,
    );
  }
  return ms;
}
