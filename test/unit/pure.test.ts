import { describe, expect, it } from 'vitest';
import { actorKey, formatActorKey, parseActorKey } from '../../src/base/actor-key.ts';
import { backoffDelayMs, retryWindowSeconds } from '../../src/base/backoff.ts';
import { contextLimits, DEFAULTS, loadConfig } from '../../src/config.ts';
import { DEFAULT_PROGRESS_INTERVAL_MS } from '../../src/fabric/protocol.ts';
import { checkFence, type Fence, type FenceRows } from '../../src/db/turns/fence.ts';
import { CorralError } from '../../src/base/errors.ts';
import { handBackBackoffMs, WorkerPool } from '../../src/runtime/worker-pool.ts';
import { localWorkerId } from '../../src/host/daemon.ts';
import { StopRequests } from '../../src/cli/stop-requests.ts';
import { agentInScope, agentPatternProblem } from '../../src/base/agent-scope.ts';
import { daemonHeartbeatMs } from '../../src/db/operations/daemons.ts';
import { daemonState, effectiveWorkerStatus } from '../../src/ops/status.ts';
import { piecesOf } from '../../src/worker/example.ts';

describe('actor keys', () => {
  it('round-trips and rejects malformed keys with invalid_actor_key', () => {
    expect(formatActorKey(parseActorKey('agent-1/s:2'))).toBe('agent-1/s:2');
    for (const bad of ['', 'a', 'a/b/c', '/b', 'a/', 'a b/c', `${'x'.repeat(129)}/s`]) {
      expect(() => parseActorKey(bad)).toThrow(CorralError);
      try {
        parseActorKey(bad);
      } catch (e) {
        expect((e as CorralError).code).toBe('invalid_actor_key');
      }
    }
    expect(() => actorKey('a/b', 'c')).toThrow(/agent_uid/);
  });
});

describe('backoff', () => {
  it('stays within [base·2^(n-1)/2, min(max, base·2^(n-1))]', () => {
    for (let n = 1; n < 40; n++) {
      for (const r of [0, 0.5, 0.999]) {
        const d = backoffDelayMs(n, { baseMs: 100, maxMs: 5_000 }, () => r);
        const ceiling = Math.min(5_000, 100 * 2 ** (n - 1));
        expect(d).toBeGreaterThanOrEqual(ceiling / 2);
        expect(d).toBeLessThanOrEqual(ceiling);
      }
    }
  });

  it('describes the 5–120 s retry contract', () => {
    expect([1, 2, 3, 4, 5, 6].map((n) => retryWindowSeconds(n, 5, 120))).toEqual([
      { min: 5, max: 10 },
      { min: 10, max: 20 },
      { min: 20, max: 40 },
      { min: 40, max: 80 },
      { min: 80, max: 120 },
      { min: 120, max: 120 },
    ]);
  });
});

