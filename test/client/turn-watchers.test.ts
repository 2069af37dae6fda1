/**
 * Turn events only on watched channels (src/db/turns/turn-events.ts, T4) and the listener's
 * registrations (src/db/turns/turn-listener.ts, L1–L3), on real PostgreSQL: no NOTIFY for a channel
 * nobody registered; rows added, lingering, dropped and cleaned up after dead backends; the
 * barrier that outlasts transactions which read the registry before the registration; and the
 * registration made again after a lost connection.
 */
import pg from 'pg';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Corral, WatchEvent } from '../../src/client/index.ts';
import { openDatabase, type Database } from '../../src/db/client.ts';
import { notifyTurnEvents, parseTurnNotices, turnChannelOf, type TurnNotice } from '../../src/db/turns/turn-events.ts';
import { TurnListener, type TurnListenerOptions, type TurnSubscriber } from '../../src/db/turns/turn-listener.ts';
import { read, startClientSetup, type ClientSetup } from './helpers.ts';
import { testLogger } from '../helpers/daemon.ts';
import { sleep, waitFor } from '../helpers/wait.ts';

let s: ClientSetup;
/** Sends events and reads transcripts; it never watches, so it registers nothing. */
let sender: Corral;
/** A pool of the test database, for the notify statements of the failure paths (notifyTurnEvents). */
let db: Database;
/** What each test opened, closed after it (last first). */
const opened: (() => Promise<unknown>)[] = [];

beforeAll(async () => {
  s = await startClientSetup({}, { capacity: 4 });
  sender = s.corral;
  db = openDatabase(s.t.db.url, { max: 2, applicationName: 'tw-notifier' });
});

afterEach(async () => {
  for (const close of opened.splice(0).reverse()) await close().catch(() => undefined);
  // a failed test's rows must not fail the next one
  await s.pg.query('delete from corral.turn_watchers');
});

afterAll(async () => {
  await db?.close();
  await s?.stop();
});

const NOBODY: TurnSubscriber = { notices: () => undefined, gap: () => undefined };
/** A pid no backend has (Linux pids stay below 2^22). */
const NO_SUCH_PID = 2_147_483_647;

function listener(opts: Partial<TurnListenerOptions> & { applicationName: string }): TurnListener {
  const l = new TurnListener({ url: s.t.db.url, logger: testLogger, ...opts });
  opened.push(() => l.close());
  return l;
}

/** A plain connection LISTENing on `channel` that registers nothing: everything it hears, parsed. */
async function rawListener(channel: string): Promise<TurnNotice[]> {
  const c = new pg.Client({ connectionString: s.t.db.url, application_name: 'tw-raw' });
  await c.connect();
  opened.push(() => c.end());
  const heard: TurnNotice[] = [];
  c.on('notification', (n) => heard.push(...parseTurnNotices(n.payload ?? '')));
  await c.query(`LISTEN ${pg.escapeIdentifier(channel)}`);
  return heard;
}

/** The registrations, as `channel pid`, sorted. */
async function registrations(): Promise<string[]> {
  const r = await s.pg.query<{ row: string }>(`select channel || ' ' || pid as row from corral.turn_watchers`);
  return r.rows.map((x) => x.row).sort();
}

/** The pid of the one backend of this database named `app`. */
async function backendOf(app: string): Promise<number> {
  const r = await s.pg.query<{ pid: number }>(
    `select pid from pg_stat_activity where application_name = $1 and datname = current_database()`,
    [app],
  );
  expect(r.rows).toHaveLength(1);
  return r.rows[0]!.pid;
}

const backendAlive = async (pid: number) => (await s.pg.query(`select 1 from pg_stat_activity where pid = $1`, [pid])).rowCount === 1;

/** Terminates backend `pid` and waits until it is gone. */
async function terminate(pid: number): Promise<void> {
  expect((await s.pg.query<{ ok: boolean }>(`select pg_terminate_backend($1) as ok`, [pid])).rows[0]!.ok).toBe(true);
  await waitFor(async () => !(await backendAlive(pid)), { what: `backend ${pid} gone` });
}

