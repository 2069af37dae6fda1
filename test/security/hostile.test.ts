/**
 * Hostile peers against a real daemon (CURVE on, real sockets, real PostgreSQL): what an
 * attacker who reaches the endpoint can and cannot do. Every wait polls with a deadline; the
 * stated bounds are:
 *  - a revoked worker is dropped without a restart, told why, refused from then on, and its turn
 *    commits on another worker;
 *  - under floods (garbage, oversized frames, ~24 MB of overlong turn_refs, 1000 registrations,
 *    3000 forged results, 100 connections of one key) the broker keeps running, `corral.workers`
 *    holds only allow-listed ids, a legitimate turn commits within 15 s, the process grows by
 *    less than 300 MB RSS, and the forged results cost fewer than 1500 transactions.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Dealer, curveKeyPair } from 'zeromq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { addWorkerKey, keyPaths, revokeWorkerKey, workerCredentials, type WorkerKeyFile } from '../../src/fabric/keys.ts';
import type { DaemonMessage } from '../../src/fabric/protocol.ts';
import { createExampleHandler } from '../../src/worker/example.ts';
import { createWorker, type Worker, type WorkerHooks } from '../../src/worker/sdk.ts';
import { startTestDaemon, testLogger, type TestDaemon } from '../helpers/daemon.ts';
import { waitFor } from '../helpers/wait.ts';
import { makeTurnRef } from '../fabric/helpers.ts';
import { RawPeer } from '../helpers/raw-peer.ts';
import { sendEvent } from '../helpers/send.ts';

const MAX_MESSAGE_BYTES = 64 * 1024;
const MAX_EVENT_BYTES = 16 * 1024;
/** A legitimate turn must commit within this, whatever the attackers do meanwhile. */
const LEGIT_COMMIT_MS = 15_000;

