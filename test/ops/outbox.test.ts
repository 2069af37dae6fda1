/**
 * The outbox for operators: `corral outbox list | show | replay | discard` as the command functions
 * and the operations, `corral sinks list | remove` with the messages of a sink, on a real
 * database. The messages are written here by SQL in every state (the delivery loop that makes them
 * is test/runtime/outbox.test.ts's): what is listed, what each action changes in the rows, and
 * what is refused before anything changes.
 */
import { beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { runOutboxAct, runOutboxList, runOutboxShow } from '../../src/cli/commands/outbox.ts';
import { runSinksList, runSinksRemove } from '../../src/cli/commands/sinks.ts';
import { loadConfig, type Config } from '../../src/config.ts';
import type { OutboxPage } from '../../src/db/views.ts';
import { setSinkDisabled } from '../../src/db/outbox/sinks.ts';
import { actOnOutbox, listOutboxMessages, showOutboxMessage } from '../../src/outbox/operations.ts';
import { addSink } from '../../src/outbox/sinks.ts';
import { captureIo, errorCodeOf } from '../helpers/capture.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { insertOutboxMessage, type OutboxRowInput } from './helpers.ts';

const io = captureIo;
const codeOf = errorCodeOf;

const tdb = useTestDatabase();
let config: Config;

const insert = (r: OutboxRowInput) => insertOutboxMessage(tdb.client, r);

async function stateOf(id: number) {
  const r = await tdb.client.query(
    `select state, attempts - attempts_before_replay as attempts, webhook_id, next_attempt_at <= now() as due from corral.outbox where id = $1`,
    [id],
  );
  // attempts: since the message was written or last replayed (what the retry limit counts)
  return r.rows[0] as { state: string; attempts: number; webhook_id: string; due: boolean } | undefined;
}

beforeAll(async () => {
  config = loadConfig({ databaseUrl: tdb.url, logLevel: 'silent' }, {});
  for (const name of ['crm', 'bridge']) await addSink(tdb.database.db, { name, url: `https://${name}.example.com/in` });
});

beforeEach(async () => {
  await tdb.client.query('delete from corral.outbox');
});

describe('corral outbox list and show', () => {
  it('lists newest first, filtered by state (repeated or a comma list), sink, actor, agent; pages with before', async () => {
    const a = await insert({ sink: 'crm', state: 'delivered', lastStatus: 200 });
    const b = await insert({ sink: 'crm', state: 'dead', attempts: 9, lastStatus: 503 });
    const c = await insert({ sink: 'bridge', actor: 'ops-b/s2', state: 'pending', attempts: 2, lastError: 'no answer within 10000 ms' });
    const d = await insert({ sink: 'bridge', actor: 'ops-b/s3', state: 'discarded' });
    const ids = async (o: Parameters<typeof listOutboxMessages>[1]) =>
      (await listOutboxMessages(tdb.database.db, o)).messages.map((m) => m.id);

    expect(await ids({})).toEqual([d, c, b, a]);
    expect(await ids({ states: ['dead', 'pending'] })).toEqual([c, b]);
    expect(await ids({ sink: 'crm' })).toEqual([b, a]);
    expect(await ids({ actor: 'ops-b/s2' })).toEqual([c]);
    expect(await ids({ actor: { agentUid: 'ops-b', sessionId: 's3' } })).toEqual([d]);
    expect(await ids({ agent: 'ops-b' })).toEqual([d, c]);
    const first = await listOutboxMessages(tdb.database.db, { limit: 3 });
    expect([first.messages.map((m) => m.id), first.next]).toEqual([[d, c, b], b]);
    expect(await listOutboxMessages(tdb.database.db, { limit: 3, before: first.next! })).toEqual({
      messages: [expect.objectContaining({ id: a })],
      next: null,
    });
    expect(first.messages[1]).toMatchObject({ actor: 'ops-b/s2', sink: 'bridge', state: 'pending', attempts: 2, lastStatus: null });
    expect(first.messages[1]).not.toHaveProperty('body');

    const table = io();
    expect(await runOutboxList(config, { state: ['dead,pending'] }, table)).toBe(0);
    expect(table.out.text).toMatch(/^ID\s+STATE\s+SINK\s+ACTOR\s+WEBHOOK-ID\s+ATTEMPTS\s+LAST STATUS\s+AGE\n/);
    expect(table.out.text).toMatch(
      new RegExp(`\\n${c}\\s+pending\\s+bridge\\s+ops-b/s2\\s+msg_\\S+\\s+2\\s+no answer within 10000 ms\\s+\\S+\\n`),
    );
    expect(table.out.text).toMatch(new RegExp(`\\n${b}\\s+dead\\s+crm\\s+ops-a/s1\\s+msg_\\S+\\s+9\\s+HTTP 503\\s+\\S+\\n`));
    expect(table.out.text).toContain('2 messages\n');
    const paged = io();
    await runOutboxList(config, { limit: 1 }, paged);
    expect(paged.out.text).toContain(`1 message; more with --before ${d}\n`);
    const asJson = io();
    await runOutboxList(config, { state: ['delivered'], json: true }, asJson);
    expect((JSON.parse(asJson.out.text) as OutboxPage).messages.map((m) => m.id)).toEqual([a]);
    const none = io();
    expect(await runOutboxList(config, { sink: 'crm', state: ['pending'] }, none)).toBe(3);
    expect(none.out.text).toBe('no outbox messages match\n');
  });

  it('refuses a bad state, sink, actor, agent, both actor and agent, a bad limit or id, before the database is read', async () => {
    for (const p of [
      runOutboxList(config, { state: ['pending,gone'] }, io()),
      runOutboxList(config, { sink: 'bad name' }, io()),
      runOutboxList(config, { actor: 'a/s', agent: 'a' }, io()),
      runOutboxList(config, { agent: 'bad agent' }, io()),
      runOutboxList(config, { before: '-1' }, io()),
      runOutboxShow(config, '12abc', {}, io()),
      listOutboxMessages(tdb.database.db, { limit: 1001 }),
      listOutboxMessages(tdb.database.db, { states: ['sent' as never] }),
    ]) {
      expect(await codeOf(p)).toBe('invalid_argument');
    }
    expect(await codeOf(runOutboxList(config, { actor: 'no-slash' }, io()))).toBe('invalid_actor_key');
  });

  it('shows everything of one message: state, attempts, last answer, next attempt, claim, the body as sent', async () => {
    const body = '{"text":"hi","n":1}';
    const id = await insert({ sink: 'crm', state: 'pending', attempts: 2, lastStatus: 503, key: 'order-7', body, claimedBy: 'daemon-1' });
    const shown = await showOutboxMessage(tdb.database.db, id);
    expect(shown).toMatchObject({
      id,
      sink: 'crm',
      webhookId: 'order-7',
      state: 'pending',
      attempts: 2,
      lastStatus: 503,
      body,
      claimedBy: 'daemon-1',
    });
    expect(Date.parse(shown.claimedUntil!)).toBeGreaterThan(Date.now());
    const human = io();
    expect(await runOutboxShow(config, String(id), {}, human)).toBe(0);
    expect(human.out.text).toContain('state         pending (attempt 2, last: HTTP 503)\n');
    expect(human.out.text).toContain('webhook-id    order-7\n');
    expect(human.out.text).toMatch(/claimed {7}by daemon-1 until \d{4}-/);
    expect(human.out.text).toMatch(/next attempt {2}\d{4}-/);
    expect(human.out.text).toContain('body\n  {\n    "text": "hi",\n    "n": 1\n  }\n');
    const asJson = io();
    await runOutboxShow(config, String(id), { json: true }, asJson);
    expect(JSON.parse(asJson.out.text).body).toBe(body);
    expect(await codeOf(runOutboxShow(config, '999999', {}, io()))).toBe('not_found');
  });
});

describe('corral outbox replay and discard', () => {
  it('replays dead and discarded messages by id with their webhook-id; skips others, reports unknown ids', async () => {
    const dead = await insert({ sink: 'crm', state: 'dead', attempts: 9, lastStatus: 410, key: 'keep-me' });
    const discarded = await insert({ sink: 'crm', state: 'discarded' });
    const delivered = await insert({ sink: 'crm', state: 'delivered' });
    const out = io();
    expect(await runOutboxAct(config, 'replay', [String(dead), String(discarded), String(delivered), '999999'], {}, out)).toBe(3);
    expect(out.out.text).toBe(
      `replayed 2 messages: ${dead}, ${discarded}\nskipped ${delivered}: it is delivered (replay takes dead or discarded messages)\nnot found 999999\n`,
    );
    expect(await stateOf(dead)).toEqual({ state: 'pending', attempts: 0, webhook_id: 'keep-me', due: true });
    expect((await stateOf(discarded))?.state).toBe('pending');
    expect((await stateOf(delivered))?.state).toBe('delivered');
  });

  it('a filter acts only with --all, and only on the states the action takes; a disabled sink is named', async () => {
    const crmDead = await insert({ sink: 'crm', state: 'dead' });
    const crmDiscarded = await insert({ sink: 'crm', state: 'discarded' });
    const bridgeDead = await insert({ sink: 'bridge', state: 'dead' });
    expect(await codeOf(runOutboxAct(config, 'replay', [], { sink: 'crm' }, io()))).toBe('invalid_argument');
    expect(await codeOf(runOutboxAct(config, 'replay', [], {}, io()))).toBe('invalid_argument');
    expect(await codeOf(runOutboxAct(config, 'replay', [String(crmDead)], { all: true }, io()))).toBe('invalid_argument');
    expect(await codeOf(runOutboxAct(config, 'replay', [], { all: true, state: ['pending'] }, io()))).toBe('invalid_argument');
    expect(await codeOf(runOutboxAct(config, 'discard', [], { all: true, state: ['delivered'] }, io()))).toBe('invalid_argument');
    expect((await stateOf(crmDead))?.state).toBe('dead');

    await setSinkDisabled(tdb.database.db, 'crm', 'HTTP 410 Gone');
    try {
      const out = io();
      expect(await runOutboxAct(config, 'replay', [], { all: true, sink: 'crm', state: ['dead'], json: true }, out)).toBe(0);
      expect(JSON.parse(out.out.text)).toEqual({ action: 'replay', done: [crmDead], skipped: [], notFound: [], disabledSinks: ['crm'] });
      expect(out.err.text).toContain('sink crm is disabled: its replayed messages wait until corral sinks enable crm');
    } finally {
      await setSinkDisabled(tdb.database.db, 'crm', null);
    }
    expect((await stateOf(crmDiscarded))?.state).toBe('discarded');
    expect((await stateOf(bridgeDead))?.state).toBe('dead');
    const none = io();
    expect(await runOutboxAct(config, 'replay', [], { all: true, sink: 'crm', state: ['dead'] }, none)).toBe(3);
    expect(none.out.text).toBe('no messages match: nothing to replay\n');
  });

  it('discards pending and dead messages (by id or --all), never delivered ones; a discarded one replays', async () => {
    const pending = await insert({ sink: 'bridge', state: 'pending', attempts: 1, lastStatus: 503 });
    const dead = await insert({ sink: 'bridge', state: 'dead' });
    const delivered = await insert({ sink: 'bridge', state: 'delivered' });
    const other = await insert({ sink: 'crm', state: 'pending' });
    const r = await actOnOutbox(tdb.database.db, 'discard', { all: true, sink: 'bridge' });
    expect(r).toEqual({ action: 'discard', done: [pending, dead], skipped: [], notFound: [], disabledSinks: [] });
    expect((await stateOf(delivered))?.state).toBe('delivered');
    expect((await stateOf(other))?.state).toBe('pending');
    const one = io();
    expect(await runOutboxAct(config, 'discard', [String(other), String(delivered)], {}, one)).toBe(0);
    expect(one.out.text).toContain(`discarded 1 message: ${other}\nskipped ${delivered}: it is delivered`);
    expect((await actOnOutbox(tdb.database.db, 'replay', { ids: [pending] })).done).toEqual([pending]);
    expect(await stateOf(pending)).toMatchObject({ state: 'pending', attempts: 0 });
  });

  it('a bulk action takes every match, past one batch', async () => {
    await tdb.client.query(
      `insert into corral.outbox (sink, webhook_id, agent_uid, session_id, turn_id, event_id, position, body, state)
       select 'crm', 'bulk-' || g, 'ops-bulk', 's', gen_random_uuid(), gen_random_uuid(), 0, '{}', 'dead' from generate_series(1, 1203) g`,
    );
    const r = await actOnOutbox(tdb.database.db, 'replay', { all: true, agent: 'ops-bulk' });
    expect(r.done).toHaveLength(1203);
    expect((await tdb.client.query(`select count(*)::int as n from corral.outbox where state = 'dead'`)).rows[0].n).toBe(0);
  });
});

describe('corral sinks with messages', () => {
  it('list counts pending and dead messages; remove refuses while some are pending, --force removes them too', async () => {
    await addSink(tdb.database.db, { name: 'busy', url: 'https://busy.example.com/in' });
    await insert({ sink: 'busy', state: 'pending' });
    await insert({ sink: 'busy', state: 'pending' });
    await insert({ sink: 'busy', state: 'dead' });
    await insert({ sink: 'busy', state: 'delivered' });
    const table = io();
    await runSinksList(config, {}, table);
    expect(table.out.text).toMatch(/^NAME\s+URL\s+TIMEOUT\s+AT ONCE\s+PENDING\s+DEAD\s+STATE\s+AGENTS\s+PRIVATE\n/);
    expect(table.out.text).toMatch(/\nbusy\s+https:\/\/busy\.example\.com\/in\s+10000 ms\s+4\s+2\s+1\s+enabled\s+all\s+refused\n/);
    expect(table.out.text).toMatch(/\ncrm\s+\S+\s+10000 ms\s+4\s+0\s+0\s+enabled\s+all\s+refused\n/);

    let refusal: unknown;
    await runSinksRemove(config, 'busy', {}, io()).catch((e: unknown) => (refusal = e));
    expect(refusal).toMatchObject({ code: 'invalid_argument' });
    expect(String((refusal as Error).message)).toMatch(/sink busy has 2 pending messages: .*--force/);
    expect((await tdb.client.query(`select count(*)::int as n from corral.outbox where sink = 'busy'`)).rows[0].n).toBe(4);

    const out = io();
    expect(await runSinksRemove(config, 'busy', { force: true }, out)).toBe(0);
    expect(out.out.text).toBe('sink busy removed (2 pending messages dropped unsent)\n');
    expect((await tdb.client.query(`select count(*)::int as n from corral.outbox where sink = 'busy'`)).rows[0].n).toBe(0);
    expect((await tdb.client.query(`select 1 from corral.sinks where name = 'busy'`)).rowCount).toBe(0);
  });
});
