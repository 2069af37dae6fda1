/**
 * What the commands say about a database they cannot use: a DATABASE_URL that is no connection
 * string, a server that does not answer, a database without corral's schema. One clear message
 * each, the same whichever command met it, a password never shown, and nothing written.
 */
import { describe, expect, it } from 'vitest';
import { useTestDatabase } from '../helpers/db.ts';
import { corral, type CliResult } from './helpers.ts';

/** Every command that reads or writes corral's tables or queue. */
const SCHEMA_COMMANDS: string[][] = [
  ['send', 'a/s', '{"text":"hi"}'],
  ['steer', 'a/s', '{"more":1}'],
  ['cancel', 'a/s'],
  ['status'],
  ['actor', 'a/s'],
  ['transcript', 'a/s'],
  ['dlq', 'list'],
  ['dlq', 'replay', '--all', '--yes'],
  ['retention', 'list'],
  ['retention', 'set', 'a', '90d'],
];

const NO_SCHEMA = 'corral: the database has no corral schema yet: run `corral db migrate` (or start `corral daemon`, which migrates)\n';

describe('a DATABASE_URL that is not a connection string', () => {
  it('is called invalid (exit 2), naming the variable and not the value', async () => {
    for (const url of ['not a url', 'mysql://admin:s3cret-pw@db.example/app', 'localhost:5432']) {
      for (const args of [['status'], ['send', 'a/s', '{}']]) {
        const r = await corral(args, url);
        expect([r.code, r.stdout], r.stderr).toEqual([2, '']);
        expect(r.stderr).toBe(
          'corral: invalid configuration: databaseUrl (DATABASE_URL): expected a postgres:// or postgresql:// URL ' +
            '(or a socket: a path starting with /, or socket://)\n',
        );
        expect(r.stderr).not.toContain('s3cret');
      }
    }
  });

  it('takes the forms pg takes: postgres://, postgresql://, socket:// and a socket folder', async () => {
    // nothing listens there: each is accepted as configuration and fails to connect (exit 1)
    for (const url of ['postgresql://u:pw@127.0.0.1:1/db', 'socket://u:pw@/nonexistent-folder?db=x', '/nonexistent-folder x']) {
      const r = await corral(['status'], url);
      expect(r.code, r.stderr).toBe(1);
      expect(r.stderr).toMatch(/^corral: cannot reach the database at /);
    }
  });
});

describe('a server that does not answer', () => {
  it('is one message, with the address and the password masked', async () => {
    const url = 'postgres://someone:s3cret-pw@127.0.0.1:1/app';
    for (const args of [['status'], ['send', 'a/s', '{}'], ['transcript', 'a/s'], ['dlq', 'list']]) {
      const r = await corral(args, url);
      expect(r.code, r.stderr).toBe(1);
      expect(r.stderr).toMatch(
        /^corral: cannot reach the database at postgres:\/\/someone:\*\*\*\*@127\.0\.0\.1:1\/app: connect ECONNREFUSED 127\.0\.0\.1:1 \(is DATABASE_URL right and the server up\?\)\n$/,
      );
      expect(r.stderr.match(/cannot reach/g)).toHaveLength(1);
      expect(r.stderr).not.toContain('s3cret');
    }
  });
});

describe('a database without corral’s schema', () => {
  const empty = useTestDatabase({ empty: true });

  const schemas = async (): Promise<string[]> => {
    const { rows } = await empty.client.query<{ nspname: string }>(
      "select nspname from pg_namespace where nspname not like 'pg\\_%' and nspname not in ('information_schema', 'public') order by 1",
    );
    return rows.map((r) => r.nspname);
  };

  it('every command refuses it with the same message, and creates nothing in it', async () => {
    expect(await schemas()).toEqual([]);
    const results: [string, CliResult][] = [];
    for (const args of SCHEMA_COMMANDS) results.push([args.join(' '), await corral(args, empty.url)]);
    // an event from a file or standard input is read first, then refused the same way
    results.push(['send --file -', await corral(['send', 'a/s', '--file', '-'], empty.url, {}, { input: '{"text":"hi"}' })]);
    for (const [command, r] of results) {
      expect([command, r.code, r.stdout, r.stderr]).toEqual([command, 1, '', NO_SCHEMA]);
    }
    expect(await schemas()).toEqual([]);
  });

  it('`db migrate` sets it up, and then send enqueues', async () => {
    const migrated = await corral(['db', 'migrate'], empty.url);
    expect(migrated.code, migrated.stderr).toBe(0);
    expect(await schemas()).toEqual(expect.arrayContaining(['corral', 'pgboss']));
    // `db migrate` creates no queue: send sets it up (the full pg-boss path), then the direct one
    for (let i = 0; i < 2; i++) {
      const sent = await corral(['send', 'a/s', '{"text":"hi"}'], empty.url);
      expect(sent.code, sent.stderr).toBe(0);
      expect(sent.stdout).toMatch(/^[0-9a-f-]{36}\n$/);
    }
    const status = await corral(['status', '--json'], empty.url);
    expect(status.code, status.stderr).toBe(0);
    expect((JSON.parse(status.stdout) as { queue: { ready: number } }).queue.ready).toBe(2);
  });
});
