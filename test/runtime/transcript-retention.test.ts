/**
 * Transcript retention seen from a worker, on real PostgreSQL and a real ROUTER/DEALER pair: after
 * the start of a conversation is pruned, the next turn's context is the rest of it, without the
 * forgotten messages, although the daemon still holds them in its context cache (R4 of
 * src/db/operations/transcript-retention.ts, C1 of src/runtime/context-cache.ts), and the worker's RPC reads
 * and counts what is kept; a conversation pruned whole starts the next turn with an empty
 * context, numbered on; an agent without a policy is untouched.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { sql } from '../../src/db/orm.ts';
import { clearTranscriptRetention, pruneTranscripts, setTranscriptRetention } from '../../src/db/operations/transcript-retention.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { RawPeer, type Msg } from '../helpers/raw-peer.ts';
import { sendEvent } from '../helpers/send.ts';

type Ref = Record<string, unknown> & { event_id: string; delivery_id: string };
type Ctx = { messages: { seq: number; role: string; content: unknown }[]; first_seq?: number; current_seq: number };

describe('transcript retention and the turn context', () => {
  let t: TestDaemon;
  let w: RawPeer;
  const db = () => t.daemon.database.db;

  beforeAll(async () => {
    t = await startTestDaemon({ contextMessages: 50, contextBytes: 64 * 1024, drainMs: 0 });
    w = new RawPeer(t.daemon.broker.endpoint, 'retention-1');
    await w.register(2);
  });

  afterAll(async () => {
    await w.close();
    await t.stop();
  });

  async function turn(agent: string, session: string, text: string, during?: (s: Msg) => Promise<void>): Promise<Ctx> {
    const { eventId } = await sendEvent(db(), actorKey(agent, session), { text });
    const s: Msg = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === eventId);
    await during?.(s);
    await w.send({ type: 'turn_result', turn_ref: s.turn_ref, messages: [{ role: 'assistant', content: { text: `echo: ${text}` } }] });
    await w.next('turn_committed', (m) => (m.turn_ref as Ref).delivery_id === (s.turn_ref as Ref).delivery_id);
    return s.context as Ctx;
  }

  /** Moves the finish of `agent`/`session`'s turns whose input was `texts` two days back. */
  async function age(agent: string, session: string, texts: string[]): Promise<void> {
    await db().execute(sql`
      update corral.turns t set finished_at = now() - interval '2 days'
        from corral.conversations c
       where c.id = t.conversation_id and c.agent_uid = ${agent} and c.session_id = ${session}
         and t.input->>'text' = any(${sql.param(texts)}::text[])`);
  }

  const seqs = (c: Ctx) => c.messages.map((m) => m.seq);
  let rpcs = 0;
  async function rpc(s: Msg, method: string, params?: unknown): Promise<Record<string, unknown>> {
    const id = `r${++rpcs}`;
    await w.send({ type: 'rpc_request', id, method, ...(params === undefined ? {} : { params }), turn_ref: s.turn_ref });
    const r = await w.next('rpc_response', (m) => m.id === id);
    expect(r.error).toBeUndefined();
    return r.result as Record<string, unknown>;
  }

  it("a context after pruning holds only the kept turns, though the daemon's cache held the forgotten ones", async () => {
    await turn('ret', 's1', 'one');
    await turn('ret', 's1', 'two');
    await turn('other', 's1', 'one');
    const hits = t.daemon.runtime.contexts.stats.hits;
    expect(seqs(await turn('ret', 's1', 'three'))).toEqual([1, 2, 3, 4]);
    // that context came from the cache: without the check, the next one would too
    expect(t.daemon.runtime.contexts.stats.hits).toBe(hits + 1);

    await age('ret', 's1', ['one', 'two']);
    await age('other', 's1', ['one']);
    await setTranscriptRetention(db(), 'ret', 86_400);
    expect(await pruneTranscripts(db())).toBe(2 * 3);

    // the worker's RPC reads what is kept, and counts only that
    const after = await turn('ret', 's1', 'four', async (s) => {
      const page = await rpc(s, 'history.read', { limit: 10 });
      expect(page).toMatchObject({ total: 2, has_more: false });
      expect((page.messages as { seq: number }[]).map((m) => m.seq)).toEqual([5, 6]);
      expect(await rpc(s, 'history.read', { before_seq: 5 })).toMatchObject({ messages: [], has_more: false, total: 2 });
      expect(await rpc(s, 'actor.status')).toMatchObject({ messages: 2 });
    });
    expect(after.messages).toEqual([
      { seq: 5, role: 'user', content: { text: 'three' } },
      { seq: 6, role: 'assistant', content: { text: 'echo: three' } },
    ]);
    expect(after).toMatchObject({ first_seq: 5, current_seq: 7 });
    // and from there on the cache serves it again
    const hitsAfter = t.daemon.runtime.contexts.stats.hits;
    expect(seqs(await turn('ret', 's1', 'five'))).toEqual([5, 6, 7, 8]);
    expect(t.daemon.runtime.contexts.stats.hits).toBe(hitsAfter + 1);
    // the agent without a policy keeps everything
    expect(seqs(await turn('other', 's1', 'two'))).toEqual([1, 2]);
  });

  it('a conversation pruned whole begins its next turn with an empty context, numbered on', async () => {
    await turn('ret', 's2', 'one');
    await turn('ret', 's2', 'two');
    await age('ret', 's2', ['one', 'two']);
    expect(await pruneTranscripts(db())).toBe(2 * 3);
    const next = await turn('ret', 's2', 'three');
    expect(next.messages).toEqual([]);
    expect(next.current_seq).toBe(5);
    expect(seqs(await turn('ret', 's2', 'four'))).toEqual([5, 6]);
    await clearTranscriptRetention(db(), 'ret');
  });
});
