/**
 * The example worker (SDK) against a real daemon: it sees the conversation it continues, reads
 * it back through the worker RPC, and exercises durable effects and timers.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { actorKey, type ActorKey } from '../../src/base/actor-key.ts';
import { readTranscript, type TranscriptEntry } from '../../src/db/turns/transcript.ts';
import { runExampleWorker } from '../../src/worker/example.ts';
import type { Worker } from '../../src/worker/sdk.ts';
import { startTestDaemon, testLogger, type TestDaemon } from '../helpers/daemon.ts';
import { waitFor } from '../helpers/wait.ts';
import { sendEvent } from '../helpers/send.ts';

describe('example worker on a real daemon', () => {
  let t: TestDaemon;
  let worker: Worker;
  const db = () => t.daemon.database.db;

  beforeAll(async () => {
    t = await startTestDaemon({ drainMs: 0 });
    worker = await runExampleWorker({ endpoint: t.daemon.broker.endpoint, workerId: 'example-1', capacity: 2, logger: testLogger });
    await waitFor(() => worker.isRegistered(), { what: 'registration' });
  });

  afterAll(async () => {
    await worker.stop();
    await t.stop();
  });

  async function transcriptOf(key: ActorKey, turns: number): Promise<TranscriptEntry[]> {
    return waitFor(
      async () => {
        const tr = await readTranscript(db(), key);
        return tr.length >= turns ? tr : undefined;
      },
      { what: `${turns} turns of ${key.agentUid}/${key.sessionId}` },
    );
  }

  const reply = (e: TranscriptEntry) => e.messages.find((m) => m.role === 'assistant')!.content as Record<string, unknown>;

  it('says how many earlier messages it saw and reads the conversation back through history.read', async () => {
    const key = actorKey('ex', 'ctx');
    await sendEvent(db(), key, { text: 'one' });
    await transcriptOf(key, 1);
    await sendEvent(db(), key, { text: 'two', history: true });
    const tr = await transcriptOf(key, 2);
    expect(reply(tr[0]!)).toEqual({ text: 'echo: one' });
    expect(reply(tr[1]!)).toEqual({ text: 'echo: two', seen: 2, history_total: 2 });
  });

  it('emits an event to another actor with the commit, and a reminder to itself after its delay', async () => {
    const key = actorKey('ex', 'fx');
    const other = actorKey('ex', 'other');
    await sendEvent(db(), key, { text: 'hey', emit: { actor: 'ex/other', data: { text: 'from fx' } } });
    const otr = await transcriptOf(other, 1);
    expect(reply(otr[0]!).text).toBe('echo: from fx');
    await sendEvent(db(), key, { text: 'later', remindInMs: 800 });
    const tr = await transcriptOf(key, 3);
    const [, timerTurn, reminder] = tr;
    expect(reminder!.messages[0]!.content).toEqual({ reminder: 'later' });
    expect(reminder!.startedAt.getTime() - timerTurn!.finishedAt!.getTime()).toBeGreaterThanOrEqual(800 - 50);
    expect(timerTurn!.emitted.map((e) => [e.actor, e.delay_ms])).toEqual([['ex/fx', 800]]);
  });
});
