/**
 * `corral.send_event` from SQL (psql, or any language's driver): inside a transaction it commits a
 * turn as `send` does, in order with the client's events; rolled back, nothing. Its checks hold
 * for SQL callers, with errors of their own SQLSTATEs.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SEND_ERRORS } from '../../src/client/index.ts';
import { startClientSetup, jobsOf, replies, type ClientSetup } from './helpers.ts';
import { waitFor } from '../helpers/wait.ts';

const LIMIT = 1024;
let s: ClientSetup;

beforeAll(async () => {
  // the daemon installs corral.send_event with its own limit as it starts
  s = await startClientSetup({ maxEventBytes: LIMIT });
});

afterAll(async () => {
  await s?.stop();
});

/** Runs `script` with psql (one session, a statement each, stopping at the first error), or, without psql, likewise on one pg connection. */
async function psql(script: string[]): Promise<string> {
  try {
    const { stdout } = await promisify(execFile)(
      'psql',
      [s.t.db.url, '-X', '-q', '-At', '-v', 'ON_ERROR_STOP=1', ...script.flatMap((c) => ['-c', c])],
      {
        timeout: 20_000,
      },
    );
    return stdout;
  } catch (e) {
    if ((e as { code?: unknown }).code !== 'ENOENT') throw e;
  }
  const c = new pg.Client({ connectionString: s.t.db.url });
  await c.connect();
  try {
    const out: string[] = [];
    for (const text of script) for (const r of (await c.query<Record<string, unknown>>(text)).rows) out.push(Object.values(r).join('|'));
    return out.join('\n');
  } finally {
    await c.end();
  }
}

const sqlError = async (text: string, values: unknown[] = []): Promise<{ code: string; message: string }> => {
  try {
    await s.pg.query(text, values);
  } catch (e) {
    return { code: (e as { code: string }).code, message: (e as Error).message };
  }
  throw new Error(`expected ${text} to fail`);
};

