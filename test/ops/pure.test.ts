import { describe, expect, it } from 'vitest';
import { parseDurationMs } from '../../src/base/duration.ts';
import { errorLine } from '../../src/ops/dead-letters.ts';
import { fmtAge, renderTable } from '../../src/cli/commands/status.ts';
import { progressReporter } from '../../src/cli/commands/dlq.ts';

describe('operator helpers', () => {
  it('parses compact and ISO durations and rejects the rest with invalid_argument', () => {
    const m = 60_000;
    expect(parseDurationMs('30m')).toBe(30 * m);
    expect(parseDurationMs('2h')).toBe(120 * m);
    expect(parseDurationMs('1d')).toBe(1440 * m);
    expect(parseDurationMs('1h30m')).toBe(90 * m);
    expect(parseDurationMs('1.5h')).toBe(90 * m);
    expect(parseDurationMs('45s')).toBe(45_000);
    expect(parseDurationMs('PT2H')).toBe(120 * m);
    expect(parseDurationMs('p1dt1h')).toBe(1500 * m);
    for (const bad of ['', 'forever', '2', 'h', '-1h', '0m', 'P', '2 hours', '1h 30m']) {
      expect(() => parseDurationMs(bad), bad).toThrow(expect.objectContaining({ code: 'invalid_argument' }));
    }
  });

  it('renders errors on one line, ages compactly and tables aligned', () => {
    expect(errorLine({ error: { code: 'boom', message: 'bad\n  thing' }, kind: 'turn_error' })).toBe('boom: bad thing');
    expect(errorLine({ error: { message: 'lease expired' }, kind: 'lease_expired' })).toBe('lease_expired: lease expired');
    expect(errorLine({ value: { message: 'job heartbeat timeout' } })).toBe('job heartbeat timeout');
    expect(errorLine(null)).toBe('');
    expect([fmtAge(0.25), fmtAge(12.34), fmtAge(245), fmtAge(7380), fmtAge(273_600)]).toEqual([
      '250ms',
      '12.3s',
      '4m05s',
      '2h03m',
      '3d04h',
    ]);
    expect(
      renderTable(
        ['A', 'LONG'],
        [
          ['xyz', '1'],
          ['q', '22'],
        ],
      ),
    ).toBe('A    LONG\nxyz  1\nq    22\n');
  });
});

describe('progress reporting', () => {
  it('draws a bar in place on a TTY and prints plain, throttled lines otherwise', () => {
    const sink = (isTTY: boolean) => {
      const chunks: string[] = [];
      return { chunks, stream: { isTTY, columns: 60, write: (c: string) => chunks.push(c) > 0 } as never };
    };
    const plain = sink(false);
    const p = progressReporter(plain.stream, 'replay');
    for (let i = 1; i <= 40; i++) p.update(i, 40);
    p.finish();
    expect(plain.chunks).toEqual([1, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40].map((n) => `replay: ${n}/40\n`));
    const tty = sink(true);
    const t = progressReporter(tty.stream, 'discard');
    t.update(1, 2);
    t.update(2, 2);
    t.finish();
    expect(tty.chunks.join('')).toBe(`\rdiscard [${'#'.repeat(15)}${'.'.repeat(15)}] 1/2\rdiscard [${'#'.repeat(30)}] 2/2\n`);
  });
});
