/**
 * `corral dlq …` and the dlq:inspect / dlq:replay scripts as subprocesses (stdout, stderr, exit
 * code) against dead letters made by the real runtime, mode `continue`. The operations' finer
 * semantics are covered in-process by test/ops/dead-letters.test.ts; this file checks the
 * command-line contract. Independent read-only commands run concurrently to keep it quick.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { sql } from '../../src/db/orm.ts';
import { actorKey } from '../../src/base/actor-key.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { makeDeadLetters } from '../ops/helpers.ts';
import { corral, json, script } from './helpers.ts';

interface ListJson {
  deadLetters: { id: string; eventId: string; actor: string; attempts: number; payload: unknown }[];
  next: string | null;
}
interface ActJson {
  results: { id: string; status: string; outcome?: string; eventId?: string }[];
  summary: Record<string, number>;
}

const UNKNOWN = '00000000-0000-4000-8000-000000000000';

// Several CLI processes per test: generous timeouts for loaded 2-core CI machines.
describe('corral dlq (CLI)', { timeout: 180_000 }, () => {
  const tdb = useTestDatabase();
  let a: string[];
  let b: string;
  let list: ListJson['deadLetters'];
  const dlq = (...args: string[]) => corral(['dlq', ...args], tdb.url);
  const idOf = (eventId: string) => list.find((d) => d.eventId === eventId)!.id;

  beforeAll(async () => {
    const ids = await makeDeadLetters(tdb, [
      { key: actorKey('cli-a', 's1'), payload: { fail: true, n: 1 } },
      { key: actorKey('cli-a', 's1'), payload: { fail: true, n: 2 } },
      { key: actorKey('cli-b', 's1'), payload: { fail: true, failCode: 'Boom_Special' } },
    ]);
    a = ids.slice(0, 2);
    b = ids[2]!;
  });

  it('lists (table, JSON, filters) and answers bad input with exit codes 1, 2 and 3', async () => {
    const [table, asJson, filtered, none, badKey, unknown, unreachable] = await Promise.all([
      dlq('list'),
      dlq('list', '--json'),
      dlq('list', '--json', '--actor', 'cli-b/s1', '--error', 'BOOM_special', '--since', '1h30m'),
      dlq('list', '--actor', 'nobody/none'),
      dlq('list', '--actor', 'no-slash'),
      dlq('show', UNKNOWN),
      corral(['dlq', 'list'], 'postgres://x:y@127.0.0.1:1/z'),
    ]);
    expect(table.code, table.stderr).toBe(0);
    expect(table.stdout).toMatch(/^ID\s+ACTOR\s+EVENT\s+ENQUEUED\s+FAILED\s+ATTEMPTS\s+LAST ERROR\n/);
    expect(table.stdout).toMatch(/cli-b\/s1 .* Boom_Special: example worker asked to fail\n/);
    expect(table.stdout).toContain('3 dead letters\n');

    expect(asJson.code).toBe(0);
    list = json<ListJson>(asJson).deadLetters;
    expect(list.map((d) => d.eventId).sort()).toEqual([...a, b].sort());
    expect(list.find((d) => d.eventId === a[1])).toMatchObject({ actor: 'cli-a/s1', attempts: 1, payload: { fail: true, n: 2 } });
    expect(json<ListJson>(filtered).deadLetters.map((d) => d.eventId)).toEqual([b]);

    expect([none.code, none.stdout]).toEqual([3, 'no dead letters match\n']);
    expect(badKey.code).toBe(2);
    expect(badKey.stderr).toContain('invalid actor key "no-slash": expected <agent_uid>/<session_id>');
    expect(unknown.code).toBe(3);
    expect(unknown.stderr).toContain(`no dead letter ${UNKNOWN}`);
    expect(unreachable.code).toBe(1);
    expect(unreachable.stderr).toMatch(/cannot reach the database at postgres:\/\/x:\*\*\*\*@127\.0\.0\.1:1\/z: .*ECONNREFUSED/);
  });

  it('shows a dead letter: payload, attempt errors, actor state', async () => {
    const r = await dlq('show', idOf(a[0]!));
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain(`event        ${a[0]}\n`);
    expect(r.stdout).toContain('actor        cli-a/s1\n');
    expect(r.stdout).toContain('"n": 1');
    expect(r.stdout).toMatch(
      /attempt errors \(1 turn\)\n\s+ATTEMPT\s+STATUS.*\n\s+1\s+failed\s.*handler_error: example worker asked to fail/,
    );
    expect(r.stdout).toContain('blocked      no\n');
    expect(r.stdout).toContain('queue depth  0 pending events\n');
  });

  it('bulk replay needs --yes; then replays in order, and a repeat is a no-op', async () => {
    const [guard, nothing] = await Promise.all([
      dlq('replay', '--all', '--actor', 'cli-a/s1'),
      dlq('replay', '--all', '--actor', 'nobody/none', '--yes'),
    ]);
    expect(guard.code).toBe(2);
    expect(guard.stderr).toContain('would replay 2 dead letter(s) of 1 actor(s)');
    expect(guard.stderr).toContain('add --yes to proceed');
    expect(nothing.code).toBe(3);

    const r = await dlq('replay', '--all', '--actor', 'cli-a/s1', '--yes', '--json');
    expect(r.code, r.stderr).toBe(0);
    const out = json<ActJson>(r);
    expect(out.results.map((x) => [x.eventId, x.status, x.outcome])).toEqual(a.map((e) => [e, 'replayed', 'reinserted']));
    expect(r.stderr).toContain('replay: 2/2'); // plain progress lines when stderr is not a TTY
    const jobs = await tdb.database.db.execute<{ id: string }>(
      sql`select id from pgboss.job where name = 'actor-events' and singleton_key = 'cli-a/s1' order by created_on, id`,
    );
    expect(jobs.rows.map((j) => j.id)).toEqual(a);

    const again = await script('scripts/dlq-replay.ts', [idOf(a[0]!), UNKNOWN], tdb.url);
    expect(again.code).toBe(3); // one id is unknown
    expect(again.stdout).toContain(`already replayed  ${idOf(a[0]!)} event ${a[0]} of cli-a/s1 (reinserted)\n`);
    expect(again.stdout).toContain(`not found         ${UNKNOWN}\n`);
    const count = await tdb.database.db.execute<{ n: number }>(
      sql`select count(*)::int as n from pgboss.job where name = 'actor-events' and id = ${a[0]!}`,
    );
    expect(count.rows[0]!.n).toBe(1);
  });

  it('discards by id, recording the payload; the inspect script then finds nothing left', async () => {
    const r = await dlq('discard', idOf(b));
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain(`discarded         ${idOf(b)} event ${b} of cli-b/s1 (discarded)\n`);
    const rec = await tdb.database.db.execute<{ action: string; payload: unknown }>(
      sql`select action, payload from corral.dead_letter_actions where event_id = ${b}`,
    );
    expect(rec.rows).toEqual([{ action: 'discard', payload: { fail: true, failCode: 'Boom_Special' } }]);
    const left = await script('scripts/dlq-inspect.ts', ['list', '--json'], tdb.url);
    expect(left.code, left.stderr).toBe(0);
    expect(json<ListJson>(left)).toEqual({ deadLetters: [], next: null });
  });
});
