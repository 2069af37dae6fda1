/**
 * The relay's bounds on a real daemon process (R3 of src/runtime/stream-relay.ts), with an SSE
 * client of every flooded actor that never reads what it is sent: a worker that
 * streams without limit, 8 turns at once, ~3 GB of chunk frames in all, leaves the daemon's
 * memory bounded: its RSS grows by less than 350 MB (measured here: 270–280 MB, the same for 1 GB
 * as for 3 GB: what parsing the frames churns, not what they carry), while what it relays per attempt stops at
 * CORRAL_STREAM_TURN_BYTES and frames over CORRAL_STREAM_CHUNK_BYTES are dropped. The turns still
 * commit, and the chunks of every attempt are gone once it ended.
 */
import { readFileSync } from 'node:fs';
import { afterAll, describe, expect, it } from 'vitest';
import { createToken } from '../../src/ops/api-tokens.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { descendants, fastRecoveryEnv, freePort, killAll, spawnCorral, stopGracefully, type Proc } from '../helpers/processes.ts';
import { RawPeer, type Msg } from '../helpers/raw-peer.ts';
import { waitFor } from '../helpers/wait.ts';

const MB = 1024 * 1024;
/** The bound this test states: the daemon's RSS grows by less than this under the flood. */
const RSS_GROWTH_BOUND = 350 * MB;
const TURNS = 8;
const CHUNKS_PER_TURN = 6_000;
const CHUNK_DATA = 'x'.repeat(60 * 1024);

/** RSS of `pid` and its descendants, bytes. */
function treeRss(pid: number): number {
  let kb = 0;
  for (const p of [pid, ...descendants(pid)]) {
    try {
      const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${p}/status`, 'utf8'));
      kb += m ? Number(m[1]) : 0;
    } catch {
      // exited meanwhile
    }
  }
  return kb * 1024;
}

describe('a worker streaming without limit', () => {
  const tdb = useTestDatabase();
  let daemon: Proc | undefined;
  let peer: RawPeer | undefined;

  afterAll(async () => {
    await peer?.close();
    await stopGracefully(daemon);
    killAll();
  });

  it('leaves the daemon RSS bounded, relays at most the per-attempt bytes, and the turns commit', async () => {
    const endpoint = `tcp://127.0.0.1:${await freePort()}`;
    const httpPort = await freePort();
    daemon = spawnCorral(
      ['daemon', '--http-port', String(httpPort)],
      { ...fastRecoveryEnv(tdb.url, endpoint), CORRAL_LEASE_MS: '30000' },
      'daemon',
    );
    const c = tdb.client;
    peer = new RawPeer(endpoint, `flood-${Date.now()}`, undefined, 'flood');
    const p = peer;
    await waitFor(
      async () => {
        await p.send({ type: 'worker_ready', worker_id: 'flood', capacity: TURNS });
        return p.next('worker_welcome', () => true, 1_000).catch(() => undefined);
      },
      { timeoutMs: 30_000, what: `registered (log: ${daemon.logPath})` },
    );
    await c.query(`select corral.send_events($1::jsonb)`, [
      JSON.stringify(Array.from({ length: TURNS }, (_, i) => ({ agent_uid: 'flood', session_id: `s${i}`, data: { text: `t${i}` } }))),
    ]);
    const starts: Msg[] = [];
    // accepted at once: a worker is given more turns as it accepts them (CORRAL_WORKER_INITIAL_TURNS)
    for (let i = 0; i < TURNS; i++) {
      const s = await p.next('turn_start', () => true, 30_000);
      await p.send({ type: 'turn_accepted', turn_ref: s.turn_ref });
      starts.push(s);
    }
    // readers that never read: each SSE response is left unconsumed
    const { token } = await createToken(tdb.database.db, 'never-reads', ['read']);
    const stalled = new AbortController();
    const unread = await Promise.all(
      starts.map((_, i) =>
        fetch(`http://127.0.0.1:${httpPort}/v1/actors/flood/s${i}/stream`, {
          headers: { authorization: `Bearer ${token}` },
          signal: stalled.signal,
        }),
      ),
    );
    for (const r of unread) expect(r.status).toBe(200);
    const baseline = treeRss(daemon.child.pid!);
    let peak = baseline;
    const sampler = setInterval(() => (peak = Math.max(peak, treeRss(daemon!.child.pid!))), 100);
    try {
      // every turn at once, without pause: ~360 MB of frames per turn, and one frame over the chunk limit
      await Promise.all(
        starts.map(async (s) => {
          await p.send({ type: 'turn_chunk', turn_ref: s.turn_ref, seq: 1, data: 'y'.repeat(70 * 1024) });
          for (let seq = 2; seq <= CHUNKS_PER_TURN; seq++)
            await p.send({ type: 'turn_chunk', turn_ref: s.turn_ref, seq, data: CHUNK_DATA });
        }),
      );
      // what was stored per attempt stops at the per-attempt bytes (8 MiB by default)
      await waitFor(
        async () => {
          const { rows } = await c.query<{ n: number }>(`select count(distinct delivery_id)::int as n from corral.stream_chunks`);
          return rows[0]!.n === TURNS;
        },
        { timeoutMs: 30_000, what: 'chunks stored for every turn' },
      );
      const { rows } = await c.query<{ delivery_id: string; n: number; min_seq: number; bytes: string }>(
        `select delivery_id, count(*)::int as n, min(seq) as min_seq, sum(octet_length(data::text))::bigint as bytes
           from corral.stream_chunks group by delivery_id`,
      );
      for (const r of rows) {
        expect(r.min_seq, 'the frame over the chunk limit was dropped').toBe(2);
        expect(Number(r.bytes)).toBeLessThanOrEqual(8 * MB);
        expect(r.n).toBeLessThan(CHUNKS_PER_TURN / 10);
      }
    } finally {
      clearInterval(sampler);
      stalled.abort();
    }
    expect(peak - baseline, `RSS ${Math.round(baseline / MB)} → peak ${Math.round(peak / MB)} MB`).toBeLessThan(RSS_GROWTH_BOUND);
    // the turns still commit, and their chunks go with them
    for (const s of starts) await p.send({ type: 'turn_result', turn_ref: s.turn_ref, messages: [{ role: 'assistant', content: 'done' }] });
    await waitFor(async () => (await c.query(`select 1 from corral.turns where status = 'succeeded'`)).rowCount === TURNS, {
      timeoutMs: 30_000,
      what: 'every turn committed',
    });
    await waitFor(async () => (await c.query(`select 1 from corral.stream_chunks limit 1`)).rowCount === 0, {
      timeoutMs: 20_000,
      what: 'the ended turns’ chunks deleted',
    });
  }, 180_000);
});
