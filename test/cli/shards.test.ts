/**
 * `corral db migrate --shards N` and `corral shards list | set-url` as subprocesses, on a real
 * database: the shards set up and listed, `corral send` to an actor of another shard than the
 * catalog enqueued on that shard, the map's URLs, and bad arguments answered with exit code 2 (3 for a shard the map lacks).
 */
import { describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { shardOf } from '../../src/base/shard-map.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { corral, json } from './helpers.ts';

interface Row {
  shard: number;
  url: string | null;
  schemas: { corral: string; boss: string };
  actors: number | null;
  queued: number | null;
  emitsOut?: number;
  emitsFailing?: number;
}

describe('corral shards (CLI)', { timeout: 180_000 }, () => {
  const tdb = useTestDatabase();
  const cli = (...args: string[]) => corral(args, tdb.url);

  it('sets up, lists and moves shards; corral send enqueues on the actor’s shard', async () => {
    const migrated = await cli('db', 'migrate', '--shards', '3');
    expect(migrated.code, migrated.stderr).toBe(0);
    expect(migrated.stdout).toContain('shard 1: set up');
    expect(migrated.stdout).toContain('shard 2: set up');
    expect(migrated.stdout).toContain('3 shards: corral shards list shows them');

    const home = Array.from({ length: 20 }, (_, i) => actorKey('cli', `s${i}`)).find((k) => shardOf(k, 3) === 0)!;
    const away = Array.from({ length: 20 }, (_, i) => actorKey('cli', `s${i}`)).find((k) => shardOf(k, 3) === 2)!;
    const sent = await cli('send', `${home.agentUid}/${home.sessionId}`, '{"n":1}');
    expect(sent.code, sent.stderr).toBe(0);
    const routed = await cli('send', `${away.agentUid}/${away.sessionId}`, '{"n":2}');
    expect(routed.code, routed.stderr).toBe(0);
    const onShard2 = await tdb.client.query('select data from pgboss_s2.job where id = $1', [routed.stdout.trim()]);
    expect(onShard2.rows[0]?.data.payload).toEqual({ n: 2 });

    // corral status counts every shard's events, and shows each shard's
    const status = await cli('status', '--json');
    expect(status.code, status.stderr).toBe(0);
    const st = json<{ queue: { ready: number }; shards: { shard: number; queue: { ready: number } }[] }>(status);
    expect(st.queue.ready).toBe(2);
    expect(st.shards.map((x) => [x.shard, x.queue.ready])).toEqual([
      [0, 1],
      [1, 0],
      [2, 1],
    ]);
    expect((await cli('status')).stdout).toMatch(/^SHARD +READY +ACTIVE/m);

    const listed = await cli('shards', 'list', '--json');
    expect(listed.code, listed.stderr).toBe(0);
    expect(json<Row[]>(listed).map((r) => [r.shard, r.schemas.corral, r.queued, r.emitsOut, r.url])).toEqual([
      [0, 'corral', 1, 0, null],
      [1, 'corral_s1', 0, 0, null],
      [2, 'corral_s2', 1, 0, null],
    ]);
    // an emit stuck for shard 1 (its rows as a commit writes them; no daemon runs here to deliver it)
    await tdb.client.query(
      `insert into corral_s2.shard_emits (target_shard, event_id, agent_uid, session_id, data, attempts, last_error)
       values (1, '01890000-0000-7000-8000-0000000000aa', 'cli', 'x', '{}', 3, 'connection refused')`,
    );
    expect(json<Row[]>(await cli('shards', 'list', '--json'))[2]).toMatchObject({ emitsOut: 1, emitsFailing: 1 });
    expect((await cli('shards', 'list')).stdout).toMatch(/^ +2 +corral_s2, pgboss_s2 .* 1 \(1 failing\)/m);
    const table = await cli('shards', 'list');
    expect(table.stdout.split('\n')[0]).toMatch(/^SHARD +SCHEMAS +ACTORS +QUEUED +EMITS-OUT +DATABASE$/);
    expect(table.stdout).toContain('corral_s2, pgboss_s2');

    const moved = await cli('shards', 'set-url', '2', 'postgres://corral:sekret@db-2.internal:5432/corral');
    expect(moved.code, moved.stderr).toBe(0);
    const after = await cli('shards', 'list');
    expect(after.stdout).toContain('postgres://corral:****@db-2.internal:5432/corral');
    expect(after.stdout).not.toContain('sekret');
    // the map is what a send follows: shard 2 at an unreachable database is a clear failure, nothing sent
    const unreachable = await cli('send', `${away.agentUid}/${away.sessionId}`, '{"n":3}');
    expect(unreachable.code).not.toBe(0);
    expect(unreachable.stderr).toMatch(/db-2\.internal|ENOTFOUND|getaddrinfo|database/i);
    expect(unreachable.stderr).not.toContain('sekret');
    const back = await cli('shards', 'set-url', '2', '--catalog');
    expect(back.code, back.stderr).toBe(0);
    expect(json<Row[]>(await cli('shards', 'list', '--json'))[2]!.url).toBeNull();

    const fixed = await cli('db', 'migrate', '--shards', '4');
    expect(fixed.code).toBe(1);
    expect(fixed.stderr).toContain('the shard count is fixed once keys are placed');
  });

  it('answers bad arguments with exit code 2 and an unknown shard with 3', async () => {
    for (const args of [
      ['db', 'migrate', '--shards', '0'],
      ['db', 'migrate', '--shards', '1025'],
      ['db', 'migrate', '--shards', 'many'],
      ['shards', 'set-url', 'x', 'postgres://h/d'],
      ['shards', 'set-url', '2', 'http://h/d'],
      ['shards', 'set-url', '2'],
      ['shards', 'set-url', '2', 'postgres://h/d', '--catalog'],
      ['shards', 'set-url', '0', 'postgres://h/d'],
      ['shards', 'set-url', '99999', 'postgres://h/d'],
      // the map's URL is bounded (2048 characters, checked again by the table)
      ['shards', 'set-url', '2', `postgres://h/${'d'.repeat(2048)}`],
    ]) {
      const r = await cli(...args);
      expect(r.code, `${args.join(' ')}: ${r.stderr}`).toBe(2);
      expect(r.stderr.length).toBeGreaterThan(0);
    }
    const unknown = await cli('shards', 'set-url', '7', 'postgres://h/d');
    expect(unknown.code, unknown.stderr).toBe(3);
    expect(unknown.stderr).toContain('no shard 7');
    for (const help of [
      ['shards', '--help'],
      ['shards', 'list', '--help'],
      ['shards', 'set-url', '--help'],
      ['db', 'migrate', '--help'],
    ]) {
      const r = await cli(...help);
      expect(r.code, r.stderr).toBe(0);
      expect(r.stdout).toMatch(/shard/i);
    }
  });
});