describe('fabric security against hostile peers', () => {
  let home: string;
  let t: TestDaemon;
  const workers = new Map<string, Worker>();
  const peers: RawPeer[] = [];
  let intruder: WorkerKeyFile;

  const paths = () => keyPaths(home);
  const serverKey = () => t.daemon.security!.keys.publicKey;

  async function startLegit(id: string, hooks?: WorkerHooks): Promise<void> {
    const key = addWorkerKey(paths(), serverKey(), id);
    const w = createWorker({
      endpoint: t.daemon.broker.endpoint,
      workerId: id,
      capacity: 1,
      handler: createExampleHandler(),
      logger: testLogger,
      ...workerCredentials(key),
      ...(hooks ? { hooks } : {}),
    });
    await w.start();
    workers.set(id, w);
    await waitFor(() => t.daemon.broker.isRegistered(id) && t.daemon.runtime.workers.isReady(id), {
      what: `${id} registered`,
      timeoutMs: 15_000,
    });
  }

  function peer(curve?: { serverKey: string; publicKey: string; secretKey: string }, routingId?: string): RawPeer {
    const p = new RawPeer(t.daemon.broker.endpoint, routingId, curve);
    peers.push(p);
    return p;
  }

  const intruderCurve = () => workerCredentials(intruder).curve;

  async function commitWithin(session: string, ms = LEGIT_COMMIT_MS): Promise<string> {
    const { daemon } = t;
    const { eventId } = await sendEvent(daemon.database.db, actorKey('legit', session), { text: session });
    const row = await waitFor(
      async () => {
        const r = await daemon.database.pool.query<{ worker_id: string }>(
          `select worker_id from corral.turns where event_id = $1 and status = 'succeeded'`,
          [eventId],
        );
        return r.rows[0];
      },
      { what: `legit turn ${session} committed`, timeoutMs: ms, intervalMs: 50 },
    );
    return row.worker_id;
  }

  const workerIds = async () =>
    (await t.daemon.database.pool.query<{ worker_id: string }>('select worker_id from corral.workers')).rows.map((r) => r.worker_id);

  beforeAll(async () => {
    home = mkdtempSync(join(tmpdir(), 'corral-sec-'));
    t = await startTestDaemon({
      insecure: false,
      homeDir: home,
      keyPollMs: 50,
      maxMessageBytes: MAX_MESSAGE_BYTES,
      maxEventBytes: MAX_EVENT_BYTES,
      maxConnections: 64,
      maxWorkers: 16,
      workerHeartbeatMs: 200,
      workerStaleMs: 2_000,
      watchdogIntervalMs: 200,
      leaseMs: 5_000,
      progressIntervalMs: 500,
    });
    intruder = addWorkerKey(paths(), serverKey(), 'intruder');
    await startLegit('legit-1');
    await startLegit('legit-2');
  });

  afterAll(async () => {
    await Promise.all(peers.map((p) => p.close()));
    for (const w of workers.values()) await w.stop();
    await t?.stop();
    rmSync(home, { recursive: true, force: true });
  });

  it('creates the daemon key folder 0700 and its files 0600', async () => {
    const { statSync } = await import('node:fs');
    expect(statSync(paths().dir).mode & 0o777).toBe(0o700);
    expect(statSync(paths().daemonKey).mode & 0o777).toBe(0o600);
    expect(statSync(paths().allowlist).mode & 0o777).toBe(0o600);
  });

  /**
   * A DEALER whose socket events are watched from before it connects: libzmq stops retrying after
   * some handshake failures, so an observer attached later could miss the only attempt.
   */
  function watchedDealer(curve?: { serverKey: string; publicKey: string; secretKey: string }): { dealer: Dealer; events: string[] } {
    const dealer = new Dealer({
      linger: 0,
      ...(curve ? { curveServerKey: curve.serverKey, curvePublicKey: curve.publicKey, curveSecretKey: curve.secretKey } : {}),
    });
    const events: string[] = [];
    void (async () => {
      try {
        for await (const ev of dealer.events) events.push(ev.type);
      } catch {
        // closed
      }
    })();
    dealer.connect(t.daemon.broker.endpoint);
    closers.push(() => dealer.close());
    return { dealer, events };
  }
  const closers: Array<() => void> = [];
  afterAll(() => {
    for (const c of closers) c();
  });

  it('refuses a peer whose key is not on the allow-list, and one without CURVE', async () => {
    const before = t.daemon.broker.stats().keysRefused;
    const stranger = watchedDealer({ serverKey: serverKey(), ...curveKeyPair() });
    void stranger.dealer.send(JSON.stringify({ v: 1, type: 'worker_ready', worker_id: 'legit-1', capacity: 8 })).catch(() => undefined);
    await waitFor(() => stranger.events.includes('handshake:error:auth') && t.daemon.broker.stats().keysRefused > before, {
      what: 'ZAP refusal',
      timeoutMs: 10_000,
    });

    // without CURVE the handshake cannot succeed: a mechanism mismatch (docs/protocol.md §13)
    const plain = watchedDealer();
    void plain.dealer.send(JSON.stringify({ v: 1, type: 'worker_ready', worker_id: 'legit-1', capacity: 8 })).catch(() => undefined);
    await waitFor(() => plain.events.includes('handshake:error:protocol'), { what: 'plain connection refused', timeoutMs: 10_000 });

    // a wrong daemon public key: every handshake fails without detail, retried, and the daemon's
    // ZAP handler is never asked
    const keysRefused = t.daemon.broker.stats().keysRefused;
    const wrongServer = watchedDealer({ ...intruderCurve(), serverKey: curveKeyPair().publicKey });
    void wrongServer.dealer.send(JSON.stringify({ v: 1, type: 'worker_ready', worker_id: 'legit-1', capacity: 8 })).catch(() => undefined);
    await waitFor(() => wrongServer.events.filter((e) => e === 'handshake:error:other').length >= 3, {
      what: 'failed handshakes retried',
      timeoutMs: 10_000,
    });
    expect(wrongServer.events).not.toContain('handshake:error:auth');
    expect(t.daemon.broker.stats().keysRefused).toBe(keysRefused);

    for (const p of [stranger, plain, wrongServer]) expect(p.events).not.toContain('handshake');
    expect(
      t.daemon.broker
        .workers()
        .map((w) => w.workerId)
        .sort(),
    ).toEqual(['legit-1', 'legit-2']);
  });

  it('refuses a valid key registering another worker id, and counts the takeover attempt', async () => {
    const before = t.daemon.broker.stats().takeoverRefused;
    const p = peer(intruderCurve());
    // the intruder's own token, claiming a live worker's id
    await p.sendJson({
      v: 1,
      type: 'worker_ready',
      worker_id: 'legit-1',
      capacity: 1024,
      auth: { scheme: 'token', credential: intruder.token },
    });
    // an id that is not on the allow-list at all
    await p.sendJson({
      v: 1,
      type: 'worker_ready',
      worker_id: 'ghost',
      capacity: 1024,
      auth: { scheme: 'token', credential: intruder.token },
    });
    const errors = await p.waitFor('error', 2, 5_000);
    expect(errors.map((e) => e.code)).toEqual(['unauthorized', 'unauthorized']);
    expect(t.daemon.broker.stats().takeoverRefused).toBe(before + 1);
    expect(p.ofType('worker_welcome')).toHaveLength(0);
    // the live workers keep their routes: a turn still commits on one of them
    expect(['legit-1', 'legit-2']).toContain(await commitWithin('after-takeover'));
  });

  it('drops a revoked worker without a restart, re-dispatches its turn and refuses it from then on', async () => {
    // keep the legit workers busy, then add rev-1: the next turn can only land on it
    const { daemon } = t;
    const busy = await Promise.all(
      ['legit-1', 'legit-2'].map((s) => sendEvent(daemon.database.db, actorKey('busy', s), { delayMs: 2_500 })),
    );
    await waitFor(() => busy.every((b) => daemon.runtime.workers.workerOf(b.eventId) !== undefined), { what: 'legit workers busy' });
    const heard: DaemonMessage[] = [];
    await startLegit('rev-1', { onReceive: (m) => void heard.push(m) });
    const { eventId } = await sendEvent(daemon.database.db, actorKey('revoke', 's'), { delayMs: 2_000, text: 'r' });
    await waitFor(() => daemon.runtime.workers.workerOf(eventId) === 'rev-1', { what: 'turn on rev-1', timeoutMs: 10_000 });
    // the route is chosen before the frame is sent: wait for rev-1 to have heard its turn
    await waitFor(() => heard.some((m) => m.type === 'turn_start' && m.event.id === eventId), { what: 'turn_start heard by rev-1' });

    const heardBefore = heard.length;
    expect(revokeWorkerKey(paths(), 'rev-1')).toBe(true);
    // the allow-list poll notices the change: no restart, no reconnect
    await waitFor(() => !daemon.broker.isRegistered('rev-1'), { what: 'rev-1 dropped', intervalMs: 10 });
    expect(daemon.runtime.workers.isReady('rev-1')).toBe(false);
    // told once why; then, on the connection that stays open, every worker_ready it keeps sending
    // is refused, and its other messages (its turn's progress) are answered not_registered
    const errors = () => heard.slice(heardBefore).flatMap((m) => (m.type === 'error' ? [`${m.code}: ${m.message}`] : []));
    const refusedReady = 'unauthorized: worker id not on the allow-list';
    await waitFor(() => errors().filter((e) => e === refusedReady).length >= 2, { what: 'rev-1 refused again and again' });
    expect(errors()[0]).toBe('unauthorized: revoked: key revoked or re-issued');
    for (const e of errors().slice(1))
      expect([refusedReady, 'not_registered']).toContain(e.replace(/^not_registered: .*/, 'not_registered'));
    expect(heard.slice(heardBefore).filter((m) => m.type === 'worker_welcome' || m.type === 'turn_start')).toEqual([]);

    const committedBy = await waitFor(
      async () =>
        (
          await daemon.database.pool.query<{ worker_id: string }>(
            `select worker_id from corral.turns where event_id = $1 and status = 'succeeded'`,
            [eventId],
          )
        ).rows.filter(Boolean).length > 0 &&
        (
          await daemon.database.pool.query<{ worker_id: string }>(
            `select worker_id from corral.turns where event_id = $1 and status = 'succeeded'`,
            [eventId],
          )
        ).rows,
      { what: 'revoked turn committed elsewhere', timeoutMs: LEGIT_COMMIT_MS },
    );
    expect(committedBy.map((r) => r.worker_id)).toHaveLength(1);
    expect(committedBy[0]!.worker_id).not.toBe('rev-1');
    // the revoked worker keeps trying to register: every attempt is refused
    expect(daemon.broker.isRegistered('rev-1')).toBe(false);
    await workers.get('rev-1')!.stop();
    workers.delete('rev-1');
  });

  it("binds a worker id to its own key: another key's connection with the worker's token is refused unauthorized", async () => {
    const victim = addWorkerKey(paths(), serverKey(), 'victim');
    await waitFor(() => t.daemon.security!.authenticator.has('victim'), { what: 'victim allow-listed' });
    const before = t.daemon.broker.stats().registrationRefused;
    // the intruder's keypair (admitted by ZAP) with the victim's token: the token alone is refused
    const p = peer(intruderCurve());
    await p.sendJson({ v: 1, type: 'worker_ready', worker_id: 'victim', capacity: 1, auth: { scheme: 'token', credential: victim.token } });
    expect(await p.next('error')).toMatchObject({ code: 'unauthorized', message: expect.stringMatching(/prove the key/) });
    // and with the key scheme it is challenged, but can only prove its own key
    const answer = await p.registerWithKey({ ...victim, secret_key: intruder.secret_key });
    expect(answer).toMatchObject({ type: 'error', code: 'unauthorized', message: 'bad key proof' });
    expect(t.daemon.broker.isRegistered('victim')).toBe(false);
    expect(p.ofType('worker_welcome')).toHaveLength(0);
    expect(t.daemon.broker.stats().registrationRefused).toBe(before + 2);
    // the victim's own key registers it
    const own = peer(workerCredentials(victim).curve);
    expect(await own.registerWithKey(victim)).toMatchObject({ type: 'worker_welcome', worker_id: 'victim' });
    expect(revokeWorkerKey(paths(), 'victim')).toBe(true);
    await waitFor(() => !t.daemon.broker.isRegistered('victim'), { what: 'victim revoked' });
    await Promise.all([p.close(), own.close()]);
  });

  it('refuses an oversized event at enqueue and writes nothing', async () => {
    const { daemon } = t;
    const key = actorKey('big', 's');
    await expect(sendEvent(daemon.database.db, key, { text: 'x'.repeat(MAX_EVENT_BYTES + 1) })).rejects.toMatchObject({
      code: 'payload_too_large',
    });
    await expect(sendEvent(daemon.database.db, key, { text: 'nul \u0000' })).rejects.toMatchObject({
      code: 'invalid_argument',
    });
    const jobs = await daemon.database.pool.query(`select 1 from pgboss.job where singleton_key = 'big/s'`);
    expect(jobs.rowCount).toBe(0);
  });

  it('survives garbage, oversized frames, overlong turn_refs and floods; workers stay bounded; a legit turn commits in time', async () => {
    const { daemon } = t;
    const broker = daemon.broker;
    const rssBefore = process.memoryUsage().rss;
    const before = broker.stats();

    // 1. an admitted but unregistered connection sends garbage, oversized frames and overlong refs
    const noisy = peer(intruderCurve());
    for (let i = 0; i < 200; i++) await noisy.sendRaw(Buffer.from([0xff, 0x00, i & 0xff]));
    await noisy.sendRaw(Buffer.alloc(MAX_MESSAGE_BYTES + 10, 0x61)); // refused and counted
    const longRef = { ...makeTurnRef(), agent_uid: 'a'.repeat(40_000) };
    await noisy.sendJson({ v: 1, type: 'turn_result', turn_ref: longRef, messages: [] });
    const paddedRef = { ...makeTurnRef(), padding: 'p'.repeat(30_000) };
    await noisy.sendJson({ v: 1, type: 'turn_progress', turn_ref: paddedRef });
    // ~24 MB of overlong turn_refs: refused by the schema, logged truncated and rate-limited
    const bigRef = JSON.stringify({
      v: 1,
      type: 'turn_result',
      turn_ref: { ...makeTurnRef(), agent_uid: 'a'.repeat(60_000) },
      messages: [],
    });
    for (let i = 0; i < 400; i++) await noisy.sendRaw(bigRef);
    // 2. a flood of registrations with distinct ids (none allow-listed)
    for (let i = 0; i < 1_000; i++) {
      await noisy.sendJson({
        v: 1,
        type: 'worker_ready',
        worker_id: `flood-${i}`,
        capacity: 1024,
        auth: { scheme: 'token', credential: 'x' },
      });
    }
    await waitFor(() => broker.stats().received >= before.received + 1_600, { what: 'flood received', timeoutMs: 30_000 });
    const afterNoise = broker.stats();
    expect(afterNoise.oversize).toBe(before.oversize + 1);
    expect(afterNoise.registrationRefused).toBeGreaterThanOrEqual(before.registrationRefused + 1_000);
    // answers are rate-limited per connection: most of the flood is counted, not answered
    expect(afterNoise.refusalsSuppressed).toBeGreaterThan(before.refusalsSuppressed + 1_300);
    expect(noisy.received.length).toBeLessThan(100);

    // 3. a frame over twice the limit: libzmq drops that connection; the broker keeps serving
    const huge = peer(intruderCurve());
    await huge.sendRaw(Buffer.alloc(MAX_MESSAGE_BYTES * 3, 0x62));

    // 4. a registered insider floods forged replies for deliveries this daemon never made
    const insider = peer(intruderCurve());
    expect(await insider.registerWithKey(intruder)).toMatchObject({ type: 'worker_welcome' });
    const xactBefore = await commits();
    for (let i = 0; i < 3_000; i++) {
      await insider.sendJson({ v: 1, type: 'turn_result', turn_ref: makeTurnRef({ agent_uid: 'legit' }), messages: [] });
    }
    // each is answered (backpressure may drop some answers; the count is what matters)
    await insider.waitFor('turn_rejected', 1_000, 20_000);

    // 5. many idle connections with one key: refused past its per-key limit (the daemon's cap stays free)
    const idle: RawPeer[] = [];
    for (let i = 0; i < 100; i++) idle.push(peer(intruderCurve()));
    await waitFor(() => broker.stats().keyConnectionsRefused >= 90, { what: 'per-key connection limit enforced', timeoutMs: 15_000 });
    expect(broker.stats().connections).toBeLessThan(20);

    // the broker is alive, the legit workers still registered, and a legit turn commits in time
    expect(broker.stats().state).toBe('running');
    expect(broker.isRegistered('legit-1') && broker.isRegistered('legit-2')).toBe(true);
    const by = await commitWithin('after-flood');
    expect(['legit-1', 'legit-2']).toContain(by);
    // most forged replies were refused before any transaction
    expect((await commits()) - xactBefore).toBeLessThan(1_500);
    // corral.workers holds only ids that were allow-listed
    expect((await workerIds()).filter((id) => !['legit-1', 'legit-2', 'rev-1', 'victim', 'intruder'].includes(id))).toEqual([]);
    await Promise.all(idle.map((p) => p.close()));
    const rssGrowthMb = (process.memoryUsage().rss - rssBefore) / 1024 / 1024;
    console.info(`hostile flood: rss growth ${rssGrowthMb.toFixed(1)} MB, forged-reply transactions ${(await commits()) - xactBefore}`);
    expect(rssGrowthMb).toBeLessThan(300);
  });

  async function commits(): Promise<number> {
    const r = await t.daemon.database.pool.query<{ n: string }>(
      'select xact_commit::text as n from pg_stat_database where datname = current_database()',
    );
    return Number(r.rows[0]!.n);
  }
});
