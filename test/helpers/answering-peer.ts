/** A raw worker (test/helpers/raw-peer.ts) that accepts and answers every turn at once, until stopped. */
import type { Msg, RawPeer } from './raw-peer.ts';

export interface Answering {
  /** Stops answering; resolves once the loop ended. */
  stop(): Promise<void>;
}

/** Answers every `turn_start` with `turn_accepted`, then a result with what `emitOf` says to emit. */
export function answerEveryTurn(w: RawPeer, emitOf: (m: Msg) => unknown[] | undefined = () => undefined): Answering {
  let done = false;
  const loop = (async () => {
    while (!done) {
      let s: Msg;
      try {
        s = await w.next('turn_start', () => true, 500);
      } catch {
        continue;
      }
      await w.send({ type: 'turn_accepted', turn_ref: s.turn_ref });
      const emit = emitOf(s);
      await w.send({
        type: 'turn_result',
        turn_ref: s.turn_ref,
        messages: [{ role: 'assistant', content: `ok ${JSON.stringify((s.event as { data?: unknown }).data ?? null)}` }],
        ...(emit ? { emit } : {}),
      });
    }
  })();
  return {
    async stop() {
      done = true;
      await loop;
    },
  };
}
