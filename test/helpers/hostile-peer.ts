/**
 * Helpers for tests that drive a worker by hand with hostile or poison messages (test/security):
 * frames built as text (a value nested thousands deep cannot go through JSON.stringify), a loop
 * that answers each turn_start with a scripted sequence, and precise waits for answers.
 */
import type { TestDaemon } from './daemon.ts';
import type { Msg, RawPeer } from './raw-peer.ts';
import { waitFor } from './wait.ts';

export type Ref = Record<string, unknown> & { event_id: string; delivery_id: string };

/** JSON text of `inner` inside `n` arrays. */
export const deepText = (n: number, inner = '0') => '['.repeat(n) + inner + ']'.repeat(n);

/** A `turn_result` frame whose fields after `turn_ref` are the JSON text `body`. */
export function resultFrame(ref: unknown, body: string): string {
  return `{"v":1,"type":"turn_result","turn_ref":${JSON.stringify(ref)},${body}}`;
}

/** The ways to put a deep value in a result. */
export const DEEP_BODIES = {
  content: (d: string) => `"messages":[{"role":"assistant","content":${d}}]`,
  output: (d: string) => `"messages":[],"output":${d}`,
  emit: (d: string) => `"messages":[],"emit":[{"actor":"target/t","data":${d}}]`,
};

export const validResult = (ref: unknown, text = 'ok') => ({
  type: 'turn_result',
  turn_ref: ref,
  messages: [{ role: 'assistant', content: { text } }],
});

/**
 * The first message of `type` about `deliveryId` in the peer's inbox, taken out of it; polled
 * every millisecond, so the time it returns at is within about a millisecond of its arrival.
 */
export function answerFor(peer: RawPeer, deliveryId: string, types: readonly string[], timeoutMs = 10_000): Promise<Msg> {
  return waitFor(
    () => {
      const i = peer.inbox.findIndex((m) => types.includes(m.type) && (m.turn_ref as Ref | undefined)?.delivery_id === deliveryId);
      return i >= 0 ? peer.inbox.splice(i, 1)[0] : undefined;
    },
    { timeoutMs, intervalMs: 1, what: `${types.join(' | ')} for delivery ${deliveryId}` },
  );
}

/** Calls `onStart` for every turn_start the peer receives (taking it from the inbox) until stopped. */
export function respondToTurns(peer: RawPeer, onStart: (m: Msg) => Promise<void>): { stop(): Promise<void>; errors: unknown[] } {
  let stopped = false;
  const running = new Set<Promise<void>>();
  const errors: unknown[] = [];
  const loop = (async () => {
    while (!stopped) {
      for (let i = peer.inbox.findIndex((m) => m.type === 'turn_start'); i >= 0; i = peer.inbox.findIndex((m) => m.type === 'turn_start')) {
        const p = onStart(peer.inbox.splice(i, 1)[0]!).catch((e: unknown) => void errors.push(e));
        running.add(p);
        void p.finally(() => running.delete(p));
      }
      // the polling interval of the loop, not a wait for something to happen
      await new Promise((r) => setTimeout(r, 2));
    }
  })();
  return {
    errors,
    async stop() {
      stopped = true;
      await loop;
      await Promise.allSettled([...running]);
    },
  };
}

/** How many deliveries given to `workerId` are live (`created`, `sent`, `accepted`) in the database. */
export async function liveDeliveries(t: TestDaemon, workerId: string): Promise<number> {
  const r = await t.daemon.database.pool.query<{ n: number }>(
    `select count(*)::int as n from corral.deliveries where worker_id = $1 and state in ('created', 'sent', 'accepted')`,
    [workerId],
  );
  return r.rows[0]!.n;
}

/**
 * Samples, every few milliseconds until stopped, the worker's live deliveries in the database and
 * the daemon's turns in flight and finishing turns of the worker; keeps the maxima.
 */
export function sampleHolding(
  t: TestDaemon,
  workerId: string,
): { stop(): Promise<{ live: number; inFlight: number; finishing: number; samples: number }> } {
  let stopped = false;
  const max = { live: 0, inFlight: 0, finishing: 0, samples: 0 };
  const loop = (async () => {
    while (!stopped) {
      const { dispatcher } = t.daemon.runtime;
      max.inFlight = Math.max(max.inFlight, dispatcher.inFlightCount());
      max.finishing = Math.max(max.finishing, dispatcher.finishingOf(workerId));
      max.live = Math.max(max.live, await liveDeliveries(t, workerId));
      max.samples++;
      await new Promise((r) => setTimeout(r, 3));
    }
  })();
  return {
    async stop() {
      stopped = true;
      await loop;
      return max;
    },
  };
}