/** The channels the listener's backend LISTENs on, asked on its own connection (the server's view, not its bookkeeping). */
async function serverChannels(l: TurnListener): Promise<string[]> {
  const client = (l as unknown as { client: pg.Client | undefined }).client;
  if (!client) throw new Error('the listener has no connection');
  return (await client.query<{ ch: string }>('select pg_listening_channels() as ch order by 1')).rows.map((r) => r.ch);
}

const committed = (eventId: string) => (seen: WatchEvent[]) => seen.some((e) => e.kind === 'committed' && e.eventId === eventId);
const lines = (heard: TurnNotice[]) => heard.map((n) => `${n.kind} ${n.eventId}`);

/** A transaction of its own that runs the failure paths' notify statement for `actor` and stays open until `end()`. */
async function holdRegistry(actor: string): Promise<{ end(): Promise<void> }> {
  const [agentUid, sessionId] = actor.split('/') as [string, string];
  let release!: () => void;
  let ran!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  const running = new Promise<void>((r) => (ran = r));
  const eventId = '01234567-89ab-7def-8123-456789abcdef';
  const tx = db.db.transaction(async (t) => {
    await notifyTurnEvents(t, [{ kind: 'failed', agentUid, sessionId, eventId, epoch: 1, attempt: 1 }]);
    ran();
    await gate;
  });
  tx.catch(() => ran());
  await running;
  let ended = false;
  const end = async () => {
    if (ended) return;
    ended = true;
    release();
    await tx;
  };
  opened.push(end);
  return { end };
}

