// @ts-check
/**
 * An application's backend for the chat page (this folder): what a product puts in front of
 * corral so that each end user's browser holds a credential for its own conversation only, for a
 * short while. Plain Node (ESM, no framework, no dependency but corral); docs/http.md, "The chat
 * page and an app's backend".
 *
 *  - `POST /token` mints, for the signed-in user, an API token with the scopes `read` and `send`,
 *    for exactly one actor, `<agent>/<user>`, that expires after the ttl (default 15 minutes),
 *    named `chat-<user>-<random>`, and answers `{ token, actor, expiresAt }` (`Cache-Control:
 *    no-store`). In this example the user is whatever name the request gives (JSON `{"user": …}`,
 *    a form field `user=…`, or `?user=…`), checked against a strict pattern. A REAL APPLICATION
 *    TAKES THE USER FROM ITS OWN LOGIN SESSION instead, and never lets a caller choose whose
 *    conversation a token is for.
 *  - `/v1/*` is passed through to the daemon's HTTP API (docs/http.md), status and headers as
 *    they are (`Authorization`, `Last-Event-ID`, `Set-Cookie`), the answer streamed as it comes
 *    (Server-Sent Events included), so that the page talks to its own origin only: its
 *    Content-Security-Policy (`connect-src 'self'`) allows no other.
 *  - `/` (and `/index.html`), `/app.js`, `/style.css`, `/favicon.svg`: the chat page, with a
 *    `<meta name="corral-token-route" content="/token">` that tells it to take its token from
 *    this backend rather than asking the user for one (examples/chat/app.js).
 *
 * THE BACKEND IS TRUSTED: it reaches corral's database (DATABASE_URL) to mint tokens, with the
 * package's client (`connect()`, `corral.tokens.create`). Run it server-side only, next to the
 * daemon; the browser never sees anything but its own short-lived token.
 *
 *   DATABASE_URL=postgres://… node examples/chat/backend.js --api http://127.0.0.1:8787 --port 8080
 *
 * `--help` lists the settings. In a checkout, `npm run build` first (`corral` resolves to the
 * package's dist/); an application that installed corral runs
 * `node node_modules/corral/examples/chat/backend.js`.
 */
import { randomBytes } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { createServer, request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { pipeline } from 'node:stream';
import { parseArgs } from 'node:util';

/** An actor key's part (corral's `isValidActorPart`): what `--agent` may be. No `*`: the token's actor is exact, never a pattern. */
const ACTOR_PART = /^[A-Za-z0-9._:@-]{1,128}$/;
/** A user name: the session part of the user's actor. Strict: no dot first (no `.` or `..` path segment), nothing to encode. */
const USER = /^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$/;
const USER_RULE = '1–40 of A–Z a–z 0–9 . _ -, the first a letter or a digit';
/** The largest body `POST /token` takes (a user name), and the largest one passed through to the API (an event). */
const MAX_TOKEN_BODY_BYTES = 1024;
const MAX_PROXY_BODY_BYTES = 512 * 1024;
/** How long the daemon may take to start answering a request passed through (its streams run on for as long as they last). */
const UPSTREAM_ANSWER_MS = 30_000;
/** Hop-by-hop headers (RFC 9110 §7.6.1) and the host: never passed through. */
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'te', 'trailer', 'host']);
/** The only cookie passed to the daemon: its session cookie (POST /v1/session). The application's own cookies stay here. */
const SESSION_COOKIE = 'corral_session';
/** The page's files, at their paths. */
const PAGE_FILES = /** @type {const} */ ([
  ['/', 'index.html', 'text/html; charset=utf-8'],
  ['/index.html', 'index.html', 'text/html; charset=utf-8'],
  ['/app.js', 'app.js', 'text/javascript; charset=utf-8'],
  ['/style.css', 'style.css', 'text/css; charset=utf-8'],
  ['/favicon.svg', 'favicon.svg', 'image/svg+xml'],
]);
/** The headers the daemon serves the page with (src/http/ui.ts, U3): same origin only, no inline script, no framing. */
const PAGE_HEADERS = {
  'content-security-policy':
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'cache-control': 'no-store',
};
/** What the page reads to know that its token comes from here (examples/chat/app.js). */
const TOKEN_ROUTE_META = '<meta name="corral-token-route" content="/token" />';

