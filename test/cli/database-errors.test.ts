/**
 * What the commands say about a database they cannot use: a DATABASE_URL that is no connection
 * string, a server that does not answer. One clear message each, the same whichever command met
 * it, and a password never shown.
 */
import { describe, expect, it } from 'vitest';
import { corral } from './helpers.ts';

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
