/**
 * The stream relay on a real daemon and socket (src/runtime/stream-relay.ts): a turn that only
 * streams keeps its lease (R4: a relayed chunk counts as progress), chunks of another delivery or
 * from another worker are dropped (R1), a repeated seq is dropped (R2), and the last chunks before
 * a result are stored before its commit (R7).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import pg from 'pg';
import { sql } from '../../src/db/orm.ts';
import { parseChunkNotice, streamChannelOf } from '../../src/db/live/chunks.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { RawPeer, type Msg } from '../helpers/raw-peer.ts';
import { waitFor } from '../helpers/wait.ts';
import { sendEvent } from '../helpers/send.ts';

type Ref = Record<string, unknown> & { event_id: string; delivery_id: string };

let t: TestDaemon;
let worker: RawPeer;
let other: RawPeer;
const db = () => t.daemon.database.db;

async function startTurn(session: string): Promise<Ref> {
  const { eventId } = await sendEvent(db(), actorKey('relay', session), { text: 'hi' });
  const start: Msg = await worker.next('turn_start', (m) => (m.turn_ref as Ref).event_id === eventId);
  const ref = start.turn_ref as Ref;
  await worker.send({ type: 'turn_accepted', turn_ref: ref });
  return ref;
}

const chunk = (ref: Ref, seq: number, data: unknown = { delta: `w${seq} ` }) => ({ type: 'turn_chunk', turn_ref: ref, seq, data });

/** The seqs stored for `actor`, as its stream channel announces them (S2): heard even after the chunks are deleted. */
async function heardSeqs(actor: string): Promise<{ seqs: number[]; close(): Promise<void> }> {
  const c = new pg.Client({ connectionString: t.db.url });
  await c.connect();
  const channel = streamChannelOf(actor);
  const seqs: number[] = [];
  c.on('notification', (n) => {
    const notice = n.channel === channel ? parseChunkNotice(n.payload ?? '') : undefined;
    if (notice && `${notice.agentUid}/${notice.sessionId}` === actor) seqs.push(notice.seq);
  });
  await c.query(`listen ${channel}`);
  await c.query(`insert into corral.turn_watchers (channel, pid) values ($1, pg_backend_pid())`, [channel]);
  return { seqs, close: () => c.end() };
}

async function turnStatus(eventId: string): Promise<string[]> {
  const r = await db().execute<{ status: string }>(sql`select status from corral.turns where event_id = ${eventId} order by started_at`);
  return r.rows.map((x) => x.status);
}

beforeAll(async () => {
  t = await startTestDaemon({ leaseMs: 1_500, progressIntervalMs: 300, watchdogIntervalMs: 100 });
  worker = new RawPeer(t.daemon.broker.endpoint, 'relay-1');
  await worker.register(4);
  other = new RawPeer(t.daemon.broker.endpoint, 'relay-2');
  await other.register(4);
});

afterAll(async () => {
  await worker?.close();
  await other?.close();
  await t?.stop();
});

describe('stream relay', () => {
  it('a turn that only streams keeps its lease past several lease lengths, and commits', async () => {
    // both peers are registered; make sure the turn lands on `worker`
    await other.close();
    const ref = await startTurn('lease');
    for (let seq = 1; seq <= 25; seq++) {
      await worker.send(chunk(ref, seq));
      await new Promise((r) => setTimeout(r, 200));
    }
    // 5 s of chunks and no turn_progress, with a 1.5 s lease: still the same live attempt
    expect(await turnStatus(ref.event_id)).toEqual(['started']);
    await worker.send({ type: 'turn_result', turn_ref: ref, messages: [{ role: 'assistant', content: 'done' }] });
    await worker.next('turn_committed', (m) => (m.turn_ref as Ref).delivery_id === ref.delivery_id);
    expect(await turnStatus(ref.event_id)).toEqual(['succeeded']);
  }, 30_000);

  it('drops chunks of another delivery, from another worker, or with a repeated seq; stores the last ones before the commit', async () => {
    const heard = await heardSeqs('relay/drops');
    const ref = await startTurn('drops');
    const intruder = new RawPeer(t.daemon.broker.endpoint, 'relay-3');
    try {
      await intruder.register(1);
      await worker.send(chunk(ref, 1));
      await worker.send(chunk(ref, 1, 'again'));
      await worker.send(chunk({ ...ref, delivery_id: '00000000-0000-4000-8000-000000000000' }, 2));
      await intruder.send(chunk(ref, 3));
      await worker.send(chunk(ref, 4));
      await waitFor(() => heard.seqs.length >= 2, { what: 'the first chunks stored' });
      // the result right behind the last chunks, whose insert is held up (a lock on the table):
      // the commit waits for them, else it would end the delivery first and their insert store nothing
      const locker = new pg.Client({ connectionString: t.db.url });
      await locker.connect();
      try {
        await locker.query('begin');
        await locker.query('lock table corral.stream_chunks in share row exclusive mode');
        for (let seq = 5; seq <= 9; seq++) await worker.send(chunk(ref, seq));
        await worker.send({ type: 'turn_result', turn_ref: ref, messages: [{ role: 'assistant', content: 'done' }] });
        await new Promise((r) => setTimeout(r, 700));
        expect(
          worker.inbox.some((m) => m.type === 'turn_committed'),
          'committed before its chunks were stored',
        ).toBe(false);
        await locker.query('commit');
      } finally {
        await locker.end();
      }
      await worker.next('turn_committed', (m) => (m.turn_ref as Ref).delivery_id === ref.delivery_id);
      await waitFor(() => heard.seqs.length >= 7, { what: 'every chunk stored', timeoutMs: 5_000 }).catch(() => undefined);
      expect(heard.seqs).toEqual([1, 4, 5, 6, 7, 8, 9]);
    } finally {
      await intruder.close();
      await heard.close();
    }
  }, 30_000);
});