/**
 * @typedef {import('node:http').IncomingMessage} Request
 * @typedef {import('node:http').ServerResponse} Response
 * @typedef {{ tokens: import('corral').Corral['tokens']; apiUrl: URL; agent: string; ttl: string; log: (line: string) => void }} BackendOptions
 */

/**
 * A JSON answer, never cached.
 * @param {Response} res
 * @param {number} status
 * @param {unknown} body
 * @param {Record<string, string>} [headers]
 */
function answer(res, status, body, headers = {}) {
  res.writeHead(status, {
    'content-type': 'application/json; charset=utf-8',
    'cache-control': 'no-store',
    'x-content-type-options': 'nosniff',
    ...headers,
  });
  res.end(JSON.stringify(body));
}

/**
 * An error answer: `{ "error": { code, message } }`, as the API words its own.
 * @param {Response} res
 * @param {number} status
 * @param {string} code
 * @param {string} message
 * @param {Record<string, string>} [headers]
 */
function refuse(res, status, code, message, headers = {}) {
  answer(res, status, { error: { code, message } }, headers);
}

/**
 * 413, and the connection closed once it is sent: the rest of the body is not read.
 * @param {Request} req
 * @param {Response} res
 * @param {number} limit
 */
function tooLarge(req, res, limit) {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  res.on('finish', () => req.destroy());
  refuse(res, 413, 'payload_too_large', `the request body is over ${limit} bytes (the backend's limit)`, { connection: 'close' });
}

/**
 * The request's body, at most `limit` bytes; null once it was refused (413).
 * @param {Request} req
 * @param {Response} res
 * @param {number} limit
 * @returns {Promise<Buffer | null>}
 */
function readBody(req, res, limit) {
  return new Promise((resolve, reject) => {
    if (Number(req.headers['content-length'] ?? 0) > limit) {
      tooLarge(req, res, limit);
      resolve(null);
      return;
    }
    /** @type {Buffer[]} */
    const parts = [];
    let size = 0;
    req.on('data', (/** @type {Buffer} */ chunk) => {
      size += chunk.length;
      if (size > limit) {
        req.pause();
        tooLarge(req, res, limit);
        resolve(null);
        return;
      }
      parts.push(chunk);
    });
    req.on('end', () => resolve(Buffer.concat(parts)));
    req.on('error', reject);
  });
}

/**
 * The headers of `from` that go on: no hop-by-hop one, nor one its `Connection` header names.
 * @param {import('node:http').IncomingHttpHeaders} from
 */
function endToEnd(from) {
  const named = new Set(
    String(from.connection ?? '')
      .toLowerCase()
      .split(',')
      .map((h) => h.trim()),
  );
  /** @type {import('node:http').OutgoingHttpHeaders} */
  const out = {};
  for (const [name, value] of Object.entries(from)) {
    if (value !== undefined && !HOP_BY_HOP.has(name) && !named.has(name)) out[name] = value;
  }
  return out;
}

/**
 * Of a `Cookie` header, the daemon's session cookie alone (undefined: none).
 * @param {string | undefined} header
 */
function sessionCookieOnly(header) {
  const kept = (header ?? '')
    .split(';')
    .map((c) => c.trim())
    .filter((c) => c.startsWith(`${SESSION_COOKIE}=`));
  return kept.length > 0 ? kept.join('; ') : undefined;
}

/**
 * The user a token request names: its JSON `user`, its form field `user`, else its `?user=`.
 * The page sends JSON; a form or a query is what a plain HTML form or `curl` sends.
 * @param {Request} req
 * @param {Buffer} body
 * @param {URL} url
 * @returns {{ user: unknown } | { status: number; code: string; message: string }}
 */
function userOf(req, body, url) {
  if (body.length === 0) return { user: url.searchParams.get('user') ?? undefined };
  const type = String(req.headers['content-type'] ?? '')
    .replace(/;.*/s, '')
    .trim()
    .toLowerCase();
  const text = body.toString('utf8');
  if (type === 'application/json') {
    try {
      const parsed = JSON.parse(text);
      return { user: parsed !== null && typeof parsed === 'object' ? parsed.user : undefined };
    } catch {
      return { status: 400, code: 'invalid_json', message: 'the body is not JSON' };
    }
  }
  if (type === 'application/x-www-form-urlencoded') return { user: new URLSearchParams(text).get('user') ?? undefined };
  return { status: 415, code: 'unsupported_media_type', message: 'send application/json or application/x-www-form-urlencoded' };
}

