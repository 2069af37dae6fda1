/**
 * Results bounded before they cost anything, against a real daemon (real sockets, real
 * PostgreSQL, hand-driven workers that send whatever they like). The lease is a minute and the
 * watchdog does not run, so nothing here is settled by a lease or the maximum turn time. Stated
 * bounds, each measured on the worker's side from the send to the answer:
 *  - a result nested 10,000 deep (a message's content, the output, an emit's data) is refused
 *    at once (within a second), its attempt already failed, and the turn comes back as attempt 2;
 *  - `rpc_request.params` nested 10,000 deep are answered `invalid_params` at once (within a second);
 *  - a commit PostgreSQL refuses (a trigger that raises) is answered `turn_rejected{commit_failed}`
 *    within 1 s, its attempt failed, and the turn comes back;
 *  - whatever a worker sends (poison results, duplicates, forged deliveries, results then
 *    errors, errors too deep to parse, failing commits), it never has more than `capacity` turns
 *    in flight while its results are refused, nor more than twice `capacity` live deliveries (in
 *    `corral.deliveries`) and in-flight turns otherwise, nor more than `capacity` finishing turns.
 */
import { randomUUID } from 'node:crypto';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import {
  DEEP_BODIES,
  answerFor,
  deepText,
  liveDeliveries,
  resultFrame,
  respondToTurns,
  sampleHolding,
  validResult,
  type Ref,
} from '../helpers/hostile-peer.ts';
import { RawPeer, type Msg } from '../helpers/raw-peer.ts';
import { waitFor } from '../helpers/wait.ts';
import { sendEvent, sendMany } from '../helpers/send.ts';

/**
 * A refusal comes at once, from the send to the answer: this bound tells "refused on arrival" from
 * "failed at the lease" (60 s) with room for a loaded machine; what a deep frame costs to judge is
 * a matter for a benchmark, not a timed test.
 */
const REFUSED_WITHIN_MS = 1_000;
const DEEP = 10_000;