describe('corral.send_event', () => {
  it('from psql inside a transaction commits turns like send does, in order with the client’s events', async () => {
    const first = await s.corral.send('sql/mixed', { text: 'e0' });
    const out = await psql([
      'begin',
      `select corral.send_event('sql', 'mixed', '{"text":"e1"}'::jsonb)`,
      `select corral.send_event('sql', 'mixed', '{"text":"e2"}'::jsonb, 'psql-key')`,
      `select corral.send_event('sql', 'mixed', '{"text":"e2"}'::jsonb, 'psql-key')`,
      'commit',
    ]);
    const ids = out.trim().split('\n');
    expect(ids).toHaveLength(3);
    expect(ids[2]).toBe(ids[1]); // the key enqueued once
    const rest = await s.corral.sendMany([
      { actor: 'sql/mixed', data: { text: 'e3' } },
      { actor: 'sql/mixed', data: { text: 'e4' } },
    ]);
    // the client's key and psql's are one: the same event
    expect((await s.corral.send('sql/mixed', { text: 'e2' }, { idempotencyKey: 'psql-key' })).eventId).toBe(ids[1]);
    await Promise.all([first, ...rest].map((e) => s.corral.waitForTurn(e.eventId)));
    await s.corral.waitForTurn(ids[0]!);
    expect(await replies(s.corral, 'sql/mixed')).toEqual(['echo: e0', 'echo: e1', 'echo: e2', 'echo: e3', 'echo: e4']);
    expect((await s.corral.transcript('sql/mixed')).map((t) => t.eventId)).toEqual([
      first.eventId,
      ids[0],
      ids[1],
      ...rest.map((r) => r.eventId),
    ]);
  });

  it('rolled back with its transaction enqueues nothing, and its ids increase within one', async () => {
    const out = await psql([
      'begin',
      `select corral.send_event('sql', 'rolled', '1'::jsonb)`,
      `select event_id from corral.send_events('[${Array.from({ length: 50 }, (_, i) => `{"agent_uid":"sql","session_id":"rolled","data":${i}}`).join(',')}]')`,
      'rollback',
    ]);
    const ids = out.trim().split('\n');
    expect(ids).toHaveLength(51);
    expect([...ids].sort()).toEqual(ids);
    expect(ids.every((id) => /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/.test(id))).toBe(true);
    expect(await jobsOf(s.pg, 'sql/rolled')).toEqual([]);
  });

  it('wakes the daemon at once (its NOTIFY), without the fallback poll', async () => {
    const t0 = Date.now();
    const id = (await s.pg.query<{ id: string }>(`select corral.send_event('sql', 'wake', '{"text":"w"}'::jsonb) as id`)).rows[0]!.id;
    await s.corral.waitForTurn(id);
    // the consumer's fallback poll is 200 ms in the test daemon, 1 s by default; a wake-up takes a few ms
    expect(Date.now() - t0).toBeLessThan(2_000);
    await waitFor(async () => (await jobsOf(s.pg, 'sql/wake'))[0]?.state === 'completed', { what: 'the job completed' });
  });

  it('refuses what send refuses, each with its SQLSTATE', async () => {
    const codeOf = (name: string) => Object.entries(SEND_ERRORS).find(([, v]) => v === name)![0];
    // the limit is JSON without whitespace, as the client counts it: a payload of exactly LIMIT bytes passes
    const members = Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`k${i}`, i]));
    const base = JSON.stringify({ ...members, pad: '' }).length;
    const exact = { ...members, pad: 'x'.repeat(LIMIT - base) };
    expect(Buffer.byteLength(JSON.stringify(exact))).toBe(LIMIT);
    await s.pg.query(`select corral.send_event('sql', 'limits', $1::jsonb)`, [JSON.stringify(exact)]);
    const over = await sqlError(`select corral.send_event('sql', 'limits', $1::jsonb)`, [
      JSON.stringify({ ...exact, pad: exact.pad + 'x' }),
    ]);
    expect(over).toEqual({
      code: codeOf('payload_too_large'),
      message: `the event payload is ${LIMIT + 1} bytes; the limit is ${LIMIT} (CORRAL_MAX_EVENT_BYTES)`,
    });
    const deep = await sqlError(`select corral.send_event('sql', 'limits', $1::jsonb)`, ['['.repeat(101) + ']'.repeat(101)]);
    expect(deep.code).toBe(codeOf('invalid_argument'));
    expect(deep.message).toContain('nested deeper than 100 levels');
    await s.pg.query(`select corral.send_event('sql', 'limits', $1::jsonb)`, ['['.repeat(100) + ']'.repeat(100)]);
    const huge = await sqlError(`select corral.send_event('sql', 'limits', $1::jsonb)`, [`[1${'0'.repeat(400)}]`]);
    expect(huge).toMatchObject({ code: codeOf('invalid_argument'), message: expect.stringContaining('out of range') as unknown });
    expect((await sqlError(`select corral.send_event('sql/x', 'limits', '1')`)).code).toBe(codeOf('invalid_actor_key'));
    expect((await sqlError(`select corral.send_event('sql', '', '1')`)).code).toBe(codeOf('invalid_actor_key'));
    expect((await sqlError(`select corral.send_event('sql', 'limits', null)`)).code).toBe(codeOf('invalid_argument'));
    expect((await sqlError(`select corral.send_event('sql', 'limits', '1', '')`)).code).toBe(codeOf('invalid_argument'));
    expect((await sqlError(`select corral.send_event('sql', 'limits', '1', repeat('k', 201))`)).code).toBe(codeOf('invalid_argument'));
    await s.pg.query(`select corral.send_event('sql', 'limits', '1', 'key')`);
    const conflict = await sqlError(`select corral.send_event('sql', 'limits', '2', 'key')`);
    expect(conflict.code).toBe(codeOf('idempotency_conflict'));
    expect((await sqlError(`select * from corral.send_events('{"not":"an array"}')`)).code).toBe(codeOf('invalid_argument'));
    expect((await sqlError(`select * from corral.send_events('[{"agent_uid":"sql","session_id":"limits"}]')`)).code).toBe(
      codeOf('invalid_argument'),
    );
    // the JSON null is a payload; each refusal above wrote nothing
    await s.pg.query(`select corral.send_event('sql', 'limits', 'null')`);
    expect((await jobsOf(s.pg, 'sql/limits')).map((j) => j.data.payload)).toEqual([
      exact,
      JSON.parse('['.repeat(100) + ']'.repeat(100)),
      1,
      null,
    ]);
  });
});
