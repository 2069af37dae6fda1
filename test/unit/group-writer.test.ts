/** The group writer's batching rules (src/runtime/group-writer.ts), with in-memory transactions. */
import { describe, expect, it } from 'vitest';
import { GroupWriter, type Settlement } from '../../src/runtime/group-writer.ts';

/** A writer whose transactions wait until released, recording every call. */
function recordingWriter(opts: { poison?: number; connectionLost?: boolean } = {}) {
  const calls: { kind: 'many' | 'one'; requests: number[] }[] = [];
  let release: () => void = () => undefined;
  let gate = new Promise<void>((r) => (release = r));
  const writer = new GroupWriter<number, number>({
    many: async (requests) => {
      calls.push({ kind: 'many', requests: [...requests] });
      await gate;
      if (opts.connectionLost) throw Object.assign(new Error('connection terminated'), { code: 'ECONNRESET' });
      if (opts.poison !== undefined && requests.includes(opts.poison)) throw new Error('poison');
      return requests.map((n): Settlement<number> => (n < 0 ? { ok: false, error: new Error(`bad ${n}`) } : { ok: true, value: n * 10 }));
    },
    one: async (n) => {
      calls.push({ kind: 'one', requests: [n] });
      await gate;
      if (n === opts.poison) throw new Error('poison');
      return n * 10;
    },
  });
  return {
    writer,
    calls,
    open: () => {
      release();
      gate = Promise.resolve();
    },
  };
}

describe('GroupWriter', () => {
  it('writes a lone request at once on the single path, and groups what arrives meanwhile', async () => {
    const { writer, calls, open } = recordingWriter();
    const first = writer.submit(1);
    const rest = [2, 3, -4, 5].map((n) =>
      writer.submit(n).then(
        (v) => ({ v }),
        (e: Error) => ({ e: e.message }),
      ),
    );
    expect(writer.pending).toBe(4);
    open();
    expect(await first).toBe(10);
    expect(await Promise.all(rest)).toEqual([{ v: 20 }, { v: 30 }, { e: 'bad -4' }, { v: 50 }]);
    expect(calls).toEqual([
      { kind: 'one', requests: [1] },
      { kind: 'many', requests: [2, 3, -4, 5] },
    ]);
  });

  it('applies the members of a failed batch one by one, so only the poison fails', async () => {
    const { writer, calls, open } = recordingWriter({ poison: 3 });
    const first = writer.submit(1);
    const rest = [2, 3, 4].map((n) =>
      writer.submit(n).then(
        (v) => ({ v }),
        (e: Error) => ({ e: e.message }),
      ),
    );
    open();
    await first;
    expect(await Promise.all(rest)).toEqual([{ v: 20 }, { e: 'poison' }, { v: 40 }]);
    expect(calls.map((c) => c.kind)).toEqual(['one', 'many', 'one', 'one', 'one']);
  });

  it('fails every member with a lost connection, for the callers to retry', async () => {
    const { writer, calls, open } = recordingWriter({ connectionLost: true });
    const first = writer.submit(1);
    const rest = [2, 3].map((n) =>
      writer.submit(n).then(
        () => 'ok',
        (e: Error) => e.message,
      ),
    );
    open();
    await first;
    expect(await Promise.all(rest)).toEqual(['connection terminated', 'connection terminated']);
    expect(calls.map((c) => c.kind)).toEqual(['one', 'many']);
  });
});
