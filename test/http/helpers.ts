/** The HTTP API on a real port of a test database, tokens for it, and `fetch` with them. */
import { expect } from 'vitest';
import { connect, type Corral } from '../../src/client/index.ts';
import { loadConfig, type Config } from '../../src/config.ts';
import { openDatabase, type Database } from '../../src/db/client.ts';
import { startApiServer, type ApiServer, type ApiServerOptions } from '../../src/http/server.ts';
import { createToken, type ApiTokenScope } from '../../src/ops/api-tokens.ts';
import { testLogger } from '../helpers/daemon.ts';

export interface Api {
  server: ApiServer;
  database: Database;
  corral: Corral;
  config: Config;
  /** `fetch(server.url + path)` with `token` as the bearer, unless `token` is null. */
  call(path: string, init?: RequestInit & { token?: string | null }): Promise<Response>;
  /** A new token with `scopes`. */
  token(name: string, scopes: ApiTokenScope[]): Promise<string>;
  stop(): Promise<void>;
}

export async function startApi(
  databaseUrl: string,
  opts: { config?: Partial<Config>; corral?: Corral } & Partial<
    Pick<ApiServerOptions, 'live' | 'keepAliveMs' | 'db' | 'logger' | 'ui' | 'console'>
  > = {},
): Promise<Api> {
  // these tests make many refused requests and streams from one address and token: the limits on
  // those (failed authentications, stream opens) are out of their way, and tested on their own
  // (test/security/tenants.test.ts)
  const config = loadConfig(
    { databaseUrl, logLevel: 'silent', httpAuthFailuresPerMinute: 1_000_000, httpStreamOpensPerSecond: 100_000, ...opts.config },
    {},
  );
  const database = openDatabase(databaseUrl, { max: 4, applicationName: 'corral-http-test' });
  const corral = opts.corral ?? (await connect({ databaseUrl, env: {}, maxEventBytes: config.maxEventBytes }));
  let server: ApiServer;
  try {
    server = await startApiServer({
      host: '127.0.0.1',
      port: 0,
      corral,
      db: opts.db ?? database.db,
      config,
      logger: opts.logger ?? testLogger,
      ...(opts.ui ? { ui: opts.ui } : {}),
      ...(opts.console ? { console: opts.console } : {}),
      ...(opts.live ? { live: opts.live } : {}),
      ...(opts.keepAliveMs ? { keepAliveMs: opts.keepAliveMs } : {}),
    });
  } catch (e) {
    if (!opts.corral) await corral.close();
    await database.close();
    throw e;
  }
  return {
    server,
    database,
    corral,
    config,
    call(path, init = {}) {
      const { token, headers, ...rest } = init;
      const h = new Headers(headers);
      if (token !== null && token !== undefined) h.set('authorization', `Bearer ${token}`);
      return fetch(`${server.url}${path}`, { ...rest, headers: h });
    },
    async token(name, scopes) {
      return (await createToken(database.db, name, scopes)).token;
    },
    async stop() {
      await server.close();
      if (!opts.corral) await corral.close();
      await database.close();
    },
  };
}

/** A response's JSON body and status, for `expect(...).toEqual`. */
export async function answer(res: Response): Promise<{ status: number; body: unknown }> {
  const text = await res.text();
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    // not JSON: compared as text
  }
  return { status: res.status, body };
}

/** The error body of `code`, its message matching `message`. */
export const failure = (code: string, message: RegExp | string = /./) => ({
  error: { code, message: typeof message === 'string' ? message : expect.stringMatching(message) },
});

/** A POST of `body` as JSON; a string is sent as it is (the JSON text itself). */
export const json = (body: unknown, headers: Record<string, string> = {}): RequestInit => ({
  method: 'POST',
  headers: { 'content-type': 'application/json', ...headers },
  body: typeof body === 'string' ? body : JSON.stringify(body),
});
