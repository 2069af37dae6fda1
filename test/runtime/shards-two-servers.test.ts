/**
 * Two shards on two PostgreSQL servers (docs/scaling.md, "Shards"): the catalog and shard 0 on the
 * test server, shard 1 on an embedded server of its own, moved there with `corral shards set-url`
 * and set up by a second `migrateShards`. One daemon serves both; a ring of emits passes between
 * actors of the two servers, and shard 1's server is stopped and started again in the middle of
 * it: every event commits once, each actor's in ring order. A client connected to the catalog
 * sends to shard 1's actors on the second server.
 */
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { shardOf } from '../../src/base/shard-map.ts';
import { loadConfig } from '../../src/config.ts';
import { connect } from '../../src/client/client.ts';
import { ensureEmbeddedPostgres, stopEmbeddedPostgres } from '../../src/db/postgres/embedded.ts';
import { migrateShards, setShardUrl } from '../../src/ops/shards.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { RawPeer } from '../helpers/raw-peer.ts';
import { answerEveryTurn, type Answering } from '../helpers/answering-peer.ts';
import { sleep, waitFor } from '../helpers/wait.ts';

const LAST = 119;

describe('2 shards on two PostgreSQL servers', { timeout: 180_000 }, () => {
  const catalog = useTestDatabase();
  let home: string | undefined;
  let second: pg.Client | undefined;
  let t: TestDaemon<typeof catalog> | undefined;
  let w: RawPeer | undefined;
  let worker: Answering | undefined;

  beforeAll(async () => {
    home = await mkdtemp(join(tmpdir(), 'corral-shard-server-'));
    // the server runs as the postgres user when the tests run as root: it must reach the folder
    await chmod(home, 0o755);
  });

  afterAll(async () => {
    await worker?.stop();
    await w?.close();
    await t?.stop();
    await second?.end().catch(() => undefined);
    if (home) {
      await stopEmbeddedPostgres(home).catch(() => undefined);
      await rm(home, { recursive: true, force: true });
    }
  });

  it('serves both, passes a ring of emits between them through a restart of one, each event once and in order', async () => {
    const server = await ensureEmbeddedPostgres({ homeDir: home!, ephemeral: true });
    const config = loadConfig({}, {});
    await migrateShards(catalog.url, 2, config);
    await setShardUrl(catalog.url, 1, server.url);
    await migrateShards(catalog.url, 2, config);
    // the first set-up's copy of shard 1 on the catalog's server is gone: nothing may use it
    await catalog.client.query('drop schema corral_s1 cascade; drop schema pgboss_s1 cascade');
    second = new pg.Client({ connectionString: server.url });
    await second.connect();
    expect((await second.query('select shard, shard_count from corral_s1.shard_identity')).rows).toEqual([{ shard: 1, shard_count: 2 }]);

    t = await startTestDaemon({ drainMs: 0, retryDelaySeconds: 1, retryDelayMaxSeconds: 2 }, { db: catalog });
    w = new RawPeer(t.daemon.broker.endpoint, 'two-servers-w1');
    await w.register(8);
    worker = answerEveryTurn(w, (m) => {
      const ring = (m.event as { data?: { ring?: { actors: string[]; n: number; last: number } } }).data?.ring;
      if (!ring || ring.n >= ring.last) return undefined;
      return [{ actor: ring.actors[(ring.n + 1) % ring.actors.length]!, data: { ring: { ...ring, n: ring.n + 1 } } }];
    });

    // 4 actors, alternating between the two servers
    const byShard: string[][] = [[], []];
    for (let i = 0; byShard.some((l) => l.length < 2); i++) {
      const l = byShard[shardOf(actorKey('two', `t-${i}`), 2)]!;
      if (l.length < 2) l.push(`two/t-${i}`);
    }
    const actors = [byShard[0]![0]!, byShard[1]![0]!, byShard[0]![1]!, byShard[1]![1]!];
    const corral = await connect({ databaseUrl: catalog.url, env: {} });
    try {
      const firstOnTwo = await corral.send(actors[1]!, { hello: 'server 2' });
      expect((await second.query('select 1 from pgboss_s1.job where id = $1', [firstOnTwo.eventId])).rowCount).toBe(1);
      await corral.waitForTurn(firstOnTwo.eventId, { timeoutMs: 30_000 });
      await corral.send(actors[0]!, { ring: { actors, n: 0, last: LAST } });
    } finally {
      await corral.close();
    }

    const committed = async () => {
      const out: { actor: string; n: number }[] = [];
      const query = `select cv.session_id, (t.input -> 'ring' ->> 'n')::int as n
                       from %s.turns t join %s.conversations cv on cv.id = t.conversation_id
                      where cv.agent_uid = 'two' and t.status = 'succeeded' and t.input ? 'ring' order by t.finished_at, t.event_id`;
      for (const [c, schema] of [
        [catalog.client, 'corral'],
        [second!, 'corral_s1'],
      ] as const) {
        const r = await c.query<{ session_id: string; n: number }>(query.replaceAll('%s', schema));
        out.push(...r.rows.map((row) => ({ actor: `two/${row.session_id}`, n: row.n })));
      }
      return out;
    };

    await waitFor(async () => (await committed()).length >= 30, { timeoutMs: 60_000, what: '30 events of the ring' });
    await second.end();
    expect(await stopEmbeddedPostgres(home!)).toBe(true);
    await sleep(1_500);
    await ensureEmbeddedPostgres({ homeDir: home!, ephemeral: true });
    second = new pg.Client({ connectionString: server.url });
    await second.connect();

    await waitFor(async () => (await committed()).some((r) => r.n === LAST), { timeoutMs: 120_000, what: 'the ring’s last event' });
    const all = await committed();
    const ns = all.map((r) => r.n).sort((a, b) => a - b);
    expect(ns).toEqual(Array.from({ length: LAST + 1 }, (_, i) => i));
    for (const [i, actor] of actors.entries()) {
      expect(
        all.filter((r) => r.actor === actor).map((r) => r.n),
        actor,
      ).toEqual(ns.filter((n) => n % actors.length === i));
    }
    expect((await catalog.client.query('select count(*)::int as n from corral.shard_emits')).rows[0].n).toBe(0);
    expect((await second.query('select count(*)::int as n from corral_s1.shard_emits')).rows[0].n).toBe(0);
  });
});