describe('config', () => {
  it('defaults to the 5–120 s retry policy and continue mode', () => {
    const c = loadConfig({}, {});
    expect([c.retryDelaySeconds, c.retryDelayMaxSeconds, c.retryLimit, c.deadLetterMode]).toEqual([5, 120, 5, 'continue']);
  });

  it('reads the environment, lets flags win, and names the bad variable', () => {
    expect(loadConfig({}, { CORRAL_LEASE_MS: '20000' }).leaseMs).toBe(20_000);
    expect(loadConfig({ leaseMs: 30_000 }, { CORRAL_LEASE_MS: '20000' }).leaseMs).toBe(30_000);
    expect(() => loadConfig({}, { CORRAL_LEASE_MS: '1000' })).toThrow(/progressIntervalMs must be shorter/);
    expect(() => loadConfig({}, { CORRAL_DEAD_LETTER_MODE: 'maybe' })).toThrow(/CORRAL_DEAD_LETTER_MODE/);
    expect(() => loadConfig({}, { CORRAL_LEASE_MS: 'soon' })).toThrow(/CORRAL_LEASE_MS/);
    expect(() => loadConfig({}, { CORRAL_ENDPOINT: 'http://x' })).toThrow(/CORRAL_ENDPOINT/);
  });

  it('context and RPC limits: defaults for LLM turns, from the environment, bytes capped by the wire limit', () => {
    const c = loadConfig({}, {});
    expect(contextLimits(c)).toEqual({ maxMessages: 50, maxBytes: 65_536 });
    expect([c.rpcConcurrency, c.rpcTimeoutMs]).toEqual([8, 10_000]);
    // one progress default for daemon, protocol and SDK
    expect(c.progressIntervalMs).toBe(DEFAULT_PROGRESS_INTERVAL_MS);
    const e = loadConfig(
      {},
      { CORRAL_CONTEXT_MESSAGES: '0', CORRAL_CONTEXT_BYTES: '1000', CORRAL_RPC_CONCURRENCY: '2', CORRAL_RPC_TIMEOUT_MS: '500' },
    );
    expect(contextLimits(e)).toEqual({ maxMessages: 0, maxBytes: 1000 });
    expect([e.rpcConcurrency, e.rpcTimeoutMs]).toEqual([2, 500]);
    expect(contextLimits(loadConfig({ maxMessageBytes: 64 * 1024, maxEventBytes: 16 * 1024 }, {})).maxBytes).toBe(16 * 1024);
    expect(() => loadConfig({}, { CORRAL_CONTEXT_MESSAGES: '-1' })).toThrow(/CORRAL_CONTEXT_MESSAGES/);
  });
});

describe('checkFence', () => {
  const fence: Fence = {
    agentUid: 'a',
    sessionId: 's',
    activationUid: 'act-1',
    actorEpoch: 3,
    eventId: 'ev-1',
    revision: 1,
    deliveryId: 'd-1',
  };
  const rows = (over: { d?: object; a?: object; leaseAlive?: boolean; counter?: number; jobActive?: boolean } = {}): FenceRows =>
    ({
      delivery: {
        deliveryId: 'd-1',
        activationUid: 'act-1',
        agentUid: 'a',
        sessionId: 's',
        actorEpoch: 3,
        eventId: 'ev-1',
        revision: 1,
        state: 'accepted',
        workerId: 'w-1',
        ...over.d,
      },
      activation: {
        activationUid: 'act-1',
        agentUid: 'a',
        sessionId: 's',
        actorEpoch: 3,
        currentEventId: 'ev-1',
        revision: 1,
        status: 'active',
        endReason: null,
        ...over.a,
      },
      leaseAlive: over.leaseAlive ?? true,
      actorEpochCounter: over.counter ?? 3,
      jobActive: over.jobActive ?? true,
    }) as unknown as FenceRows;

  it('holds only when everything is equal and the lease is alive', () => {
    expect(checkFence(fence, rows())).toBeNull();
  });

  it('names the reason of each mismatch', () => {
    expect(checkFence(fence, { ...rows(), delivery: undefined })).toBe('unknown_delivery');
    expect(checkFence({ ...fence, sessionId: 'other' }, rows())).toBe('wrong_actor');
    expect(checkFence({ ...fence, actorEpoch: 2 }, rows())).toBe('stale_epoch');
    expect(checkFence({ ...fence, eventId: 'ev-0' }, rows())).toBe('stale_event');
    expect(checkFence({ ...fence, revision: 0 }, rows())).toBe('stale_revision');
    expect(checkFence(fence, rows({ leaseAlive: false }))).toBe('lease_expired');
    expect(checkFence(fence, rows({ jobActive: false }))).toBe('job_not_active');
    expect(checkFence(fence, rows(), 'w-1')).toBeNull();
    expect(checkFence(fence, rows(), 'w-2')).toBe('wrong_worker');
    expect(checkFence(fence, rows({ d: { state: 'completed' } }))).toBe('already_committed');
    expect(checkFence(fence, rows({ d: { state: 'superseded' } }))).toBe('delivery_superseded');
    expect(checkFence(fence, rows({ a: { status: 'failed', endReason: 'lease_expired' }, counter: 4 }))).toBe('stale_epoch');
    expect(checkFence(fence, rows({ a: { status: 'failed', endReason: 'lease_expired' } }))).toBe('activation_not_live');
    expect(checkFence(fence, rows({ a: { status: 'failed', endReason: 'cancelled' }, d: { state: 'failed' } }))).toBe('cancelled');
  });
});

