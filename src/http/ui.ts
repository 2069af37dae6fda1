/**
 * The chat page (examples/chat/) as the HTTP API serves it at `/` when `CORRAL_HTTP_UI` is on:
 * a browser page on the same origin as the API, so it needs no CORS and its cookie is the API's.
 *
 *  U1 Only the files of that one folder are served, each at `/<name>` (and index.html at `/`): the
 *     list is made once, at start, of its regular files (no folder, no symbolic link, no dotfile)
 *     of a known type, and each is a route of its own. No path is ever built from a request, so
 *     no request reaches another file, however it is encoded (`/..%2f..%2fpackage.json` is the
 *     ordinary 404).
 *     `backend.js` is the folder's server side (an application's backend, examples/chat/backend.js):
 *     it runs next to the daemon, never in the page, and is not served.
 *  U2 The files are read at start and kept in memory (a few kB): a request reads no disk.
 *  U3 Every file carries a strict `Content-Security-Policy`: scripts, styles and images from
 *     the page's own origin only, no inline script, connections (`fetch`, `EventSource`) to its
 *     own origin only, no framing by another site, no form posted anywhere; and
 *     `X-Content-Type-Options: nosniff` and `Referrer-Policy: no-referrer`. Like every response,
 *     `Cache-Control: no-store` (server.ts).
 */
import { readdir, readFile } from 'node:fs/promises';
import { extname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { CorralError, toError } from '../base/errors.ts';

/** The page's folder: two levels up from this module, from src/http/ and from dist/http/ alike. */
export const CHAT_PAGE_DIR = fileURLToPath(new URL('../../examples/chat/', import.meta.url));

/** U1: the types served, by extension. */
const CONTENT_TYPES: Readonly<Record<string, string>> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
};

/** U1: the folder's server-side files, never served. */
const SERVER_SIDE = new Set(['backend.js']);

/** U1: a name served: no dotfile, nothing a URL would need to encode. */
const SERVED_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;

/** U3 */
export const UI_HEADERS: Readonly<Record<string, string>> = {
  'content-security-policy': [
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self'",
    "connect-src 'self'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
  ].join('; '),
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
};

export interface UiFile {
  /** The URL path it is served at. */
  readonly path: string;
  readonly contentType: string;
  readonly body: Buffer;
}

/** U1, U2: the files of `dir` to serve, `/` first; `invalid_config` when it cannot be read or has no index.html. */
export async function loadUiFiles(dir: string = CHAT_PAGE_DIR): Promise<UiFile[]> {
  let entries;
  try {
    entries = await readdir(dir, { withFileTypes: true });
  } catch (e) {
    throw new CorralError('invalid_config', `the chat page's folder ${dir} cannot be read (CORRAL_HTTP_UI): ${toError(e).message}`, {
      cause: e,
    });
  }
  const files: UiFile[] = [];
  for (const e of entries.sort((a, b) => a.name.localeCompare(b.name))) {
    const contentType = CONTENT_TYPES[extname(e.name).toLowerCase()];
    // Dirent.isFile() is false for a symbolic link: a link could point anywhere
    if (!e.isFile() || !SERVED_NAME.test(e.name) || contentType === undefined || SERVER_SIDE.has(e.name)) continue;
    files.push({ path: `/${e.name}`, contentType, body: await readFile(join(dir, e.name)) });
  }
  const index = files.find((f) => f.path === '/index.html');
  if (!index) throw new CorralError('invalid_config', `the chat page's folder ${dir} has no index.html (CORRAL_HTTP_UI)`);
  return [{ ...index, path: '/' }, ...files];
}
