/**
 * A turn's stream budget on a real daemon process (R8 of src/runtime/stream-relay.ts,
 * docs/protocol.md §5.2): the welcome states it, the SDK's workers stop at it by themselves, and a
 * worker that does not count (another language, an older SDK) is told once, with
 * `turn_stream_closed`, when its first chunk past the budget is dropped; nothing past the budget
 * is stored, and the turn still commits.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { useTestDatabase } from '../helpers/db.ts';
import { fastRecoveryEnv, freePort, killAll, spawnCorral, stopGracefully, type Proc } from '../helpers/processes.ts';
import { RawPeer, type Msg } from '../helpers/raw-peer.ts';
import { waitFor } from '../helpers/wait.ts';

const BUDGET = 512 * 1024;
const CHUNK = 'x'.repeat(32 * 1024);

describe('a turn streaming past its budget', () => {
  const tdb = useTestDatabase();
  let daemon: Proc;
  let endpoint: string;
  const peers: RawPeer[] = [];

  beforeAll(async () => {
    endpoint = `tcp://127.0.0.1:${await freePort()}`;
    daemon = spawnCorral(
      ['daemon', '--workers', '1', '--worker-capacity', '1'],
      // a short drain: the turn that keeps the example worker busy is not waited for at the stop
      { ...fastRecoveryEnv(tdb.url, endpoint), CORRAL_LEASE_MS: '30000', CORRAL_STREAM_TURN_BYTES: String(BUDGET), CORRAL_DRAIN_MS: '0' },
      'daemon',
    );
    await waitFor(() => daemon.log().includes('"worker ready"'), {
      timeoutMs: 60_000,
      what: `the example worker (log: ${daemon.logPath})`,
    });
  }, 120_000);

  afterAll(async () => {
    for (const p of peers) await p.close();
    await stopGracefully(daemon, 20_000);
    killAll();
  });

  const send = (actor: string, data: unknown) =>
    tdb.client.query<{ id: string }>('select corral.send_event($1, $2, $3::jsonb) as id', [...actor.split('/'), JSON.stringify(data)]);
  const reply = async (actor: string) => {
    const { rows } = await tdb.client.query<{ content: { flood?: { chunks: number; bytes: number; stopped: boolean } } }>(
      `select m.content from corral.messages m join corral.conversations c on c.id = m.conversation_id
        where c.agent_uid = $1 and c.session_id = $2 and m.role = 'assistant'`,
      actor.split('/'),
    );
    return rows[0]?.content;
  };

  it('the welcome states the budget; an SDK worker stops at it by itself and the turn commits', async () => {
    await send('flood-sdk/s', { flood: { chunkBytes: CHUNK.length, ms: 10_000 } });
    const content = await waitFor(() => reply('flood-sdk/s'), { timeoutMs: 30_000, what: 'the flood turn to commit' });
    // stopped by the budget (not by its 10 s), having sent at most the budget
    expect(content.flood).toMatchObject({ stopped: true });
    expect(content.flood!.bytes).toBeLessThanOrEqual(BUDGET);
    expect(content.flood!.bytes + CHUNK.length + 1024).toBeGreaterThan(BUDGET);
    // nothing was dropped for the budget: the worker never sent past it
    expect(daemon.log()).not.toContain('stream budget spent');
  });

  it('a worker that does not count is told once when its first chunk past the budget is dropped, and nothing past it is kept', async () => {
    const peer = new RawPeer(endpoint, `uncounted-${Date.now()}`, undefined, 'uncounted');
    peers.push(peer);
    const welcome = await waitFor(
      async () => {
        await peer.send({ type: 'worker_ready', worker_id: 'uncounted', capacity: 4 });
        return peer.next('worker_welcome', () => true, 1_000).catch(() => undefined);
      },
      { timeoutMs: 30_000, what: 'registered' },
    );
    expect(welcome.stream_turn_bytes).toBe(BUDGET);
    // the example worker (capacity 1) is busy for a while, so the raw peer takes the next turn
    await send('flood-busy/s', { delayMs: 20_000 });
    await waitFor(() => daemon.log().split('"turn started"').length - 1 >= 2, { timeoutMs: 15_000, what: 'the example worker busy' });
    await send('flood-raw/s', { text: 'x' });
    const start = await peer.next('turn_start', () => true, 30_000);
    const ref = start.turn_ref as Msg;
    await peer.send({ type: 'turn_accepted', turn_ref: ref });
    // twice the budget, without pause: what an older worker does
    const chunks = Math.ceil((2 * BUDGET) / CHUNK.length);
    for (let seq = 1; seq <= chunks; seq++) await peer.send({ type: 'turn_chunk', turn_ref: ref, seq, data: CHUNK });
    const [closed] = await peer.waitFor('turn_stream_closed', 1, 15_000);
    expect(closed).toEqual({ v: 1, type: 'turn_stream_closed', turn_ref: ref, reason: 'turn_limit', limit_bytes: BUDGET });
    // the chunks within the budget are stored (a moment after they came), none past it
    const stored = async () =>
      (
        await tdb.client.query<{ n: number; bytes: string }>(
          `select count(*)::int as n, coalesce(sum(octet_length(data::text)), 0)::bigint as bytes from corral.stream_chunks where delivery_id = $1`,
          [ref.delivery_id],
        )
      ).rows[0]!;
    const kept = await waitFor(async () => ((await stored()).n > 0 ? stored() : undefined), {
      timeoutMs: 10_000,
      what: 'the chunks stored',
    });
    expect(Number(kept.bytes)).toBeLessThanOrEqual(BUDGET);
    // more chunks after the notice change nothing, and bring no second notice
    for (let seq = chunks + 1; seq <= chunks + 5; seq++) await peer.send({ type: 'turn_chunk', turn_ref: ref, seq, data: CHUNK });
    await peer.send({ type: 'turn_result', turn_ref: ref, messages: [{ role: 'assistant', content: 'done' }] });
    await peer.next('turn_committed', (m) => (m.turn_ref as Msg).delivery_id === ref.delivery_id, 15_000);
    expect(peer.ofType('turn_stream_closed')).toHaveLength(1);
    expect(daemon.log().split('stream budget spent').length - 1).toBe(1);
  });
});
