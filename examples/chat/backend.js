// @ts-check
/**
 * An application's backend for the chat page (examples/chat): what a product puts in front of
 * corral so that each end user's browser holds a credential for their own conversation only.
 *
 *  - `POST /token` mints, for the signed-in user, an API token with the scopes `read` and `send`,
 *    for one actor (`<agent>/<user>`), that expires after `--ttl` (default 15 minutes), and
 *    answers `{ token, actor, expiresAt }`. In this example the user is the name in the request
 *    (`{ "user": "alice" }`); a real application takes it from its own login session instead,
 *    and never lets a caller choose whose conversation a token is for.
 *  - `/v1/*` is passed through to the daemon's HTTP API (docs/http.md), streams included, so the
 *    page talks to one origin only: its Content-Security-Policy allows no other.
 *  - `/`, `/app.js`, `/style.css`, `/favicon.svg`: the chat page, with a `corral-token-route`
 *    meta tag that tells it to take its token from `POST /token` rather than asking for one.
 *
 * The backend is trusted: it reaches corral's database (DATABASE_URL) to mint tokens. The
 * browser never sees anything but its own short-lived token.
 *
 *   DATABASE_URL=postgres://… node backend.js --api http://127.0.0.1:8787 --port 8080
 */
import { createServer } from 'node:http';
import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { randomBytes } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

/** A user name: one session id of the agent (a subset of what an actor key's part may be). */
const USER = /^[A-Za-z0-9._-]{1,40}$/;
/** Largest request body taken: a token request, or an event sent through to the API. */
const MAX_TOKEN_BODY_BYTES = 1024;
const MAX_PROXY_BODY_BYTES = 512 * 1024;
/** Hop-by-hop headers (RFC 9110 §7.6.1): never passed through. */
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'te', 'trailer', 'host']);
/** The page's files, served with the same policy the daemon serves them with (src/http/ui.ts). */
const PAGE_DIR = fileURLToPath(new URL('../chat/', import.meta.url));
const PAGE_FILES = /** @type {const} */ ({
  '/': ['index.html', 'text/html; charset=utf-8'],
  '/app.js': ['app.js', 'text/javascript; charset=utf-8'],
  '/style.css': ['style.css', 'text/css; charset=utf-8'],
  '/favicon.svg': ['favicon.svg', 'image/svg+xml'],
});
const PAGE_HEADERS = {
  'content-security-policy':
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'cache-control': 'no-store',
};

/**
 * @typedef {{ tokens: { create(input: { name: string; scopes: ('read' | 'send')[]; actors: string[]; ttl: string }): Promise<{ token: string; expiresAt: string | null }> } }} TokenMinter
 * @typedef {{ corral: TokenMinter; apiUrl: string; agent?: string; ttl?: string; log?: (line: string) => void }} BackendOptions
 */

/** A JSON answer. */
function answer(res, status, body, headers = {}) {
  res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store', ...headers });
  res.end(JSON.stringify(body));
}

const refuse = (res, status, code, message, headers = {}) => answer(res, status, { error: { code, message } }, headers);

/** The request's body as text, at most `limit` bytes; null (after a 413) when longer. */
function readBody(req, res, limit) {
  return new Promise((resolve, reject) => {
    const parts = [];
    let size = 0;
    req.on('data', (chunk) => {
      size += chunk.length;
      if (size > limit) {
        refuse(res, 413, 'payload_too_large', `at most ${limit} bytes`);
        req.destroy();
        resolve(null);
        return;
      }
      parts.push(chunk);
    });
    req.on('end', () => resolve(Buffer.concat(parts).toString('utf8')));
    req.on('error', reject);
  });
}

/**
 * The backend's request handler and the page it serves. `corral` is a client of the package
 * (`connect()`), `apiUrl` the daemon's HTTP API (`corral daemon --http-port`).
 * @param {BackendOptions} opts
 */