describe('WorkerPool', () => {
  it('removes a worker given its registration only while it is still in it: a send that failed on an old route does not drop a new one', () => {
    const pool = new WorkerPool({ initialWindow: 4 });
    pool.register('w1', 2, 0, 'run-1');
    const first = pool.registrationOf('w1')!;
    // it reconnects (same run) while a send to its old route is under way
    pool.register('w1', 2, 1, 'run-1');
    const second = pool.registrationOf('w1')!;
    expect(second).not.toBe(first);
    expect(pool.remove('w1', first)).toEqual([]);
    expect(pool.isReady('w1')).toBe(true);
    expect(pool.acquire('e1', 'agent', 1)).toBe('w1');
    // the registration it is in now does remove it, with the events it held
    expect(pool.remove('w1', second)).toEqual(['e1']);
    expect(pool.isReady('w1')).toBe(false);
    expect(pool.registrationOf('w1')).toBeUndefined();
  });

  it('reserves slots on the least loaded ready worker and frees them', () => {
    const pool = new WorkerPool({ initialWindow: 4 });
    pool.register('w1', 2, 0);
    pool.register('w2', 1, 0);
    expect(pool.freeSlots(0)).toBe(3);
    expect(pool.acquire('e1', 'agent', 0)).toBe('w1');
    expect(['w1', 'w2']).toContain(pool.acquire('e2', 'agent', 0));
    pool.acquire('e3', 'agent', 0);
    expect(pool.freeSlots(0)).toBe(0);
    expect(pool.acquire('e4', 'agent', 0)).toBeUndefined();
    expect(pool.release('e1')).toBe('w1');
    expect(pool.freeSlots(0)).toBe(1);
  });

  it("moves a slot to another id on the same worker (a finishing turn's slot kept for its actor's next turn)", () => {
    const pool = new WorkerPool({ initialWindow: 4 });
    pool.register('w1', 1, 0);
    pool.register('w2', 1, 0);
    expect(pool.acquire('e1', 'agent', 0)).toBe('w1');
    expect(pool.rekey('e1', 'next:e1')).toBe('w1');
    expect(pool.workerOf('e1')).toBeUndefined();
    expect(pool.workerOf('next:e1')).toBe('w1');
    // still taken: the one free slot is w2's
    expect(pool.freeSlots(0)).toBe(1);
    expect(pool.rekey('next:e1', 'e2')).toBe('w1');
    expect(pool.release('e2')).toBe('w1');
    expect(pool.freeSlots(0)).toBe(2);
    // nothing held: nothing moved, nothing taken
    expect(pool.rekey('gone', 'e3')).toBeUndefined();
    expect(pool.workerOf('e3')).toBeUndefined();
    // its worker restarted meanwhile: the slot went with its run
    pool.acquire('e4', 'agent', 0);
    const w = pool.rekey('e4', 'next:e4')!;
    expect(pool.register(w, 1, 1).lostEvents).toEqual(['next:e4']);
    expect(pool.rekey('next:e4', 'e5')).toBeUndefined();
    expect(pool.freeSlots(1)).toBe(2);
  });

  it('marks silent workers stale and reports their in-flight events; re-registration reports lost events', () => {
    const pool = new WorkerPool({ initialWindow: 4 });
    pool.register('w1', 2, 0);
    pool.acquire('e1', 'agent', 0);
    expect(pool.takeStale(500, 1_000)).toEqual([]);
    expect(pool.takeStale(1_000, 1_000)).toEqual([{ id: 'w1', events: ['e1'] }]);
    expect(pool.freeSlots(0)).toBe(0);
    expect(pool.register('w1', 2, 2_000)).toEqual({ restarted: true, lostEvents: ['e1'] });
    expect(pool.freeSlots(0)).toBe(2);
  });

  it('tells a reconnect of the same worker run (kept turns) from a restart (lost turns)', () => {
    const pool = new WorkerPool({ initialWindow: 4 });
    pool.register('w1', 2, 0, 'run-a');
    pool.acquire('e1', 'agent', 0);
    expect(pool.register('w1', 2, 10, 'run-a')).toEqual({ restarted: false, lostEvents: [] });
    expect(pool.workerOf('e1')).toBe('w1');
    expect(pool.freeSlots(0)).toBe(1);
    expect(pool.register('w1', 2, 20, 'run-b')).toEqual({ restarted: true, lostEvents: ['e1'] });
    expect(pool.workerOf('e1')).toBeUndefined();
  });

  it('gives a scoped worker turns of its agents only', () => {
    const pool = new WorkerPool({ initialWindow: 4 });
    pool.register('support', 4, 0, 'a', ['support-*']);
    pool.register('any', 1, 0, 'b');
    expect(pool.acquire('e1', 'billing', 0)).toBe('any');
    expect(pool.acquire('e2', 'billing', 0)).toBeUndefined();
    expect(pool.acquire('e3', 'support-eu', 0)).toBe('support');
    expect(pool.scopeOf('support')).toEqual(['support-*']);
  });

  it('gives a worker its window of turns: a few at first, one more per turn accepted or committed, a few again after a hand-back', () => {
    const pool = new WorkerPool({ initialWindow: 4 });
    pool.register('w', 10, 0, 'a');
    const take = (n: number, from: number) => Array.from({ length: n }, (_, i) => pool.acquire(`e${from + i}`, 'x', 0));
    expect(take(4, 0).every((w) => w === 'w')).toBe(true);
    expect(pool.acquire('more', 'x', 0)).toBeUndefined();
    expect(pool.freeSlots(0)).toBe(0);
    pool.accepted('w');
    pool.committed('w');
    expect(take(2, 10)).toEqual(['w', 'w']);
    expect(pool.acquire('more', 'x', 0)).toBeUndefined();
    for (let i = 0; i < 20; i++) pool.committed('w');
    expect(pool.freeSlots(0)).toBe(10 - 4 - 2);
    pool.handedBack('w', 0);
    expect(pool.freeSlots(1_000_000)).toBe(0);
  });

  it('offers a worker in hand-back back-off a turn only when no peer could take it; a commit ends the back-off', () => {
    expect([1, 2, 3, 20].map(handBackBackoffMs)).toEqual([200, 400, 800, 60_000]);
    const pool = new WorkerPool({ initialWindow: 4 });
    pool.register('bad', 8, 0, 'a');
    pool.register('good', 1, 0, 'b');
    pool.handedBack('bad', 0);
    expect(pool.freeSlots(100)).toBe(1);
    expect(pool.acquire('e1', 'x', 100)).toBe('good');
    // the peer is full: the turn waits for it rather than going to the worker in back-off
    expect(pool.acquire('e2', 'x', 100)).toBeUndefined();
    expect(pool.acquire('e2', 'x', 200)).toBe('bad');
    pool.handedBack('bad', 200);
    pool.release('e2');
    expect(pool.acquire('e2', 'x', 500)).toBeUndefined();
    expect(pool.acquire('e2', 'x', 600)).toBe('bad');
    pool.committed('bad');
    expect(pool.acquire('e3', 'x', 600)).toBe('bad');
    // alone, a worker in back-off still gets the turns: there is nobody to prefer
    const lone = new WorkerPool({ initialWindow: 4 });
    lone.register('only', 1, 0, 'a');
    lone.handedBack('only', 0);
    expect(lone.acquire('e1', 'x', 1)).toBe('only');
  });
});

