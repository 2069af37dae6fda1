/**
 * Crash test of a daemon serving 4 shards on one PostgreSQL (docs/scaling.md, "Emits to another
 * shard"), on real processes (`corral daemon`, `corral worker`, real PostgreSQL and ZeroMQ): a ring
 * of emits passes from actor to actor across the shards while the daemon is killed -9, first right
 * after a target shard committed a relayed emit and before the source deleted it (crash point
 * `shard-relay-delivered`: the redelivery the inbox must absorb), then at a random moment. Every
 * event of the ring commits exactly once, and each actor's events in ring order.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { shardOf } from '../../src/base/shard-map.ts';
import { loadConfig } from '../../src/config.ts';
import { migrateShards } from '../../src/ops/shards.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { exitOf, fastRecoveryEnv, freePort, killAll, spawnCorral, stopGracefully, type Proc } from '../helpers/processes.ts';
import { waitFor } from '../helpers/wait.ts';

const SHARDS = 4;
const LAST = 299;

describe('kill -9 of a daemon serving 4 shards while emits cross them', { timeout: 240_000 }, () => {
  const tdb = useTestDatabase();
  const procs: Proc[] = [];

  afterAll(async () => {
    for (const p of procs) await stopGracefully(p);
    killAll();
  });

  it('a ring of 300 emits across the shards: each event once, in order per actor', async () => {
    await migrateShards(tdb.url, SHARDS, loadConfig({}, {}));
    const c = tdb.client;
    const endpoint = `tcp://127.0.0.1:${await freePort()}`;
    const env = fastRecoveryEnv(tdb.url, endpoint);
    const start = (args: string[], name: string, extra: Record<string, string> = {}) => {
      const p = spawnCorral(args, { ...env, ...extra }, name);
      procs.push(p);
      return p;
    };
    // 8 actors, two on each shard, consecutive ones on different shards
    const byShard: string[][] = Array.from({ length: SHARDS }, () => []);
    for (let i = 0; byShard.some((l) => l.length < 2); i++) {
      const key = actorKey('ring', `r-${i}`);
      const l = byShard[shardOf(key, SHARDS)]!;
      if (l.length < 2) l.push(`ring/r-${i}`);
    }
    const actors = [0, 1].flatMap((i) => byShard.map((l) => l[i]!));
    const schemaOf = (actor: string) => {
      const s = shardOf(actorKey('ring', actor.split('/')[1]!), SHARDS);
      return s === 0 ? 'corral' : `corral_s${s}`;
    };

    let daemon = start(['daemon'], 'daemon', { CORRAL_CRASH_AT: 'shard-relay-delivered' });
    start(['worker', '--id', 'ring-w1', '--endpoint', endpoint, '--capacity', '4', '--insecure'], 'worker');
    await waitFor(
      async () => (await c.query(`select 1 from corral.workers where status = 'ready'`).catch(() => ({ rowCount: 0 }))).rowCount! > 0,
      { timeoutMs: 30_000, what: `a worker registered (log: ${daemon.logPath})` },
    );
    const first = actors[0]!;
    await c.query(`select ${schemaOf(first)}.send_event('ring', $1, $2::jsonb)`, [
      first.split('/')[1],
      JSON.stringify({ ring: { actors, n: 0, last: LAST } }),
    ]);
    expect(await exitOf(daemon), `the daemon reached the crash point (log: ${daemon.logPath})`).toBeNull();

    const committed = async () => {
      const out: { actor: string; n: number }[] = [];
      for (const schema of new Set(actors.map(schemaOf))) {
        const r = await c.query<{ session_id: string; n: number }>(
          `select cv.session_id, (t.input -> 'ring' ->> 'n')::int as n
             from ${schema}.turns t join ${schema}.conversations cv on cv.id = t.conversation_id
            where cv.agent_uid = 'ring' and t.status = 'succeeded' order by t.finished_at, t.event_id`,
        );
        out.push(...r.rows.map((row) => ({ actor: `ring/${row.session_id}`, n: row.n })));
      }
      return out;
    };

    // a second daemon finds the relayed rows still at the source: it delivers them again (a no-op)
    daemon = start(['daemon'], 'daemon2');
    await waitFor(async () => (await committed()).length >= 100, { timeoutMs: 90_000, what: `100 ring events (log: ${daemon.logPath})` });
    daemon.child.kill('SIGKILL');
    await exitOf(daemon);
    daemon = start(['daemon'], 'daemon3');
    await waitFor(async () => (await committed()).some((r) => r.n === LAST), {
      timeoutMs: 150_000,
      what: `the ring's last event (log: ${daemon.logPath})`,
    });

    const all = await committed();
    const ns = all.map((r) => r.n).sort((a, b) => a - b);
    expect(ns).toEqual(Array.from({ length: LAST + 1 }, (_, i) => i));
    for (const [i, actor] of actors.entries()) {
      expect(
        all.filter((r) => r.actor === actor).map((r) => r.n),
        actor,
      ).toEqual(ns.filter((n) => n % actors.length === i));
    }
    for (const schema of new Set(actors.map(schemaOf))) {
      expect((await c.query(`select count(*)::int as n from ${schema}.shard_emits`)).rows[0].n, schema).toBe(0);
    }
  });
});
