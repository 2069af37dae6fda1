/**
 * What turns delivered, where operators look: `corral transcript` and `corral actor` (text and
 * JSON) under each turn, from a real daemon whose delivery loop POSTs to a real receiver (200,
 * 503 forever, 410); and `corral outbox` as the real CLI (its registration, `--help`, exit codes).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { runActorCommand } from '../../src/cli/commands/status.ts';
import { runTranscriptCommand } from '../../src/cli/commands/transcript.ts';
import { loadConfig, type Config } from '../../src/config.ts';
import { sql } from '../../src/db/orm.ts';
import { addSink } from '../../src/outbox/sinks.ts';
import { Capture } from '../helpers/capture.ts';
import { startTestDaemon, type TestDaemon } from '../helpers/daemon.ts';
import { RawPeer } from '../helpers/raw-peer.ts';
import { waitFor } from '../helpers/wait.ts';
import { WebhookReceiver } from '../helpers/webhook-receiver.ts';
import { corral, json } from './helpers.ts';
import { sendEvent } from '../helpers/send.ts';

type Ref = Record<string, unknown> & { event_id: string };

describe('what each turn delivered', { timeout: 120_000 }, () => {
  let t: TestDaemon;
  let w: RawPeer;
  let config: Config;
  const rx = new WebhookReceiver();
  let eventId: string;

  beforeAll(async () => {
    await rx.start();
    rx.respond = (r) => (r.path === '/flaky' ? { status: 503 } : r.path === '/gone' ? { status: 410 } : { status: 200 });
    // a long retry delay: the 503 message stays pending after its first attempt
    t = await startTestDaemon({ drainMs: 0, retryDelaySeconds: 600, retryDelayMaxSeconds: 600 });
    config = loadConfig({ databaseUrl: t.db.url, logLevel: 'silent' }, {});
    for (const name of ['ok', 'flaky', 'gone']) await addSink(t.daemon.database.db, { name, url: rx.url(`/${name}`), allowPrivate: true });
    w = new RawPeer(t.daemon.broker.endpoint, 'ob-cli');
    await w.register(2);
    ({ eventId } = await sendEvent(t.daemon.database.db, actorKey('obv', 's1'), { text: 'hi' }));
    const s = await w.next('turn_start', (m) => (m.turn_ref as Ref).event_id === eventId);
    await w.send({ type: 'turn_accepted', turn_ref: s.turn_ref });
    await w.send({
      type: 'turn_result',
      turn_ref: s.turn_ref,
      messages: [{ role: 'assistant', content: 'done' }],
      deliver: [
        { sink: 'ok', body: { n: 1 }, key: 'ok-1' },
        { sink: 'flaky', body: { n: 2 }, key: 'flaky-1' },
        { sink: 'gone', body: { n: 3 }, key: 'gone-1' },
      ],
    });
    await w.next('turn_committed');
    await waitFor(
      async () => {
        const r = await t.daemon.database.db.execute<{ n: number }>(
          sql`select count(*)::int as n from corral.outbox where (state = 'pending' and attempts = 1 and last_status = 503)
                 or (state in ('delivered', 'dead') and attempts = 1)`,
        );
        return r.rows[0]!.n === 3 ? true : undefined;
      },
      { what: 'the three attempts', timeoutMs: 20_000 },
    );
  });

  afterAll(async () => {
    await w?.close();
    await t?.stop();
    await rx.stop();
  });

  it('corral transcript: a line per message under its turn, and the messages in its JSON', async () => {
    const out = new Capture();
    expect(await runTranscriptCommand(config, 'obv/s1', {}, out)).toBe(0);
    expect(out.text).toContain(
      [
        '       delivered → ok (obv/s1/ok-1): delivered after 1 attempt',
        '       delivered → flaky (obv/s1/flaky-1): pending (attempt 1, last: HTTP 503)',
        '       delivered → gone (obv/s1/gone-1): dead after 1 attempt: HTTP 410',
      ].join('\n'),
    );
    const asJson = new Capture();
    await runTranscriptCommand(config, 'obv/s1', { json: true }, asJson);
    const turns = (JSON.parse(asJson.text) as { turns: { eventId: string; delivered: { webhookId: string; state: string }[] }[] }).turns;
    expect(turns.find((x) => x.eventId === eventId)!.delivered.map((d) => [d.webhookId, d.state])).toEqual([
      ['obv/s1/ok-1', 'delivered'],
      ['obv/s1/flaky-1', 'pending'],
      ['obv/s1/gone-1', 'dead'],
    ]);
  });

  it('corral actor: a count in the turns table, a line per message, and the messages in its JSON', async () => {
    const out = new Capture();
    expect(await runActorCommand(config, 'obv/s1', {}, out)).toBe(0);
    expect(out.text).toMatch(/EMITTED\s+DELIVERED\s+ERROR\n/);
    expect(out.text).toContain('3 → ok, flaky, gone (2 not delivered)');
    expect(out.text).toContain(`  ${eventId} delivered → flaky (obv/s1/flaky-1): pending (attempt 1, last: HTTP 503)\n`);
    const asJson = new Capture();
    await runActorCommand(config, 'obv/s1', { json: true }, asJson);
    const recent = (JSON.parse(asJson.text) as { recentTurns: { delivered: { sink: string; attempts: number; lastStatus: number }[] }[] })
      .recentTurns;
    expect(recent[0]!.delivered.map((d) => [d.sink, d.attempts, d.lastStatus])).toEqual([
      ['ok', 1, 200],
      ['flaky', 1, 503],
      ['gone', 1, 410],
    ]);
  });

  it('corral outbox as the CLI: list, show, replay, --help, and exit codes 2 and 3', async () => {
    const url = t.db.url;
    const [listed, dead, help, badState, unknown, filterAlone] = await Promise.all([
      corral(['outbox', 'list', '--json'], url),
      corral(['outbox', 'list', '--state', 'dead'], url),
      corral(['outbox', 'replay', '--help'], url),
      corral(['outbox', 'list', '--state', 'sent'], url),
      corral(['outbox', 'show', '999999'], url),
      corral(['outbox', 'discard', '--sink', 'flaky'], url),
    ]);
    expect(listed.code, listed.stderr).toBe(0);
    const messages = json<{ messages: { id: number; webhookId: string }[] }>(listed).messages;
    expect(messages.map((m) => m.webhookId)).toEqual(['obv/s1/gone-1', 'obv/s1/flaky-1', 'obv/s1/ok-1']);
    expect(dead.stdout).toMatch(/\n\d+\s+dead\s+gone\s+obv\/s1\s+obv\/s1\/gone-1\s+1\s+HTTP 410\s+\S+\n1 message\n$/);
    expect([help.code, help.stdout]).toEqual([0, expect.stringContaining('--all')]);
    expect(help.stdout).toContain('corral outbox replay --all --sink crm --state dead');
    expect([badState.code, badState.stderr]).toEqual([2, expect.stringContaining('a state is one of pending, delivered, dead, discarded')]);
    expect([unknown.code, unknown.stderr]).toEqual([3, 'corral: no outbox message 999999\n']);
    expect([filterAlone.code, filterAlone.stderr]).toEqual([2, expect.stringContaining('with --all')]);

    const goneId = messages.find((m) => m.webhookId === 'obv/s1/gone-1')!.id;
    const shown = await corral(['outbox', 'show', String(goneId)], url);
    expect(shown.stdout).toContain('state         dead after 1 attempt: HTTP 410\n');
    const replayed = await corral(['outbox', 'replay', String(goneId)], url);
    expect([replayed.code, replayed.stdout]).toEqual([0, `replayed 1 message: ${goneId}\n`]);
    // the 410 disabled the sink: the replayed message waits for it
    expect(replayed.stderr).toContain('sink gone is disabled');
  });
});