/**
 * The backend's request handler. `tokens` is a client's `corral.tokens` (`connect()`), `apiUrl`
 * the daemon's HTTP API (`corral daemon --http-port`).
 * @param {BackendOptions} opts
 * @returns {Promise<import('node:http').RequestListener>}
 */
async function createChatBackend(opts) {
  const { tokens, apiUrl, agent, ttl, log } = opts;
  /** @type {Map<string, { body: Buffer; type: string }>} */
  const page = new Map();
  for (const [path, file, type] of PAGE_FILES) {
    let body = await readFile(new URL(file, import.meta.url));
    if (file === 'index.html') {
      const html = body.toString('utf8');
      if (!html.includes('<meta name="referrer"'))
        throw new Error(`${file}: no <meta name="referrer"> to put the token route's meta tag after`);
      body = Buffer.from(html.replace('<meta name="referrer"', `${TOKEN_ROUTE_META}\n    <meta name="referrer"`));
    }
    page.set(path, { body, type });
  }
  const send = apiUrl.protocol === 'https:' ? httpsRequest : httpRequest;

  /**
   * POST /token: a token for the user's one conversation.
   * @param {Request} req
   * @param {Response} res
   * @param {URL} url
   */
  async function mint(req, res, url) {
    // a page of another site may post a form here (it could not read the answer); a browser says where a request comes from
    const site = req.headers['sec-fetch-site'];
    if (site !== undefined && site !== 'same-origin' && site !== 'none') {
      return refuse(res, 403, 'forbidden', 'a token is given to this site’s own page only');
    }
    const body = await readBody(req, res, MAX_TOKEN_BODY_BYTES);
    if (body === null) return;
    const given = userOf(req, body, url);
    if ('status' in given) return refuse(res, given.status, given.code, given.message);
    // EXAMPLE ONLY: a real application takes the user from its own login session here
    const user = given.user;
    if (typeof user !== 'string' || !USER.test(user)) return refuse(res, 400, 'invalid_user', `user: ${USER_RULE}`);
    const actor = `${agent}/${user}`;
    const name = `chat-${user}-${randomBytes(6).toString('hex')}`;
    const made = await tokens.create({ name, scopes: ['read', 'send'], actors: [actor], ttl });
    // the token's name, never its text
    log(`token ${name} for ${actor}, until ${made.expiresAt}`);
    answer(res, 200, { token: made.token, actor, expiresAt: made.expiresAt });
  }

  /**
   * /v1/*: passed through to the daemon's API, the answer streamed back as it comes.
   * @param {Request} req
   * @param {Response} res
   * @param {URL} url
   */
  function proxy(req, res, url) {
    if (Number(req.headers['content-length'] ?? 0) > MAX_PROXY_BODY_BYTES) return tooLarge(req, res, MAX_PROXY_BODY_BYTES);
    const headers = endToEnd(req.headers);
    delete headers.cookie;
    const cookie = sessionCookieOnly(req.headers.cookie);
    if (cookie !== undefined) headers.cookie = cookie;
    const upstream = send({
      protocol: apiUrl.protocol,
      hostname: apiUrl.hostname,
      port: apiUrl.port,
      method: req.method,
      // the path as the URL parser made it (no `..` left): always under /v1/
      path: `${url.pathname}${url.search}`,
      headers,
    });
    let overLimit = false;
    let timedOut = false;
    const late = setTimeout(() => {
      timedOut = true;
      upstream.destroy(new Error(`no answer within ${UPSTREAM_ANSWER_MS} ms`));
    }, UPSTREAM_ANSWER_MS);
    upstream.on('response', (up) => {
      clearTimeout(late);
      res.writeHead(up.statusCode ?? 502, endToEnd(up.headers));
      // an event stream is written as it comes: nothing waits for more to send it
      res.flushHeaders();
      res.socket?.setNoDelay(true);
      // a daemon that goes away mid-answer cuts the page's answer too (an EventSource then reconnects)
      pipeline(up, res, () => undefined);
    });
    upstream.on('error', (e) => {
      clearTimeout(late);
      if (overLimit) return;
      if (res.headersSent) res.destroy();
      else if (timedOut) refuse(res, 504, 'gateway_timeout', `the corral API did not answer (${e.message})`);
      else refuse(res, 502, 'bad_gateway', `the corral API cannot be reached (${e.message})`);
    });
    // the page went away before its answer ended: so does its request to the daemon (an open
    // stream ends there too)
    res.on('close', () => {
      clearTimeout(late);
      if (!res.writableFinished) upstream.destroy();
    });
    // a body sent in chunks, without a length, is counted as it comes
    let size = 0;
    req.on('data', (/** @type {Buffer} */ chunk) => {
      size += chunk.length;
      if (size > MAX_PROXY_BODY_BYTES && !overLimit) {
        overLimit = true;
        req.unpipe(upstream);
        upstream.destroy();
        tooLarge(req, res, MAX_PROXY_BODY_BYTES);
      }
    });
    req.pipe(upstream);
  }

  return (req, res) => {
    const method = req.method ?? 'GET';
    let url;
    try {
      url = new URL(req.url ?? '/', 'http://backend');
    } catch {
      return refuse(res, 400, 'bad_request', 'not a request path');
    }
    const path = url.pathname;
    if (path.startsWith('/v1/')) return proxy(req, res, url);
    if (path === '/token') {
      if (method !== 'POST')
        return refuse(res, 405, 'method_not_allowed', `${method} is not allowed here: POST /token is`, { allow: 'POST' });
      mint(req, res, url).catch((/** @type {unknown} */ e) => {
        log(`no token made: ${e instanceof Error ? e.message : String(e)}`);
        if (!res.headersSent) refuse(res, 503, 'unavailable', 'no token could be made now; try again shortly');
      });
      return;
    }
    const file = page.get(path);
    if (!file) return refuse(res, 404, 'not_found', 'no such page here');
    if (method !== 'GET' && method !== 'HEAD') {
      return refuse(res, 405, 'method_not_allowed', `${method} is not allowed here: GET ${path} is`, { allow: 'GET, HEAD' });
    }
    res.writeHead(200, { 'content-type': file.type, 'content-length': String(file.body.length), ...PAGE_HEADERS });
    res.end(method === 'HEAD' ? undefined : file.body);
  };
}