describe('isConnectionError', () => {
  it('recognises connection loss, also when wrapped as the cause of a query error', async () => {
    const { isConnectionError } = await import('../../src/base/errors.ts');
    const terminated = Object.assign(new Error('terminating connection due to administrator command'), { code: '57P01' });
    expect(isConnectionError(terminated)).toBe(true);
    expect(isConnectionError(Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED' }))).toBe(true);
    expect(isConnectionError(new Error('Failed query: select 1', { cause: terminated }))).toBe(true);
    expect(isConnectionError(new Error('Failed query: select 1', { cause: Object.assign(new Error('dup'), { code: '23505' }) }))).toBe(
      false,
    );
    expect(isConnectionError(new Error('anything else'))).toBe(false);
    // the embedded server's Unix-domain socket while the server is down: its file is gone
    const noSocket = Object.assign(new Error('connect ENOENT /h/pg/run/.s.PGSQL.5432'), { code: 'ENOENT', syscall: 'connect' });
    expect(isConnectionError(noSocket)).toBe(true);
    expect(isConnectionError(Object.assign(new Error('no such file'), { code: 'ENOENT', syscall: 'open' }))).toBe(false);
  });
});

describe('database error classification', () => {
  it('looks through wrappers, in one place', async () => {
    const { CorralError, isDatabaseUnavailable, isRetryableTransactionError, sqlState } = await import('../../src/base/errors.ts');
    const wrapped = (code: string) => new Error('Failed query: select 1', { cause: Object.assign(new Error('x'), { code }) });
    expect(sqlState(wrapped('40P01'))).toBe('40P01');
    expect(sqlState(new Error('plain'))).toBeUndefined();
    expect(isRetryableTransactionError(wrapped('40001'))).toBe(true);
    expect(isRetryableTransactionError(wrapped('23505'))).toBe(false);
    expect(isDatabaseUnavailable(wrapped('3D000'))).toBe(true); // no such database
    expect(isDatabaseUnavailable(wrapped('28P01'))).toBe(true); // wrong password
    expect(isDatabaseUnavailable(Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' }))).toBe(true);
    expect(isDatabaseUnavailable(wrapped('42P01'))).toBe(false);
    expect(new CorralError('database_unavailable', 'x').retryable).toBe(true);
    expect(new CorralError('invalid_argument', 'x').retryable).toBe(false);
  });
});

describe('local worker ids', () => {
  it('are <host>-local-<n> on the default endpoint, and carry a tag of any other endpoint', () => {
    expect(localWorkerId('box', DEFAULTS.endpoint, 2)).toBe('box-local-2');
    const a = localWorkerId('box', 'tcp://127.0.0.1:5600', 1);
    const b = localWorkerId('box', 'tcp://127.0.0.1:5601', 1);
    expect(a).toMatch(/^box-local-[0-9a-f]{6}-1$/);
    expect(b).not.toBe(a);
    // stable across restarts: the same endpoint gives the same id (and so the same key file)
    expect(localWorkerId('box', 'tcp://127.0.0.1:5600', 1)).toBe(a);
    // a host name is made safe for an id
    expect(localWorkerId('my host/x', DEFAULTS.endpoint, 1)).toBe('my-host-x-local-1');
  });
});

describe('stop requests', () => {
  const at = (times: number[]) => {
    let i = 0;
    return new StopRequests(() => times[i++]!, 1_000);
  };

  it('the first request stops; echoes of the first signal and the launcher leaving do not force', () => {
    // Ctrl-C under npm: the terminal's SIGINT, npm's forwarded copy 3 ms later, npm exiting
    const r = at([0, 3, 500, 5_000]);
    expect(r.requested).toBe(false);
    expect(r.next('signal')).toBe('stop');
    expect(r.requested).toBe(true);
    expect(r.next('signal')).toBe('ignore');
    expect(r.next('parent-gone')).toBe('ignore');
    // a real second Ctrl-C, seconds later
    expect(r.next('signal')).toBe('force');
  });

  it('a launcher gone first starts the stop; the first signal after it only joins it', () => {
    const r = at([0, 10, 2_000]);
    expect(r.next('parent-gone')).toBe('stop');
    expect(r.next('signal')).toBe('ignore');
    expect(r.next('signal')).toBe('force');
  });
});

describe('daemon liveness', () => {
  const seen = new Date(100_000);
  it('a daemon silent past its own stale timeout is dead; a clean stop is stopped', () => {
    expect(daemonState({ stoppedAt: null, lastSeenAt: seen, staleMs: 3_000 }, 103_000)).toBe('running');
    expect(daemonState({ stoppedAt: null, lastSeenAt: seen, staleMs: 3_000 }, 103_001)).toBe('dead');
    expect(daemonState({ stoppedAt: seen, lastSeenAt: seen, staleMs: 3_000 }, 100_001)).toBe('stopped');
  });

  it('a ready worker silent past the stale timeout is stale, whatever its row says', () => {
    expect(effectiveWorkerStatus('ready', seen, 110_000, 10_000)).toBe('ready');
    expect(effectiveWorkerStatus('ready', seen, 110_001, 10_000)).toBe('stale');
    expect(effectiveWorkerStatus('gone', seen, 900_000, 10_000)).toBe('gone');
  });

  it('heartbeats come four times per stale timeout, at most every 5 s', () => {
    expect(daemonHeartbeatMs(10_000)).toBe(2_500);
    expect(daemonHeartbeatMs(3_000)).toBe(750);
    expect(daemonHeartbeatMs(600_000)).toBe(5_000);
    expect(daemonHeartbeatMs(100)).toBe(50);
  });
});

describe('agent scopes', () => {
  it('matches exact agents and prefixes ending in *; no scope is every agent', () => {
    expect(agentInScope(undefined, 'any')).toBe(true);
    expect(agentInScope(['*'], 'any')).toBe(true);
    expect(agentInScope(['support-*', 'billing'], 'support-eu')).toBe(true);
    expect(agentInScope(['support-*', 'billing'], 'billing')).toBe(true);
    expect(agentInScope(['support-*', 'billing'], 'billing-2')).toBe(false);
    expect(agentInScope(['support-*'], 'support')).toBe(false);
    expect(agentInScope([], 'any')).toBe(false);
  });

  it('refuses patterns that no agent_uid could match', () => {
    for (const ok of ['a', 'support-*', '*', `${'x'.repeat(128)}*`]) expect(agentPatternProblem(ok)).toBeUndefined();
    for (const bad of ['', 'a/b', 'a*b', '**', 'sp ace', `${'x'.repeat(129)}`]) expect(agentPatternProblem(bad)).toMatch(/pattern/);
  });
});

describe('the example worker’s streamed reply', () => {
  it('cuts a text into at most N pieces of whole words that join back to it exactly', () => {
    const text = 'echo: one  two\tthree\nfour five six seven eight nine ten eleven twelve ';
    const pieces = piecesOf(text, 10);
    expect(pieces).toHaveLength(10);
    expect(pieces.join('')).toBe(text);
    // every cut falls where a blank meets a word
    expect(pieces.slice(1).every((p) => /^\S/.test(p))).toBe(true);
    expect(pieces.slice(0, -1).every((p) => /\s$/.test(p))).toBe(true);
    expect(piecesOf('echo: hi', 10)).toEqual(['echo: ', 'hi']);
    expect(piecesOf('  lead', 10).join('')).toBe('  lead');
  });
});
