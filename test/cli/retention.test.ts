/**
 * `corral retention set | list | clear` as subprocesses: the round trip through the database, the
 * output (table, JSON), and bad input answered with exit code 2 before the database is touched.
 * What the pruning deletes is covered by test/db/transcript-retention.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { listTranscriptRetention } from '../../src/db/operations/transcript-retention.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { CORRAL, corral, json, run } from './helpers.ts';

interface Policy {
  agentUid: string;
  keepSeconds: number;
  keep: string;
  updatedAt: string;
}

describe('corral retention (CLI)', { timeout: 180_000 }, () => {
  const tdb = useTestDatabase();
  const retention = (...args: string[]) => corral(['retention', ...args], tdb.url);

  it('sets, replaces, lists and clears a policy', async () => {
    const empty = await retention('list');
    expect(empty.code, empty.stderr).toBe(0);
    expect(empty.stdout).toBe('no transcript retention set: every agent keeps its transcript forever\n');

    const set = await retention('set', 'support-bot', '90d');
    expect(set.code, set.stderr).toBe(0);
    expect(set.stdout).toBe('transcripts of agent support-bot: kept 90d after each turn finished (was: kept forever)\n');
    const [replaced, other] = await Promise.all([retention('set', 'support-bot', '1d12h', '--json'), retention('set', 'triage', '30m')]);
    expect(replaced.code, replaced.stderr).toBe(0);
    expect(json<Policy & { previousKeepSeconds: number }>(replaced)).toMatchObject({
      agentUid: 'support-bot',
      keepSeconds: 36 * 3600,
      keep: '1d12h',
      previousKeepSeconds: 90 * 86_400,
    });
    expect(other.code, other.stderr).toBe(0);
    expect((await listTranscriptRetention(tdb.database.db)).map((p) => [p.agentUid, p.keepSeconds])).toEqual([
      ['support-bot', 36 * 3600],
      ['triage', 1800],
    ]);

    const [table, asJson] = await Promise.all([retention('list'), retention('list', '--json')]);
    expect(table.code, table.stderr).toBe(0);
    const lines = table.stdout.trimEnd().split('\n');
    expect(lines[0]).toMatch(/^AGENT\s+KEEP\s+SECONDS\s+UPDATED$/);
    expect(lines[1]).toMatch(/^support-bot\s+1d12h\s+129600\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ$/);
    expect(lines[2]).toMatch(/^triage\s+30m\s+1800\s+/);
    expect(lines[3]).toBe('agents not listed keep their transcripts forever');
    const list = json<{ retention: Policy[] }>(asJson).retention;
    expect(list.map((p) => [p.agentUid, p.keepSeconds, p.keep])).toEqual([
      ['support-bot', 129_600, '1d12h'],
      ['triage', 1800, '30m'],
    ]);
    expect(Number.isNaN(Date.parse(list[0]!.updatedAt))).toBe(false);

    const clear = await retention('clear', 'triage');
    expect(clear.code, clear.stderr).toBe(0);
    expect(clear.stdout).toBe('transcripts of agent triage: kept forever (was: kept 30m)\n');
    const again = await retention('clear', 'triage');
    expect(again.code).toBe(3);
    expect(again.stderr).toBe('corral: agent triage has no transcript retention: its transcript is kept\n');
    expect((await listTranscriptRetention(tdb.database.db)).map((p) => p.agentUid)).toEqual(['support-bot']);
  });

  it('answers bad input with exit code 2 and a clear message, before the database is touched', async () => {
    // nothing listens there: a command that got past its arguments would fail with exit 1
    const nowhere = { DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none' };
    const cases: [string[], RegExp][] = [
      [['set', 'agent', '90x'], /invalid retention "90x": expected e\.g\. 30m/],
      [['set', 'agent', '0d'], /invalid retention "0d"/],
      [['set', 'agent', '500ms'], /invalid retention "500ms": a whole number of seconds/],
      [['set', 'agent', '100y'], /invalid retention "100y"/],
      [['set', 'agent', '70000d'], /at most 2147483647 seconds/],
      [['set', 'agent/session', '90d'], /invalid agent_uid "agent\/session": .*an agent, not an actor key/],
      [['set', 'bad agent!', '90d'], /invalid agent_uid "bad agent!"/],
      [['clear', 'x'.repeat(129)], /invalid agent_uid/],
      [['set', 'agent'], /missing required argument 'duration'/],
      [['purge', 'agent'], /unknown command 'purge'/],
      [['list', '--verbose'], /unknown option '--verbose'/],
    ];
    const results = await Promise.all(cases.map(([args]) => run([CORRAL, 'retention', ...args], nowhere)));
    for (const [i, r] of results.entries()) {
      const [args, why] = cases[i]!;
      expect(r.code, `${args.join(' ')}: ${r.stderr}`).toBe(2);
      expect(r.stderr, args.join(' ')).toMatch(why);
    }
    const help = await Promise.all(['set', 'list', 'clear'].map((sub) => run([CORRAL, 'retention', sub, '--help'], nowhere)));
    for (const h of help) expect(h.code, h.stderr).toBe(0);
    expect(help[0]!.stdout).toContain('corral retention set support-bot 90d');
    expect((await run([CORRAL, 'retention', '--help'], nowhere)).stdout).toMatch(/set .*<agent_uid> <duration>/);
  });
});