const USAGE = `Usage: node examples/chat/backend.js [--port N] [--host H] [--api URL] [--agent A] [--ttl T]

The chat page behind an application's backend: serves the page, mints each user a short-lived
token for their one conversation (POST /token) and passes /v1/* through to corral's HTTP API.

  --port   where it listens (CHAT_PORT; default 8080; 0: any free port)
  --host   the address it listens on (CHAT_HOST; default 127.0.0.1)
  --api    the daemon's HTTP API (CHAT_API_URL; default http://127.0.0.1:8787)
  --agent  the agent whose sessions the users get: user alice talks to <agent>/alice
           (CHAT_AGENT; default chat)
  --ttl    how long a token lives: 30s, 15m, 2h, 1d (CHAT_TOKEN_TTL; default 15m)
  --help   this text

DATABASE_URL is corral's database, where the tokens are minted: this backend is a trusted,
server-side component (unset: the embedded database under CORRAL_HOME, as the daemon uses).
The user is the name a request gives: an example only. A real application takes it from its own
login session.`;

/** A ttl this backend takes: a number and a unit, 1 s to 10 years (corral's own bounds). */
const TTL = /^([1-9][0-9]{0,9})(s|m|h|d)$/;
const TTL_UNIT_MS = /** @type {const} */ ({ s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 });

/**
 * Says what is wrong with the command line, and exits 2.
 * @param {string} message
 * @returns {never}
 */
function bad(message) {
  process.stderr.write(`${message}\n\n${USAGE}\n`);
  process.exit(2);
}

/**
 * The settings, from the flags, else the environment; exits 2 with the usage on a bad one.
 * @param {string[]} argv
 * @param {NodeJS.ProcessEnv} env
 */