describe('turn watchers', () => {
  it('notifies a channel only while a listener has it registered (T4), and then every listener hears it', async () => {
    const actor = 'tw/unwatched';
    const channel = turnChannelOf(actor);
    expect(await registrations()).toEqual([]);
    const raw = await rawListener(channel);

    const unheard = await sender.send(actor, { text: 'nobody watches' });
    await waitFor(async () => (await sender.transcript(actor)).length === 1, { what: 'the unwatched turn committed' });

    const watcher = await s.connect({ applicationName: 'tw-watcher', watchLingerMs: 0 });
    const watch = await watcher.watchTurns(actor);
    const pid = await backendOf('tw-watcher-listen');
    expect(await registrations()).toEqual([`${channel} ${pid}`]);
    const heard = await sender.send(actor, { text: 'watched' });
    const seen = await read(watch, committed(heard.eventId));
    expect(seen.map((e) => (e.kind === 'gap' ? 'gap' : `${e.kind} ${e.eventId}`))).toEqual([
      `started ${heard.eventId}`,
      `committed ${heard.eventId}`,
    ]);
    // notifications arrive in commit order: had the first turn notified, the raw listener would have heard it first
    await waitFor(() => raw.some((n) => n.kind === 'committed' && n.eventId === heard.eventId), { what: 'the raw listener hearing' });
    expect(lines(raw)).toEqual([`started ${heard.eventId}`, `committed ${heard.eventId}`]);
    expect(lines(raw).some((l) => l.includes(unheard.eventId))).toBe(false);

    // unregistered again (no linger): the next turn is not notified either
    await watch.close();
    expect(await registrations()).toEqual([]);
    const unheard2 = await sender.send(actor, { text: 'nobody watches again' });
    await waitFor(async () => (await sender.transcript(actor)).length === 3, { what: 'the second unwatched turn committed' });
    const again = await watcher.watchTurns(actor);
    const last = await sender.send(actor, { text: 'watched again' });
    await read(again, committed(last.eventId));
    await waitFor(() => raw.some((n) => n.kind === 'committed' && n.eventId === last.eventId), { what: 'the raw listener hearing' });
    expect(lines(raw).slice(2)).toEqual([`started ${last.eventId}`, `committed ${last.eventId}`]);
    expect(lines(raw).some((l) => l.includes(unheard2.eventId))).toBe(false);
    await again.close();
    expect(await registrations()).toEqual([]);
  });

  it('registers a channel for the backend, keeps it for the linger, then unlistens and unregisters it (L3)', async () => {
    const [a, b] = [turnChannelOf('tw/rows-a'), turnChannelOf('tw/rows-b')];

    const lingering = listener({ applicationName: 'tw-linger', lingerMs: 50 });
    const sub = await lingering.subscribe(a, NOBODY);
    const pid = await backendOf('tw-linger');
    expect(await registrations()).toEqual([`${a} ${pid}`]);
    expect(await serverChannels(lingering)).toEqual([a]);
    await sub.close();
    await waitFor(async () => (await registrations()).length === 0, { what: 'the lingering registration dropped' });
    expect(await serverChannels(lingering)).toEqual([]);
    expect(lingering.listening).toBe(0);

    const none = listener({ applicationName: 'tw-no-linger', lingerMs: 0 });
    const sub0 = await none.subscribe(a, NOBODY);
    const pid0 = await backendOf('tw-no-linger');
    expect(await registrations()).toEqual([`${a} ${pid0}`]);
    await sub0.close();
    expect(await registrations()).toEqual([]);
    expect(await serverChannels(none)).toEqual([]);

    // within the linger a channel stays registered, and subscribing again costs no statement
    let statements = 0;
    const long = listener({ applicationName: 'tw-long-linger', lingerMs: 60_000, onStatement: () => statements++ });
    const first = await long.subscribe(a, NOBODY);
    await long.subscribe(b, NOBODY);
    const pidL = await backendOf('tw-long-linger');
    await first.close();
    const before = statements;
    const again = await long.subscribe(a, NOBODY);
    expect(statements).toBe(before);
    await again.close();
    expect(await registrations()).toEqual([`${a} ${pidL}`, `${b} ${pidL}`].sort());
    expect(await serverChannels(long)).toEqual([a, b].sort());
    // close() deletes the listener's registrations, lingering or not
    await long.close();
    expect(await registrations()).toEqual([]);
  });

  it("deletes the registrations of backends that are gone at anyone's next registration (L3)", async () => {
    const [a, b, c] = [turnChannelOf('tw/dead-a'), turnChannelOf('tw/dead-b'), turnChannelOf('tw/dead-c')];
    // a lingering channel is dropped with its connection, not registered again: its row stays behind
    const dead = listener({ applicationName: 'tw-dead', lingerMs: 60_000 });
    await (await dead.subscribe(a, NOBODY)).close();
    const deadPid = await backendOf('tw-dead');
    await terminate(deadPid);
    await waitFor(() => dead.listening === 0, { what: 'the listener noticing its loss' });
    await s.pg.query(`insert into corral.turn_watchers (channel, pid) values ($1, $2)`, [b, NO_SUCH_PID]);
    expect(await registrations()).toEqual([`${a} ${deadPid}`, `${b} ${NO_SUCH_PID}`].sort());

    const other = listener({ applicationName: 'tw-other', lingerMs: 0 });
    await other.subscribe(c, NOBODY);
    expect(await registrations()).toEqual([`${c} ${await backendOf('tw-other')}`]);
    expect(dead.reconnects).toBe(0);
  });

  it('resolves subscribe only once the transactions that read the registry before it have ended (L1)', async () => {
    const actor = 'tw/barrier';
    const channel = turnChannelOf(actor);
    // it decided not to notify: nobody was registered when its statement ran
    const holder = await holdRegistry(actor);
    const l = listener({ applicationName: 'tw-barrier', lingerMs: 0 });
    let resolved = false;
    const subscribing = l.subscribe(channel, NOBODY).then((sub) => {
      resolved = true;
      return sub;
    });
    subscribing.catch(() => undefined);
    await waitFor(async () => (await registrations()).length === 1, { what: 'the registration' });
    await sleep(200);
    expect(resolved).toBe(false);
    await holder.end();
    await waitFor(() => resolved, { timeoutMs: 5_000, what: 'subscribe resolving after the commit' });
    await (await subscribing).close();

    // with no such transaction there is nothing to wait for; with one, it gives up after barrierMs, with a warning
    await (await l.subscribe(channel, NOBODY)).close();
    type Line = { channel?: string; msg?: string };
    const warnings: Line[] = [];
    const logger = pino({ level: 'warn' }, { write: (line: string) => void warnings.push(JSON.parse(line) as Line) });
    const stuck = await holdRegistry(actor);
    const impatient = listener({ applicationName: 'tw-impatient', lingerMs: 0, barrierMs: 100, logger });
    const t0 = Date.now();
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<'late'>((r) => (timer = setTimeout(() => r('late'), 10_000)));
    const gaps: { since: Date; until: Date }[] = [];
    const sub = await Promise.race([
      impatient.subscribe(channel, { notices: () => undefined, gap: (since, until) => gaps.push({ since, until }) }),
      late,
    ]).finally(() => clearTimeout(timer));
    expect(sub).not.toBe('late');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(100);
    expect(warnings).toEqual([
      expect.objectContaining({ channel, msg: 'turn events: transactions older than the registration are still open' }),
    ]);
    // and its subscriber is told that what those transactions commit may go unheard
    expect(gaps).toHaveLength(1);
    expect(gaps[0]!.since.getTime()).toBeGreaterThanOrEqual(t0);
    expect(gaps[0]!.until.getTime()).toBeGreaterThanOrEqual(gaps[0]!.since.getTime() + 100);
    const states = await s.pg.query(
      `select 1 from pg_stat_activity where application_name = 'tw-notifier' and state = 'idle in transaction'`,
    );
    expect(states.rowCount).toBe(1);
    await stuck.end();
  });

  it('registers again on a new connection after its backend is terminated, and tells of the gap (L2)', async () => {
    const actor = 'tw/reconnect';
    const [agentUid, sessionId] = actor.split('/') as [string, string];
    const channel = turnChannelOf(actor);
    const gaps: { since: Date; until: Date }[] = [];
    const heard: TurnNotice[] = [];
    const l = listener({ applicationName: 'tw-reconnect', lingerMs: 0 });
    await l.subscribe(channel, { notices: (n) => heard.push(...n), gap: (since, until) => gaps.push({ since, until }) });
    const oldPid = await backendOf('tw-reconnect');
    expect(await registrations()).toEqual([`${channel} ${oldPid}`]);

    await terminate(oldPid);
    await waitFor(() => gaps.length === 1, { what: 'the gap' });
    const newPid = await backendOf('tw-reconnect');
    expect(newPid).not.toBe(oldPid);
    // the gap is told once the new registration is made
    expect(await registrations()).toContain(`${channel} ${newPid}`);
    expect(gaps[0]!.until.getTime()).toBeGreaterThanOrEqual(gaps[0]!.since.getTime());
    expect(l.reconnects).toBe(1);
    expect(l.listening).toBe(1);
    expect(await serverChannels(l)).toEqual([channel]);

    const eventId = '11111111-89ab-7def-8123-456789abcdef';
    await notifyTurnEvents(db.db, [{ kind: 'cancelled', agentUid, sessionId, eventId, epoch: 3, attempt: 2 }]);
    await waitFor(() => heard.length > 0, { what: 'an event after the reconnect' });
    expect(heard).toEqual([{ kind: 'cancelled', agentUid, sessionId, eventId, epoch: 3, attempt: 2 }]);

    // the dead backend's row goes at the latest with the next registration
    const next = listener({ applicationName: 'tw-next', lingerMs: 0 });
    await next.subscribe(turnChannelOf('tw/next'), NOBODY);
    const nextRow = `${turnChannelOf('tw/next')} ${await backendOf('tw-next')}`;
    expect(await registrations()).toEqual([`${channel} ${newPid}`, nextRow].sort());
    await l.close();
    expect(await registrations()).toEqual([nextRow]);
  });
});
