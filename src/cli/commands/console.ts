/**
 * `corral console --token NAME`: a one-time sign-in link to the operator console (`/console` of
 * the daemon's HTTP API, docs/console.md) for the admin token NAME. The link is printed alone on
 * standard output; it signs in once, within 10 minutes, and only while the token authorizes.
 * The code travels in the link's fragment (`#code=…`), which a browser never sends in a request:
 * it reaches no proxy's or server's log.
 *
 * Exit codes: 0 printed, 2 bad arguments (a name, no URL to print), 3 no such admin token.
 */
import type { Command } from 'commander';
import type { Config } from '../../config.ts';
import { withDatabase, type ConfigFn, type Io, type RunFn } from './table-commands.ts';

const AFTER = `
The token must have the admin scope (corral tokens create ops --scope admin). The link is
http://<CORRAL_HTTP_HOST>:<CORRAL_HTTP_PORT>/console/sign-in#code=..., or --url's base
(the address operators reach, a TLS proxy's say). It works once, for 10 minutes; the session it
opens lasts 8 hours, never longer than the token, and ends when the token is revoked.

Pages and their API also take the token itself: Authorization: Bearer <token>.

Examples:
  corral tokens create ops --scope admin --out ops.token
  corral console --token ops
  corral console --token ops --url https://corral.example.com`;

/** The console's base URL: `--url`, else the HTTP API's own address. */
export function consoleBase(config: Pick<Config, 'httpHost' | 'httpPort'>, url: string | undefined): string {
  if (url !== undefined) {
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      throw new Error(`--url ${url} is not a URL`);
    }
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') throw new Error(`--url ${url} is not an http(s) URL`);
    return parsed.origin + parsed.pathname.replace(/\/+$/, '');
  }
  if (!config.httpPort) throw new Error('the HTTP API has no port (CORRAL_HTTP_PORT, corral daemon --http-port): pass --url');
  const host = config.httpHost === '0.0.0.0' ? '127.0.0.1' : config.httpHost === '::' ? '::1' : config.httpHost;
  return `http://${host.includes(':') ? `[${host}]` : host}:${config.httpPort}`;
}

export async function runConsole(config: Config, flags: { token?: string; url?: string }, io: Io): Promise<number> {
  const { CorralError } = await import('../../base/errors.ts');
  if (flags.token === undefined) throw new CorralError('invalid_argument', '--token NAME is needed: the admin token to sign in as');
  const { parseTokenName } = await import('../../ops/api-tokens.ts');
  const name = parseTokenName(flags.token);
  let base: string;
  try {
    base = consoleBase(config, flags.url);
  } catch (e) {
    throw new CorralError('invalid_argument', (e as Error).message);
  }
  const { createSignInCode } = await import('../../ops/console-sessions.ts');
  const made = await withDatabase(config, (db) => createSignInCode(db, name));
  io.out.write(`${base}/console/sign-in#code=${made.code}\n`);
  io.err.write(`a sign-in link for token ${name}: it works once, until ${made.expiresAt.toISOString()}\n`);
  return 0;
}

/** Adds `console` under `program`. */
export function registerConsoleCommand(program: Command, config: ConfigFn, run: RunFn, io: Io): void {
  program
    .command('console')
    .description('print a one-time sign-in link to the operator console (/console of the HTTP API) for an admin token')
    .option('--token <name>', 'the admin token to sign in as (corral tokens create NAME --scope admin)')
    .option('--url <base>', "the console's base URL as operators reach it (default http://CORRAL_HTTP_HOST:CORRAL_HTTP_PORT)")
    .addHelpText('after', AFTER)
    .action((o: { token?: string; url?: string }) => run(runConsole(config(), o, io)));
}