function settings(argv, env) {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      strict: true,
      options: {
        port: { type: 'string' },
        host: { type: 'string' },
        api: { type: 'string' },
        agent: { type: 'string' },
        ttl: { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
    }));
  } catch (e) {
    bad(e instanceof Error ? e.message : String(e));
  }
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    process.exit(0);
  }
  const portText = values.port ?? env.CHAT_PORT ?? '8080';
  const port = Number(portText);
  if (!/^[0-9]{1,5}$/.test(portText) || port > 65_535) bad(`--port: a port number (0-65535), not ${JSON.stringify(portText)}`);
  const host = values.host ?? env.CHAT_HOST ?? '127.0.0.1';
  const apiText = values.api ?? env.CHAT_API_URL ?? 'http://127.0.0.1:8787';
  /** @type {URL | undefined} */
  let apiUrl;
  try {
    apiUrl = new URL(apiText);
  } catch {
    // reported below
  }
  if (
    !apiUrl ||
    (apiUrl.protocol !== 'http:' && apiUrl.protocol !== 'https:') ||
    apiUrl.pathname !== '/' ||
    apiUrl.search ||
    apiUrl.username
  ) {
    bad(`--api: the daemon's HTTP API as http(s)://host:port, not ${JSON.stringify(apiText)}`);
  }
  const agent = values.agent ?? env.CHAT_AGENT ?? 'chat';
  if (!ACTOR_PART.test(agent)) bad(`--agent: 1-128 of A-Z a-z 0-9 . _ : @ -, not ${JSON.stringify(agent)}`);
  const ttl = values.ttl ?? env.CHAT_TOKEN_TTL ?? '15m';
  const m = TTL.exec(ttl);
  const ttlMs = m ? Number(m[1]) * TTL_UNIT_MS[/** @type {keyof typeof TTL_UNIT_MS} */ (m[2])] : NaN;
  if (!(ttlMs >= 1000 && ttlMs <= 10 * 366 * TTL_UNIT_MS.d))
    bad(`--ttl: a duration of 1s to 10 years such as 30s, 15m, 2h or 1d, not ${JSON.stringify(ttl)}`);
  return { port, host, apiUrl, agent, ttl };
}

async function main() {
  const { port, host, apiUrl, agent, ttl } = settings(process.argv.slice(2), process.env);
  const log = (/** @type {string} */ line) => process.stderr.write(`chat backend: ${line}\n`);
  // the trusted part: a client of corral's database, to mint tokens (the package is loaded once
  // the command line is read: --help and a bad flag need none of it)
  /** @type {typeof import('corral')} */
  let corralPackage;
  try {
    corralPackage = await import('corral');
  } catch (e) {
    if (!(e instanceof Error && 'code' in e && e.code === 'ERR_MODULE_NOT_FOUND')) throw e;
    log(`the corral package cannot be loaded (${e.message}): in a checkout, \`npm run build\` first`);
    process.exit(1);
  }
  const { connect } = corralPackage;
  /** @type {import('corral').Corral} */
  let corral;
  try {
    corral = await connect(process.env.DATABASE_URL ? { databaseUrl: process.env.DATABASE_URL } : {});
  } catch (e) {
    log(`corral's database cannot be used (DATABASE_URL): ${e instanceof Error ? e.message : String(e)}`);
    process.exit(1);
  }
  const server = createServer(await createChatBackend({ tokens: corral.tokens, apiUrl, agent, ttl, log }));
  // a client that sends its request slowly is dropped (an open stream is an answer, not a request: it runs on)
  server.headersTimeout = 20_000;
  server.requestTimeout = 60_000;
  server.on('error', (e) => {
    log(`cannot listen on ${host}:${port}: ${e.message}`);
    process.exitCode = 1;
    void corral.close();
  });
  server.listen(port, host, () => {
    const address = server.address();
    const bound = address !== null && typeof address === 'object' ? address.port : port;
    log(
      `listening on http://${host.includes(':') ? `[${host}]` : host}:${bound}/ (API ${apiUrl.origin}, agent ${agent}, tokens for ${ttl})`,
    );
  });
  const stop = () => {
    log('stopping');
    server.close();
    // open streams end here: their pages reconnect to whatever serves them next
    server.closeAllConnections();
    corral.close().catch((/** @type {unknown} */ e) => log(`the database client did not close cleanly: ${String(e)}`));
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
}

await main();