describe('results bounded before they cost anything', () => {
  let t: TestDaemon;
  const peers: RawPeer[] = [];

  // a daemon per test, so that each test's worker is the only one
  beforeEach(async () => {
    t = await startTestDaemon({ leaseMs: 60_000, retryLimit: 2, retryDelaySeconds: 1, retryDelayMaxSeconds: 1, drainMs: 0 });
    // a commit PostgreSQL refuses: a message whose content has the key "explode"
    await t.daemon.database.pool.query(`
      create function corral_test_explode() returns trigger language plpgsql as $$
      begin
        if jsonb_typeof(new.content) = 'object' and new.content ? 'explode' then
          raise exception 'refused by the test trigger';
        end if;
        return new;
      end $$;
      create trigger corral_test_explode before insert on corral.messages
        for each row execute function corral_test_explode();`);
  });

  afterEach(async () => {
    await Promise.all(peers.splice(0).map((p) => p.close()));
    await t?.stop();
  });

  async function worker(id: string, capacity: number): Promise<RawPeer> {
    const p = new RawPeer(t.daemon.broker.endpoint, id);
    peers.push(p);
    await p.register(capacity);
    return p;
  }

  const enqueue = (agent: string, session: string, data: unknown = { session }) =>
    sendEvent(t.daemon.database.db, actorKey(agent, session), data);
  const startOf = (eventId: string, attempt?: number) => (m: Msg) =>
    (m.turn_ref as Ref).event_id === eventId && (attempt === undefined || m.attempt === attempt);

  async function turnRow(deliveryId: string): Promise<{ status: string; error: { code: string } | null; state: string }> {
    const r = await t.daemon.database.pool.query<{ status: string; error: { code: string } | null; state: string }>(
      `select t.status, t.error, d.state from corral.turns t join corral.deliveries d using (delivery_id) where t.delivery_id = $1`,
      [deliveryId],
    );
    return r.rows[0]!;
  }

  it('refuses a result nested 10,000 deep at once (within a second), with its attempt failed, and retries the turn', async () => {
    const w = await worker('deep-w', 1);
    const cases = [
      ['content', 'unstorable', 'unstorable_result'],
      ['output', 'unstorable', 'unstorable_result'],
      ['emit', 'emit_limit', 'emit_limit'],
    ] as const;
    for (const [where, reason, code] of cases) {
      const { eventId } = await enqueue('deep', where);
      const start = await w.next('turn_start', startOf(eventId, 1));
      const ref = start.turn_ref as Ref;
      const sent = performance.now();
      await w.sendRaw(resultFrame(ref, DEEP_BODIES[where](deepText(DEEP))));
      const answer = await answerFor(w, ref.delivery_id, ['turn_rejected', 'turn_committed', 'turn_failed']);
      const ms = performance.now() - sent;
      expect(answer, where).toMatchObject({
        type: 'turn_rejected',
        reason,
        detail: expect.stringMatching(/nested deeper than 100 levels/),
      });
      expect(ms, `${where}: answered after ${ms.toFixed(1)} ms`).toBeLessThan(REFUSED_WITHIN_MS);
      // the attempt failed before the answer went out: nothing of the turn is live
      expect(await turnRow(ref.delivery_id)).toMatchObject({ status: 'failed', error: { code }, state: 'failed' });
      expect(await liveDeliveries(t, 'deep-w')).toBe(0);
      // retried: the same event again, as attempt 2, which commits
      const again = await w.next('turn_start', startOf(eventId, 2), 10_000);
      await w.send(validResult(again.turn_ref));
      await answerFor(w, (again.turn_ref as Ref).delivery_id, ['turn_committed']);
    }
  });

  it('answers rpc params nested 10,000 deep with invalid_params at once (within a second)', async () => {
    const w = await worker('rpc-w', 1);
    const { eventId } = await enqueue('deep', 'rpc');
    const start = await w.next('turn_start', startOf(eventId));
    const sent = performance.now();
    await w.sendRaw(
      `{"v":1,"type":"rpc_request","id":"r-deep","method":"history.read","turn_ref":${JSON.stringify(start.turn_ref)},"params":${deepText(DEEP)}}`,
    );
    const answer = await waitFor(() => w.inbox.find((m) => m.type === 'rpc_response' && m.id === 'r-deep'), {
      intervalMs: 1,
      timeoutMs: 5_000,
    });
    const ms = performance.now() - sent;
    expect(answer.error).toMatchObject({ code: 'invalid_params', message: expect.stringMatching(/nested deeper than 100 levels/) });
    expect(ms, `answered after ${ms.toFixed(1)} ms`).toBeLessThan(REFUSED_WITHIN_MS);
    await w.send(validResult(start.turn_ref));
    await answerFor(w, (start.turn_ref as Ref).delivery_id, ['turn_committed']);
  });

  it('answers a result whose commit fails with turn_rejected{commit_failed}, fails the attempt and retries the turn', async () => {
    const w = await worker('fail-w', 1);
    const { eventId } = await enqueue('explode', 'a');
    const start = await w.next('turn_start', startOf(eventId, 1));
    const ref = start.turn_ref as Ref;
    const sent = performance.now();
    await w.send({ type: 'turn_result', turn_ref: ref, messages: [{ role: 'assistant', content: { explode: true } }] });
    const answer = await answerFor(w, ref.delivery_id, ['turn_rejected', 'turn_committed']);
    const ms = performance.now() - sent;
    expect(answer).toMatchObject({ type: 'turn_rejected', reason: 'commit_failed', detail: expect.stringMatching(/test trigger/) });
    expect(ms, `answered after ${ms.toFixed(1)} ms`).toBeLessThan(1_000);
    expect(await turnRow(ref.delivery_id)).toMatchObject({ status: 'failed', error: { code: 'commit_failed' }, state: 'failed' });
    const again = await w.next('turn_start', startOf(eventId, 2), 10_000);
    await w.send(validResult(again.turn_ref));
    await answerFor(w, (again.turn_ref as Ref).delivery_id, ['turn_committed']);
    // the worker's slot is free again: one more turn reaches it
    const next = await enqueue('explode', 'b');
    await w.next('turn_start', startOf(next.eventId));
  });

  /** Each attempt 1 gets one of these; later attempts commit, unless `poisonAlways`. */
  const poison: Record<string, (w: RawPeer, ref: Ref) => Promise<void>> = {
    deepContent: (w, ref) => w.sendRaw(resultFrame(ref, DEEP_BODIES.content(deepText(DEEP)))),
    deepOutput: (w, ref) => w.sendRaw(resultFrame(ref, DEEP_BODIES.output(deepText(500_000)))),
    deepEmit: (w, ref) => w.sendRaw(resultFrame(ref, DEEP_BODIES.emit(deepText(DEEP)))),
    nul: (w, ref) => w.send({ type: 'turn_result', turn_ref: ref, messages: [{ role: 'assistant', content: 'a\u0000b' }] }),
    poisonThenValid: async (w, ref) => {
      await w.sendRaw(resultFrame(ref, DEEP_BODIES.content(deepText(DEEP))));
      await w.send(validResult(ref));
    },
    // an error too deep to parse (invalid_message, nothing happens), then a real one
    deepErrorThenError: async (w, ref) => {
      await w.sendRaw(
        `{"v":1,"type":"turn_error","turn_ref":${JSON.stringify(ref)},"error":{"code":"x","message":"m","retryable":true,"details":${deepText(DEEP)}}}`,
      );
      await w.send({ type: 'turn_error', turn_ref: ref, error: { code: 'boom', message: 'failed', retryable: true } });
    },
  };
  const mixed: Record<string, (w: RawPeer, ref: Ref) => Promise<void>> = {
    ...poison,
    duplicate: async (w, ref) => {
      await w.send(validResult(ref));
      await w.send(validResult(ref));
    },
    forgedThenReal: async (w, ref) => {
      await w.send(validResult({ ...ref, delivery_id: randomUUID() }));
      await w.send(validResult({ ...ref, activation_uid: randomUUID() }));
      await w.send(validResult(ref));
    },
    resultThenError: async (w, ref) => {
      await w.send(validResult(ref));
      await w.send({ type: 'turn_error', turn_ref: ref, error: { code: 'boom', message: 'late', retryable: true } });
    },
    resultThenProgress: async (w, ref) => {
      await w.send(validResult(ref));
      await w.send({ type: 'turn_progress', turn_ref: ref });
      await w.send(validResult(ref));
    },
    failingCommit: (w, ref) => w.send({ type: 'turn_result', turn_ref: ref, messages: [{ role: 'assistant', content: { explode: 1 } }] }),
    commitsAtOnce: (w, ref) => w.send(validResult(ref)),
  };

  async function drive(
    id: string,
    capacity: number,
    sequences: Record<string, (w: RawPeer, ref: Ref) => Promise<void>>,
    opts: { events: number; poisonAlways: boolean },
  ) {
    const w = await worker(id, capacity);
    const names = Object.keys(sequences);
    const sampler = sampleHolding(t, id);
    let n = 0;
    const responder = respondToTurns(w, async (m) => {
      const ref = m.turn_ref as Ref;
      if (m.attempt === 1 || opts.poisonAlways) await sequences[names[n++ % names.length]!]!(w, ref);
      else await w.send(validResult(ref));
    });
    const events = await sendMany(
      t.daemon.database.db,
      Array.from({ length: opts.events }, (_, i) => ({ key: actorKey(id, `s${i}`), event: { i } })),
    );
    // every event ends: committed, or dead-lettered after its last attempt (retryLimit 2)
    const ids = events.map((e) => e.eventId);
    await waitFor(
      async () => {
        const r = await t.daemon.database.pool.query<{ n: number }>(
          `select count(distinct event_id)::int as n from corral.turns
            where event_id = any($1::uuid[]) and (status = 'succeeded' or (status = 'failed' and attempt = 3))`,
          [ids],
        );
        return r.rows[0]!.n === ids.length;
      },
      { what: `every event of ${id} ended`, timeoutMs: 45_000, intervalMs: 50 },
    );
    await responder.stop();
    const max = await sampler.stop();
    expect(responder.errors).toEqual([]);
    expect(await liveDeliveries(t, id)).toBe(0);
    expect(t.daemon.runtime.dispatcher.finishingOf(id)).toBe(0);
    return { max, ids };
  }

  it('never gives a worker more than its capacity in turns while its results are refused or its turns fail', async () => {
    const capacity = 2;
    const { max } = await drive('poison-w', capacity, poison, { events: 12, poisonAlways: true });
    expect(max.samples).toBeGreaterThan(20);
    expect(max.live, 'live deliveries in corral.deliveries').toBeLessThanOrEqual(capacity);
    expect(max.inFlight, "turns in the daemon's slots").toBeLessThanOrEqual(capacity);
    expect(max.finishing).toBe(0);
  });

  it('never gives a worker more than twice its capacity in live deliveries, whatever it sends, and every turn ends', async () => {
    const capacity = 2;
    const { max, ids } = await drive('mixed-w', capacity, mixed, { events: 24, poisonAlways: false });
    expect(max.samples).toBeGreaterThan(20);
    expect(max.live, 'live deliveries in corral.deliveries').toBeLessThanOrEqual(2 * capacity);
    expect(max.inFlight, 'turns in flight in the daemon').toBeLessThanOrEqual(2 * capacity);
    expect(max.finishing, 'finishing turns').toBeLessThanOrEqual(capacity);
    // each event committed exactly once, on its first attempt or its retry
    const r = await t.daemon.database.pool.query<{ n: number }>(
      `select count(*)::int as n from corral.turns where event_id = any($1::uuid[]) and status = 'succeeded'`,
      [ids],
    );
    expect(r.rows[0]!.n).toBe(ids.length);
  });
});