export async function createChatBackend(opts) {
  const agent = opts.agent ?? 'chat';
  const ttl = opts.ttl ?? '15m';
  const api = new URL(opts.apiUrl);
  const log = opts.log ?? (() => undefined);
  /** @type {Map<string, { body: Buffer; type: string }>} */
  const page = new Map();
  for (const [path, [file, type]] of Object.entries(PAGE_FILES)) {
    let body = await readFile(`${PAGE_DIR}${file}`);
    if (file === 'index.html') {
      // the page takes its token from this backend (examples/chat/app.js, "token route")
      body = Buffer.from(
        body
          .toString('utf8')
          .replace('<meta name="referrer"', '<meta name="corral-token-route" content="/token" />\n    <meta name="referrer"'),
      );
    }
    page.set(path, { body, type });
  }

  /** POST /token: a token for the user's one conversation. */
  async function mint(req, res) {
    if (!String(req.headers['content-type'] ?? '').startsWith('application/json'))
      return refuse(res, 415, 'unsupported_media_type', 'send application/json');
    const text = await readBody(req, res, MAX_TOKEN_BODY_BYTES);
    if (text === null) return;
    let user;
    try {
      user = JSON.parse(text)?.user;
    } catch {
      return refuse(res, 400, 'invalid_json', 'the body is not JSON');
    }
    if (typeof user !== 'string' || !USER.test(user)) return refuse(res, 400, 'invalid_user', 'user: 1–40 of A–Z a–z 0–9 . _ -');
    const actor = `${agent}/${user}`;
    const made = await opts.corral.tokens.create({
      name: `chat-${user}-${randomBytes(6).toString('hex')}`,
      scopes: ['read', 'send'],
      actors: [actor],
      ttl,
    });
    log(`token for ${actor} until ${made.expiresAt}`);
    answer(res, 200, { token: made.token, actor, expiresAt: made.expiresAt });
  }

  /** /v1/*: passed through to the daemon's API, the answer streamed back as it comes. */
  function proxy(req, res) {
    const headers = Object.fromEntries(Object.entries(req.headers).filter(([name]) => !HOP_BY_HOP.has(name)));
    const send = api.protocol === 'https:' ? httpsRequest : httpRequest;
    let sent = 0;
    const upstream = send(
      { protocol: api.protocol, hostname: api.hostname, port: api.port, method: req.method, path: req.url, headers },
      (up) => {
        const back = Object.fromEntries(Object.entries(up.headers).filter(([name]) => !HOP_BY_HOP.has(name)));
        res.writeHead(up.statusCode ?? 502, back);
        // an event stream is written as it comes (no buffering between the daemon and the page)
        res.flushHeaders();
        up.pipe(res);
      },
    );
    upstream.on('error', (e) => {
      if (!res.headersSent) refuse(res, 502, 'bad_gateway', `the corral API cannot be reached (${e.message})`);
      else res.destroy();
    });
    // the page went away: so does its request to the daemon (an open stream ends there too)
    res.on('close', () => upstream.destroy());
    req.on('data', (chunk) => {
      sent += chunk.length;
      if (sent > MAX_PROXY_BODY_BYTES) {
        upstream.destroy();
        if (!res.headersSent) refuse(res, 413, 'payload_too_large', `at most ${MAX_PROXY_BODY_BYTES} bytes`);
        req.destroy();
      }
    });
    req.pipe(upstream);
  }

  /** @type {import('node:http').RequestListener} */
  const handle = (req, res) => {
    const path = new URL(req.url ?? '/', 'http://backend').pathname;
    const method = req.method ?? 'GET';
    if (path.startsWith('/v1/')) return proxy(req, res);
    if (path === '/token') {
      if (method !== 'POST') return refuse(res, 405, 'method_not_allowed', 'POST /token', { allow: 'POST' });
      mint(req, res).catch((e) => {
        log(`token refused: ${e?.message ?? e}`);
        if (!res.headersSent) refuse(res, 503, 'unavailable', 'no token could be made now; try again');
      });
      return;
    }
    const file = page.get(path);
    if (!file) return refuse(res, 404, 'not_found', `no ${path} here`);
    if (method !== 'GET' && method !== 'HEAD') return refuse(res, 405, 'method_not_allowed', `GET ${path}`, { allow: 'GET, HEAD' });
    res.writeHead(200, { 'content-type': file.type, ...PAGE_HEADERS });
    res.end(method === 'HEAD' ? undefined : file.body);
  };
  return handle;
}

const USAGE = `Usage: node backend.js [--port 8080] [--api URL] [--agent chat] [--ttl 15m]

  --port   where the page and the token route listen (default 8080, on 127.0.0.1)
  --api    the daemon's HTTP API (default CORRAL_HTTP_URL, else http://127.0.0.1:8787)
  --agent  the agent whose sessions the users get (default chat)
  --ttl    how long a token lives (default 15m)

DATABASE_URL is corral's database (the tokens are minted in it); unset: the embedded one under
CORRAL_HOME, as the daemon uses.`;

async function main() {
  let values;
  try {
    ({ values } = parseArgs({
      options: {
        port: { type: 'string', default: '8080' },
        api: { type: 'string', default: process.env.CORRAL_HTTP_URL ?? 'http://127.0.0.1:8787' },
        agent: { type: 'string', default: 'chat' },
        ttl: { type: 'string', default: '15m' },
        help: { type: 'boolean', short: 'h' },
      },
    }));
  } catch (e) {
    process.stderr.write(`${/** @type {Error} */ (e).message}\n${USAGE}\n`);
    process.exit(2);
  }
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    return;
  }
  const port = Number(values.port);
  if (!Number.isInteger(port) || port < 0 || port > 65_535) {
    process.stderr.write(`--port: a port number, not ${values.port}\n`);
    process.exit(2);
  }
  const { connect } = await import('corral');
  const corral = await connect(process.env.DATABASE_URL ? { databaseUrl: process.env.DATABASE_URL } : {});
  const handle = await createChatBackend({
    corral,
    apiUrl: String(values.api),
    agent: String(values.agent),
    ttl: String(values.ttl),
    log: (line) => process.stderr.write(`${line}\n`),
  });
  const server = createServer(handle);
  server.listen(port, '127.0.0.1', () => process.stderr.write(`chat backend on http://127.0.0.1:${port}/ (API ${values.api})\n`));
  const stop = () => {
    server.close();
    server.closeAllConnections();
    void corral.close();
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) await main();
