/**
 * The consumer LISTENs on pg-boss's NOTIFY channel, computed in Node: it must equal the channel
 * pg-boss itself derives, i.e. pg-boss's own SQL expression evaluated by the server.
 */
import pg from 'pg';
import { notifyChannelSql } from 'pg-boss/dist/plans.js';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { DEFAULTS } from '../../src/config.ts';
import { bossNotifyChannel } from '../../src/db/boss/internals.ts';

let client: pg.Client;
beforeAll(async () => {
  client = new pg.Client({ connectionString: inject('pgServerUrl') });
  await client.connect();
});
afterAll(async () => {
  await client.end();
});

describe('pg-boss notify channel', () => {
  // Schema names the configuration accepts (bare, lower case), and one redundantly quoted.
  it.each([DEFAULTS.bossSchema, 'corral_boss_2', '_b', 'x'.repeat(50), '"pgboss"'])(
    'matches the channel pg-boss computes for schema %s',
    async (schema) => {
      const { rows } = await client.query<{ channel: string }>(`select ${notifyChannelSql(schema)} as channel`);
      expect(bossNotifyChannel(schema)).toBe(rows[0]!.channel);
    },
  );
});
