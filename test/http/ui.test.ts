/**
 * The chat page as the HTTP API serves it (src/http/ui.ts) on a real port: `/` and the page's
 * files with their types and security headers, the files of the folder only (requests sent
 * byte for byte, so that no client normalizes a `..` away first), other methods 405, and `/` a
 * 404 when the page is off.
 */
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CorralError } from '../../src/base/errors.ts';
import { CHAT_PAGE_DIR } from '../../src/http/ui.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { answer, failure, startApi, type Api } from './helpers.ts';

const CSP =
  "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const tdb = useTestDatabase();
let api: Api;
let tmp: string;

beforeAll(async () => {
  api = await startApi(tdb.url, { ui: {} });
  tmp = await mkdtemp(join(tmpdir(), 'corral-ui-'));
});

afterAll(async () => {
  await api?.stop();
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

/** GET `path` exactly as written (no URL parser between), with the status and body. */
function rawGet(url: string, path: string): Promise<{ status: number; body: string; type: string | undefined }> {
  return new Promise((resolve, reject) => {
    const req = request(`${url}/`, { path, method: 'GET' }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body, type: res.headers['content-type'] }));
    });
    req.on('error', reject);
    req.end();
  });
}

describe('the chat page at /', () => {
  it('serves index.html at / and each file of examples/chat with its type, CSP, nosniff, no-store', async () => {
    const files: [string, string, string][] = [
      ['/', 'index.html', 'text/html; charset=utf-8'],
      ['/index.html', 'index.html', 'text/html; charset=utf-8'],
      ['/app.js', 'app.js', 'text/javascript; charset=utf-8'],
      ['/style.css', 'style.css', 'text/css; charset=utf-8'],
      ['/favicon.svg', 'favicon.svg', 'image/svg+xml'],
    ];
    for (const [path, file, type] of files) {
      const res = await api.call(path, { token: null });
      expect(res.status, path).toBe(200);
      expect(res.headers.get('content-type'), path).toBe(type);
      expect(res.headers.get('content-security-policy'), path).toBe(CSP);
      expect(res.headers.get('x-content-type-options'), path).toBe('nosniff');
      expect(res.headers.get('referrer-policy'), path).toBe('no-referrer');
      expect(res.headers.get('cache-control'), path).toBe('no-store');
      expect(res.headers.get('set-cookie'), path).toBeNull();
      expect(await res.text(), path).toBe(await readFile(join(CHAT_PAGE_DIR, file), 'utf8'));
    }
  });

  it('the page loads nothing from elsewhere and runs no inline script (what the CSP would refuse)', async () => {
    const html = await (await api.call('/', { token: null })).text();
    expect(html).not.toMatch(/<script(?![^>]*\bsrc=)/);
    expect(html).not.toMatch(/\son[a-z]+=/i);
    expect(html).not.toMatch(/(src|href)="(https?:)?\/\//);
    expect(html).not.toMatch(/<input[^>]*\bname=/);
    const js = await (await api.call('/app.js', { token: null })).text();
    expect(js).not.toMatch(/innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function/);
  });

  it('serves nothing outside the folder, however the path is written: the ordinary 404', async () => {
    const paths = [
      '/..%2f..%2fpackage.json',
      '/../package.json',
      '/../../package.json',
      '/%2e%2e/package.json',
      '/%2e%2e%2fpackage.json',
      '/..%5c..%5cpackage.json',
      '/..\\..\\package.json',
      '/package.json',
      '/examples/chat/app.js',
      '/src/http/ui.ts',
      '//etc/passwd',
      '/app.js/',
      '/app.js/..%2f..%2f..%2fpackage.json',
      '/APP.JS',
      '/%61pp.js%2f',
      '/.git/config',
      // the folder's server side (an application's backend) is not the page's
      '/backend.js',
    ];
    for (const path of paths) {
      const r = await rawGet(api.server.url, path);
      expect(r.status, path).toBe(404);
      expect(r.type, path).toMatch(/^application\/json/);
      expect(JSON.parse(r.body), path).toEqual(failure('not_found', /^no route GET/));
    }
  });

  it('takes GET only; off, / is a 404 as any unknown path', async () => {
    const post = await api.call('/', { method: 'POST', token: null });
    expect(await answer(post)).toEqual({ status: 405, body: failure('method_not_allowed', 'POST is not allowed here: GET / is') });
    expect(post.headers.get('allow')).toBe('GET');
    const off = await startApi(tdb.url);
    try {
      for (const path of ['/', '/index.html', '/app.js']) {
        expect(await answer(await off.call(path, { token: null })), path).toEqual({ status: 404, body: failure('not_found') });
      }
    } finally {
      await off.stop();
    }
  });

  it('of a folder, serves its regular files of known types: no link, dotfile, subfolder or other type', async () => {
    const dir = join(tmp, 'page');
    await mkdir(join(dir, 'sub'), { recursive: true });
    await writeFile(join(dir, 'index.html'), '<!doctype html><title>t</title>');
    await writeFile(join(dir, 'ok.js'), 'export {};');
    await writeFile(join(dir, '.secret.js'), 'secret');
    await writeFile(join(dir, 'notes.txt'), 'notes');
    await writeFile(join(dir, 'sub', 'deep.js'), 'deep');
    await writeFile(join(tmp, 'outside.js'), 'outside');
    await symlink(join(tmp, 'outside.js'), join(dir, 'link.js'));
    const page = await startApi(tdb.url, { ui: { dir } });
    try {
      expect((await page.call('/', { token: null })).status).toBe(200);
      expect(await (await page.call('/ok.js', { token: null })).text()).toBe('export {};');
      for (const path of ['/.secret.js', '/notes.txt', '/sub/deep.js', '/sub', '/link.js', '/outside.js']) {
        expect((await rawGet(page.server.url, path)).status, path).toBe(404);
      }
    } finally {
      await page.stop();
    }
  });

  it('a folder that is missing or has no index.html stops the start with invalid_config', async () => {
    await mkdir(join(tmp, 'empty'), { recursive: true });
    for (const [dir, message] of [
      [join(tmp, 'absent'), /cannot be read \(CORRAL_HTTP_UI\)/],
      [join(tmp, 'empty'), /has no index\.html \(CORRAL_HTTP_UI\)/],
    ] as const) {
      const error = await startApi(tdb.url, { ui: { dir } }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(CorralError);
      expect(error).toMatchObject({ code: 'invalid_config', message: expect.stringMatching(message) });
    }
  });
});
