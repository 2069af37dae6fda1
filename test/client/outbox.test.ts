/**
 * The client's `sinks` and `outbox`: the operators' use-cases (src/outbox/sinks.ts, src/outbox/operations.ts)
 * as an application calls them, on a real database; the messages written by SQL, in every state.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connect, type Corral } from '../../src/client/index.ts';
import { setSinkDisabled } from '../../src/db/outbox/sinks.ts';
import { errorCodeOf } from '../helpers/capture.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { insertOutboxMessage, type OutboxRowInput } from '../ops/helpers.ts';

const codeOf = errorCodeOf;

describe('the client: sinks and outbox', () => {
  const tdb = useTestDatabase();
  let corral: Corral;
  const insert = (r: OutboxRowInput) => insertOutboxMessage(tdb.client, r);

  beforeAll(async () => {
    corral = await connect({ databaseUrl: tdb.url, maxConnections: 2 });
  });
  afterAll(async () => {
    await corral?.close();
  });

  it('adds, lists, enables and removes sinks; lists, shows, replays and discards messages', async () => {
    const added = await corral.sinks.add({ name: 'app', url: 'https://app.example.com/in', timeout: 2_500, concurrency: 2 });
    expect(added).toMatchObject({ name: 'app', timeoutMs: 2500, concurrency: 2 });
    expect(added.secret).toMatch(/^whsec_/);
    expect(await codeOf(corral.sinks.add({ name: 'app', url: 'https://app.example.com/in' }))).toBe('already_exists');
    expect(await codeOf(corral.sinks.add({ name: 'x', url: 'https://x.example/', timeout: 50 }))).toBe('invalid_argument');
    const dead = await insert({ sink: 'app', state: 'dead', attempts: 3, lastStatus: 500 });
    const pending = await insert({ sink: 'app', state: 'pending' });
    expect((await corral.sinks.list()).find((s) => s.name === 'app')).toMatchObject({ pending: 1, dead: 1 });
    expect((await corral.outbox.list({ sink: 'app', states: ['dead'] })).messages.map((m) => m.id)).toEqual([dead]);
    expect((await corral.outbox.show(dead)).body).toBe('{"hello":"app"}');
    expect((await corral.outbox.replay({ ids: [dead] })).done).toEqual([dead]);
    expect(await codeOf(corral.outbox.discard({ sink: 'app' } as never))).toBe('invalid_argument');
    expect((await corral.outbox.discard({ all: true, sink: 'app' })).done).toEqual([dead, pending]);
    await setSinkDisabled(tdb.database.db, 'app', 'HTTP 410 Gone');
    expect((await corral.sinks.enable('app')).disabledAt).toBeNull();
    await insert({ sink: 'app', state: 'pending' });
    expect(await codeOf(corral.sinks.remove('app'))).toBe('invalid_argument');
    expect(await corral.sinks.remove('app', { force: true })).toEqual({ name: 'app', pendingDropped: 1, messagesRemoved: 3 });
    expect(await codeOf(corral.sinks.remove('app'))).toBe('not_found');
    await corral.close();
    expect(await codeOf(corral.outbox.list())).toBe('closed');
  });
});
