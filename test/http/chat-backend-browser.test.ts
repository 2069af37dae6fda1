/**
 * The chat page behind an application's backend (examples/chat/backend.js), in a real browser:
 * the backend runs as a real child process (`node examples/chat/backend.js …`, its `corral`
 * import resolved to this checkout's sources by test/helpers/corral-from-source.mjs) on a real
 * daemon's HTTP API and the test database, with the example worker; headless Chromium (Debian's
 * `chromium`, puppeteer-core) opens the backend's page. No mock anywhere.
 *
 * Checked: the page asks the user's name and gets its token from `POST /token` (the answer, not
 * cached; the token's row: one actor `chat/<user>`, read and send, an expiry of the backend's
 * ttl), the reply streaming in through the backend's pass-through while its turn runs, then
 * committed; every request of the page to the backend's origin; another conversation's
 * transcript 404 with that token; the token in no URL; a token revoked replaced on the next send,
 * which goes through once; a token renewed before it expires, the page sending on after the old
 * one expired. And the backend's own answers: its page and headers, bad user names 400, bodies
 * over its limits 413, a wrong method 405, unknown paths 404, a cross-site token request 403,
 * headers passed through (Set-Cookie, Last-Event-ID), a daemon it cannot reach 502, `--help`,
 * a bad flag, and a graceful stop.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import puppeteer, { type Browser, type HTTPResponse, type Page } from 'puppeteer-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDaemon, type CorralDaemon } from '../../src/host/daemon.ts';
import { freePort } from '../../src/db/postgres/net.ts';
import { runExampleWorker } from '../../src/worker/example.ts';
import type { Worker } from '../../src/worker/sdk.ts';
import { testLogger } from '../helpers/daemon.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { rawRequest } from '../helpers/raw-request.ts';
import { trackChild } from '../helpers/processes.ts';
import { waitFor } from '../helpers/wait.ts';

// What the functions run in the page use of the DOM (the type check has Node's globals only).
interface PageElement {
  readonly textContent: string | null;
  readonly value: string;
  readonly dataset: Record<string, string | undefined>;
  readonly classList: { contains(name: string): boolean };
  closest(selector: string): PageElement | null;
  querySelector(selector: string): PageElement | null;
}
declare const document: {
  querySelector(selector: string): PageElement | null;
  querySelectorAll(selector: string): Iterable<PageElement> & { readonly length: number };
  readonly documentElement: { readonly outerHTML: string };
};
declare function getComputedStyle(e: PageElement): { readonly display: string };

const CHROMIUM = process.env.PUPPETEER_EXECUTABLE_PATH || '/usr/bin/chromium';
const BACKEND = resolve(import.meta.dirname, '../../examples/chat/backend.js');
const FROM_SOURCE = pathToFileURL(resolve(import.meta.dirname, '../helpers/corral-from-source.mjs')).href;
/** The reply streams over this long: a wide window to see it before the commit. */
const STREAM_MS = 2_000;
/** The short-lived backend's tokens: renewed a fifth of this before they expire. */
const SHORT_TTL_S = 4;

const tdb = useTestDatabase();
let daemon: CorralDaemon | undefined;
let worker: Worker | undefined;
let browser: Browser | undefined;
/** The backend most tests use (tokens for 10 minutes), and one whose tokens last seconds. */
let main: Backend;
let short: Backend;
const backends: Backend[] = [];

interface Backend {
  url: string;
  child: ChildProcess;
  output(): string;
  exited: Promise<number | null>;
}

/** The backend's command line run to its end (for `--help` and bad flags): its exit code and output. */
function runBackend(args: string[]): Promise<{ code: number | null; out: string }> {
  return new Promise((done, fail) => {
    const child = spawn(process.execPath, ['--import', FROM_SOURCE, BACKEND, ...args], {
      env: backendEnv(),
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    trackChild(child);
    let out = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (out += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (out += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
    child.on('error', fail);
    child.on('close', (code) => {
      clearTimeout(timer);
      done({ code, out });
    });
  });
}

function backendEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, DATABASE_URL: tdb.url };
  delete env.NODE_OPTIONS;
  return env;
}

/** A backend process on any free port, once it listens (its output on failure). */
async function startBackend(args: string[]): Promise<Backend> {
  const child = spawn(process.execPath, ['--import', FROM_SOURCE, BACKEND, '--port', '0', ...args], {
    env: backendEnv(),
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  trackChild(child);
  let out = '';
  child.stdout!.setEncoding('utf8').on('data', (d: string) => (out += d));
  child.stderr!.setEncoding('utf8').on('data', (d: string) => (out += d));
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  const backend: Backend = { url: '', child, output: () => out, exited };
  backends.push(backend);
  backend.url = await waitFor(
    () => {
      if (child.exitCode !== null) throw new Error(`the backend exited ${child.exitCode}:\n${out}`);
      return /listening on (http:\/\/127\.0\.0\.1:\d+)\//.exec(out)?.[1];
    },
    { timeoutMs: 30_000, what: () => `the backend to listen; its output:\n${out}` },
  );
  return backend;
}

/** SIGTERM, and its exit code once it exited (at most 10 s; then SIGKILL, and null). */
async function stopBackend(b: Backend): Promise<number | null> {
  if (b.child.exitCode !== null) return b.child.exitCode;
  b.child.kill('SIGTERM');
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<'late'>((r) => (timer = setTimeout(() => r('late'), 10_000)));
  const code = await Promise.race([b.exited, late]);
  clearTimeout(timer);
  if (code !== 'late') return code;
  b.child.kill('SIGKILL');
  await b.exited;
  return null;
}

beforeAll(async () => {
  if (!existsSync(CHROMIUM)) {
    throw new Error(
      `Chromium is not installed (no ${CHROMIUM}): this test drives a real browser. Install Debian's package as root: ` +
        '`apt-get update && apt-get install -y --no-install-recommends chromium` (.ci/run does it)',
    );
  }
  daemon = createDaemon({
    databaseUrl: tdb.url,
    logger: testLogger,
    endpoint: 'tcp://127.0.0.1:0',
    insecure: true,
    pollIntervalMs: 200,
    drainMs: 0,
    skipMigrations: true,
    httpPort: await freePort(),
  });
  await daemon.start();
  worker = await runExampleWorker({ endpoint: daemon.endpoint!, workerId: 'chat-backend-w1', capacity: 4, logger: testLogger });
  [main, short] = await Promise.all([
    startBackend(['--api', daemon.httpUrl!, '--agent', 'chat', '--ttl', '10m']),
    startBackend(['--api', daemon.httpUrl!, '--ttl', `${SHORT_TTL_S}s`]),
  ]);
  browser = await puppeteer.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--headless=new'] });
});

afterAll(async () => {
  await browser?.close();
  for (const b of backends) await stopBackend(b);
  await worker?.stop();
  await daemon?.stop();
});

interface Seen {
  /** Console errors and page errors (a CSP violation is one). */
  problems: string[];
  /** Every URL the page requested. */
  urls: string[];
  /** The answers of POST /token, with the body the page sent. */
  tokens: Promise<{ status: number; headers: Record<string, string>; body: unknown; sent: unknown }>[];
}

async function openPage(url: string): Promise<{ page: Page; seen: Seen }> {
  const page = await browser!.newPage();
  const seen: Seen = { problems: [], urls: [], tokens: [] };
  page.on('console', (m) => {
    if (m.type() === 'error') seen.problems.push(`console: ${m.text()}`);
  });
  page.on('pageerror', (e) => seen.problems.push(`page: ${String(e)}`));
  page.on('request', (r) => seen.urls.push(r.url()));
  page.on('response', (r: HTTPResponse) => {
    if (new URL(r.url()).pathname !== '/token') return;
    seen.tokens.push(
      (async () => ({
        status: r.status(),
        headers: r.headers(),
        body: (await r.json()) as unknown,
        sent: JSON.parse(r.request().postData() ?? 'null') as unknown,
      }))(),
    );
  });
  await page.goto(url, { waitUntil: 'load' });
  return { page, seen };
}

const statusIs = (page: Page, text: string, timeout = 15_000) =>
  page.waitForFunction((t) => document.querySelector('#status')?.textContent === t, { timeout }, text);

/** Whether the field of each input shows (a `hidden` field has display none, whatever its class says). */
const shown = (page: Page, ids: string[]) =>
  page.evaluate((list) => list.map((id) => getComputedStyle(document.querySelector(`#${id}`)!.closest('.field')!).display !== 'none'), ids);

/** The texts of the conversation's bubbles, as `role/state: text`. */
const bubbles = (page: Page) =>
  page.$$eval('#transcript > li', (items) =>
    items.map(
      (li) =>
        `${li.classList.contains('msg-user') ? 'user' : 'assistant'}/${(li as unknown as PageElement).dataset.state}: ${li.querySelector('.text')?.textContent}`,
    ),
  );

const tokenOf = (page: Page) => page.evaluate(() => sessionStorage.getItem('corral.chat.token'));

interface TokenRow {
  name: string;
  scopes: string[];
  actors: string[];
  ttl_ms: number;
  expires_at: Date;
  revoked: boolean;
}
async function tokenRows(user: string): Promise<TokenRow[]> {
  const r = await tdb.client.query<TokenRow>(
    `select name, scopes, actors, (extract(epoch from expires_at - created_at) * 1000)::int as ttl_ms, expires_at,
            revoked_at is not null as revoked
       from corral.api_tokens where name like $1 order by created_at`,
    [`chat-${user}-%`],
  );
  return r.rows;
}

/** Sends `text` from the page and waits for its reply to commit. */
async function sendAndCommit(page: Page, text: string): Promise<void> {
  await page.type('#message', text);
  await page.keyboard.press('Enter');
  await page.waitForFunction(
    (r) =>
      !document.querySelector('#transcript li[data-state="streaming"]') &&
      !document.querySelector('#transcript li[data-state="pending"]') &&
      [...document.querySelectorAll('#transcript li.msg-assistant[data-state="committed"] .text')].some((e) => e.textContent === r),
    { timeout: 20_000 },
    `echo: ${text}`,
  );
}

describe('the chat page behind an application backend, in Chromium', () => {
  it('asks the name, gets a token for that one conversation, streams and commits through the backend, reads no other; a revoked token is replaced', async () => {
    const user = `alice${Date.now().toString(36)}`;
    const actor = `chat/${user}`;
    const { page, seen } = await openPage(`${main.url}/`);
    // the backend's page: a name to give, no token or actor to type; no token asked for yet
    expect(await shown(page, ['user', 'actor', 'token'])).toEqual([true, false, false]);
    expect(await page.$eval('#status', (e) => e.textContent)).toBe('Not connected.');
    expect(seen.urls.filter((u) => u.endsWith('/token'))).toEqual([]);

    await page.type('#user', user);
    await page.click('#connect');
    await statusIs(page, `Connected to ${actor}.`);
    expect(seen.tokens).toHaveLength(1);
    const minted = await seen.tokens[0]!;
    expect(minted.sent).toEqual({ user });
    expect(minted.status).toBe(200);
    expect(minted.headers['cache-control']).toBe('no-store');
    expect(minted.headers['content-type']).toMatch(/^application\/json/);
    const answer = minted.body as { token: string; actor: string; expiresAt: string };
    expect(Object.keys(answer).sort()).toEqual(['actor', 'expiresAt', 'token']);
    expect(answer.token).toMatch(/^crl_/);
    expect(answer.actor).toBe(actor);
    const token = answer.token;
    expect(await tokenOf(page)).toBe(token);
    // its row: this one conversation, read and send, ten minutes, a name of its own
    const rows = await tokenRows(user);
    expect(rows.map(({ expires_at: _, ...r }) => r)).toEqual([
      {
        name: expect.stringMatching(new RegExp(`^chat-${user}-[0-9a-f]{12}$`)),
        scopes: ['read', 'send'],
        actors: [actor],
        ttl_ms: 600_000,
        revoked: false,
      },
    ]);
    expect(rows[0]!.expires_at.getTime()).toBe(Date.parse(answer.expiresAt));

    // the send streams slowly, so its reply shows before the commit (through the pass-through)
    await page.setRequestInterception(true);
    page.on('request', (r) => {
      if (r.isInterceptResolutionHandled()) return;
      if (r.method() === 'POST' && r.url() === `${main.url}/v1/actors/${actor}/events`) {
        const body = JSON.parse(r.postData() ?? 'null') as Record<string, unknown>;
        void r.continue({ postData: JSON.stringify({ ...body, streamMs: STREAM_MS }) });
      } else void r.continue();
    });
    const message = 'does the backend pass my stream through as it comes?';
    const reply = `echo: ${message}`;
    await page.type('#message', message);
    await page.keyboard.press('Enter');
    const partial = await page.waitForFunction(
      () => {
        const li = document.querySelector('#transcript li[data-state="streaming"]');
        const text = li?.querySelector('.text')?.textContent ?? '';
        return text.length > 0 ? { text, eventId: li!.dataset.eventId! } : false;
      },
      { timeout: 15_000, polling: 'mutation' },
    );
    const early = (await partial.jsonValue()) as { text: string; eventId: string };
    expect(reply.startsWith(early.text)).toBe(true);
    expect(early.text.length).toBeLessThan(reply.length);
    // part of the reply is on the page while its turn has not committed
    const state = await fetch(`${main.url}/v1/events/${early.eventId}`, { headers: { authorization: `Bearer ${token}` } });
    expect(((await state.json()) as { state: string }).state).toBe('pending');
    await page.waitForFunction(
      (r) =>
        !document.querySelector('#transcript li[data-state="streaming"]') &&
        !document.querySelector('#transcript li[data-state="pending"]') &&
        [...document.querySelectorAll('#transcript li.msg-assistant[data-state="committed"] .text')].some((e) => e.textContent === r),
      { timeout: 20_000 },
      reply,
    );
    expect(await bubbles(page)).toEqual([`user/committed: ${message}`, `assistant/committed: ${reply}`]);

    // everything the page asked for, its stream included, went to the backend's origin
    expect(seen.urls).toContain(`${main.url}/v1/actors/${actor}/stream`);
    expect(seen.urls.filter((u) => new URL(u).origin !== main.url)).toEqual([]);
    // no CSP violation, no failed load, no script error so far (the 404 below is on purpose)
    expect(seen.problems).toEqual([]);

    // the page's token reads its own conversation only: another one is 404, as if it did not exist
    const read = (path: string) =>
      page.evaluate(
        async (p, t) => {
          const res = await fetch(p, { headers: { authorization: `Bearer ${t}` } });
          return { status: res.status, body: await res.text() };
        },
        path,
        token,
      );
    const other = await read('/v1/actors/chat/bob/transcript');
    expect(other.status).toBe(404);
    expect(JSON.parse(other.body)).toEqual({
      error: { code: 'not_found', message: expect.stringContaining('not one this token may touch') },
    });
    expect((await read(`/v1/actors/${actor}/transcript`)).status).toBe(200);
    for (const url of [...seen.urls, page.url()]) expect(url).not.toContain(token);
    expect(await page.evaluate(() => document.documentElement.outerHTML)).not.toContain(token);

    // the token revoked: the next send gets a new one from the backend and goes through, once
    await tdb.client.query(`update corral.api_tokens set revoked_at = now() where name = $1`, [rows[0]!.name]);
    await sendAndCommit(page, 'and after my token was revoked?');
    const renewed = await tokenOf(page);
    expect(renewed).toMatch(/^crl_/);
    expect(renewed).not.toBe(token);
    const after = await tokenRows(user);
    expect(after.length).toBeGreaterThanOrEqual(2);
    expect(after.filter((r) => !r.revoked).map((r) => r.actors)).toContainEqual([actor]);
    expect(after.every((r) => r.actors.length === 1 && r.actors[0] === actor)).toBe(true);
    expect(await bubbles(page)).toEqual([
      `user/committed: ${message}`,
      `assistant/committed: ${reply}`,
      'user/committed: and after my token was revoked?',
      'assistant/committed: echo: and after my token was revoked?',
    ]);
    for (const url of [...seen.urls, page.url()]) expect(url).not.toContain(renewed!);
    await page.close();
  });

  it('renews its token before it expires, and sends and streams on after the first one expired', async () => {
    const user = `carol${Date.now().toString(36)}`;
    const actor = `chat/${user}`;
    // a link may name the conversation: it fills the name in, and the user still signs in
    const { page, seen } = await openPage(`${short.url}/?actor=${encodeURIComponent(actor)}`);
    expect(await page.$eval('#user', (e) => (e as unknown as PageElement).value)).toBe(user);
    expect(seen.urls.filter((u) => u.endsWith('/token'))).toEqual([]);
    await page.click('#connect');
    await statusIs(page, `Connected to ${actor}.`);
    const first = await tokenOf(page);
    const [row] = await tokenRows(user);
    expect(row).toMatchObject({ actors: [actor], scopes: ['read', 'send'], ttl_ms: SHORT_TTL_S * 1000 });
    // a new token before the first one expires, with no request of the page failing
    await page.waitForFunction((t) => sessionStorage.getItem('corral.chat.token') !== t, { timeout: SHORT_TTL_S * 1000 + 5_000 }, first);
    expect(Date.now()).toBeLessThan(row!.expires_at.getTime());
    await waitFor(() => Date.now() > row!.expires_at.getTime() + 500, {
      timeoutMs: SHORT_TTL_S * 1000 + 2_000,
      what: 'the first token to expire',
    });
    await sendAndCommit(page, 'still here?');
    expect(await bubbles(page)).toEqual(['user/committed: still here?', 'assistant/committed: echo: still here?']);
    const rows = await tokenRows(user);
    expect(rows.length).toBeGreaterThanOrEqual(2);
    for (const r of rows)
      expect(r).toMatchObject({ actors: [actor], scopes: ['read', 'send'], ttl_ms: SHORT_TTL_S * 1000, revoked: false });
    // each answer asked for this user and said when it expires; none was refused
    const answers = await Promise.all(seen.tokens);
    expect(answers.length).toBeGreaterThanOrEqual(2);
    for (const a of answers) {
      expect(a).toMatchObject({ status: 200, sent: { user }, body: { actor, token: expect.stringMatching(/^crl_/) } });
      expect(Date.parse((a.body as { expiresAt: string }).expiresAt)).toBeGreaterThan(0);
    }
    expect(seen.problems).toEqual([]);
    await page.close();
  });

  it('serves its page with the strict headers and the token route, and refuses bad names, large bodies, wrong methods and unknown paths', async () => {
    const page = await fetch(`${main.url}/`);
    expect(page.status).toBe(200);
    expect(page.headers.get('content-type')).toBe('text/html; charset=utf-8');
    expect(page.headers.get('content-security-policy')).toContain("connect-src 'self'");
    expect(page.headers.get('content-security-policy')).toContain("script-src 'self'");
    expect(page.headers.get('cache-control')).toBe('no-store');
    expect(page.headers.get('x-content-type-options')).toBe('nosniff');
    expect(await page.text()).toContain('<meta name="corral-token-route" content="/token" />');
    expect((await fetch(`${main.url}/app.js`)).headers.get('content-type')).toBe('text/javascript; charset=utf-8');

    const before = (await tdb.client.query<{ n: number }>('select count(*)::int as n from corral.api_tokens')).rows[0]!.n;
    const post = (body: string, type = 'application/json', query = '') =>
      fetch(`${main.url}/token${query}`, { method: 'POST', headers: { 'content-type': type }, body });
    const refusal = async (res: Response) => ({
      status: res.status,
      code: ((await res.json()) as { error: { code: string } }).error.code,
      type: res.headers.get('content-type'),
      cache: res.headers.get('cache-control'),
    });
    const invalidUser = { status: 400, code: 'invalid_user', type: 'application/json; charset=utf-8', cache: 'no-store' };
    for (const user of ['../admin', '..', '.', '.x', '-x', 'x'.repeat(41), '', 'al ice', 'ålice', 'a/b', 'a*', 'a%2Fb', 7, null, ['a']]) {
      expect(await refusal(await post(JSON.stringify({ user }))), JSON.stringify(user)).toEqual(invalidUser);
    }
    expect(await refusal(await post('{}'))).toEqual(invalidUser);
    expect(await refusal(await post('user=..', 'application/x-www-form-urlencoded'))).toEqual(invalidUser);
    expect(await refusal(await post('', 'application/json', '?user=a%2Fb'))).toEqual(invalidUser);
    expect(await refusal(await post('{not json'))).toMatchObject({ status: 400, code: 'invalid_json' });
    expect(await refusal(await post('user: a', 'text/plain'))).toMatchObject({ status: 415, code: 'unsupported_media_type' });
    expect(await refusal(await post(JSON.stringify({ user: 'a', pad: 'x'.repeat(2048) })))).toMatchObject({
      status: 413,
      code: 'payload_too_large',
    });
    // a request a page of another site made the browser send
    const crossSite = await rawRequest(`${main.url}/token`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'sec-fetch-site': 'cross-site' },
      body: '{"user":"mallory"}',
    });
    expect([crossSite.status, JSON.parse(crossSite.body).error.code]).toEqual([403, 'forbidden']);
    expect((await tdb.client.query<{ n: number }>('select count(*)::int as n from corral.api_tokens')).rows[0]!.n).toBe(before);

    // the name from a form field, or from the query
    const dave = `dave${Date.now().toString(36)}`;
    const form = await post(`user=${dave}`, 'application/x-www-form-urlencoded');
    expect(form.status).toBe(200);
    const daveToken = (await form.json()) as { token: string; actor: string; expiresAt: string };
    expect(daveToken).toMatchObject({ actor: `chat/${dave}`, token: expect.stringMatching(/^crl_/) });
    const erin = `erin${Date.now().toString(36)}`;
    const query = await post('', 'application/json', `?user=${erin}`);
    expect([query.status, ((await query.json()) as { actor: string }).actor]).toEqual([200, `chat/${erin}`]);
    expect((await tokenRows(dave)).map((r) => r.actors)).toEqual([[`chat/${dave}`]]);
    expect((await tokenRows(erin)).map((r) => r.actors)).toEqual([[`chat/${erin}`]]);

    const methodOf = async (res: Response) => [
      res.status,
      res.headers.get('allow'),
      ((await res.json()) as { error: { code: string } }).error.code,
    ];
    expect(await methodOf(await fetch(`${main.url}/token`))).toEqual([405, 'POST', 'method_not_allowed']);
    expect(await methodOf(await fetch(`${main.url}/token`, { method: 'PUT', body: '{}' }))).toEqual([405, 'POST', 'method_not_allowed']);
    expect(await methodOf(await fetch(`${main.url}/`, { method: 'POST', body: '' }))).toEqual([405, 'GET, HEAD', 'method_not_allowed']);
    expect(await methodOf(await fetch(`${main.url}/app.js`, { method: 'DELETE' }))).toEqual([405, 'GET, HEAD', 'method_not_allowed']);
    for (const path of [
      '/nope',
      '/backend.js',
      '/v1',
      '/v2/x',
      '/token/x',
      '/package.json',
      '/%2e%2e/package.json',
      '/.git/config',
      '/v1/../backend.js',
    ]) {
      const r = await rawRequest(`${main.url}${path}`, { method: 'GET' });
      expect([r.status, JSON.parse(r.body).error.code], path).toEqual([404, 'not_found']);
    }

    // a body over the pass-through's limit is refused by the backend, never sent on
    const large = await rawRequest(`${main.url}/v1/actors/chat/${dave}/events`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${daveToken.token}` },
      body: JSON.stringify({ text: 'x'.repeat(600 * 1024) }),
    });
    expect(large.status).toBe(413);
    expect(JSON.parse(large.body)).toEqual({
      error: { code: 'payload_too_large', message: expect.stringContaining("the backend's limit") },
    });
  });

  it('passes the API through: its status, Set-Cookie, Last-Event-ID and an event stream as it comes; 502 without a daemon', async () => {
    const user = `frank${Date.now().toString(36)}`;
    const minted = await fetch(`${main.url}/token`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ user }),
    });
    const { token } = (await minted.json()) as { token: string };
    const auth = { authorization: `Bearer ${token}` };

    // the session cookie of the API, as it set it
    const session = await fetch(`${main.url}/v1/session`, { method: 'POST', headers: auth });
    expect(session.status).toBe(204);
    expect(session.headers.getSetCookie()).toEqual([
      expect.stringMatching(/^corral_session=crl_[^;]+; HttpOnly; SameSite=Strict; Path=\/v1; Max-Age=\d+$/),
    ]);
    // the API's own refusals, as they are
    const unauthorized = await fetch(`${main.url}/v1/actors/chat/${user}/transcript`);
    expect([unauthorized.status, ((await unauthorized.json()) as { error: { code: string } }).error.code]).toEqual([401, 'unauthorized']);
    // the cookie alone reads (a GET), with the application's own cookies next to it
    const byCookie = await fetch(`${main.url}/v1/actors/chat/${user}/transcript`, {
      headers: { cookie: `app_session=not-for-corral; corral_session=${token}` },
    });
    expect(byCookie.status).toBe(200);
    // Last-Event-ID reaches the API: one it does not take is its 400, not the stream
    const badResume = await fetch(`${main.url}/v1/actors/chat/${user}/stream`, { headers: { ...auth, 'last-event-id': 'x'.repeat(201) } });
    expect(badResume.status).toBe(400);
    expect(((await badResume.json()) as { error: { message: string } }).error.message).toMatch(/last-event-id/i);

    // the stream's head comes at once, and an event while the stream stays open
    const abort = new AbortController();
    const stream = await fetch(`${main.url}/v1/actors/chat/${user}/stream`, { headers: auth, signal: abort.signal });
    expect(stream.status).toBe(200);
    expect(stream.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
    const reader = stream.body!.getReader();
    const send = await fetch(`${main.url}/v1/actors/chat/${user}/events`, {
      method: 'POST',
      headers: { ...auth, 'content-type': 'application/json' },
      body: JSON.stringify({ text: 'through the pass-through', stream: true, streamMs: STREAM_MS }),
    });
    expect(send.status).toBe(202);
    let text = '';
    const decoder = new TextDecoder();
    const deadline = Date.now() + 15_000;
    while (!text.includes('event: chunk') && Date.now() < deadline) {
      const { value, done } = await Promise.race([
        reader.read(),
        new Promise<never>((_, r) => setTimeout(() => r(new Error('no event within 15 s')), 15_000)),
      ]);
      if (done) break;
      text += decoder.decode(value, { stream: true });
    }
    // a piece of the reply came while its turn ran (it streams over two seconds): not buffered
    expect(text).toContain('event: turn_started');
    expect(text).toContain('event: chunk');
    expect(text).not.toContain('event: turn_committed');
    abort.abort();

    // a backend whose daemon is not there: 502, with a clear code; then a graceful stop
    const dead = await startBackend(['--api', `http://127.0.0.1:${await freePort()}`]);
    const gone = await fetch(`${dead.url}/v1/actors/chat/${user}/transcript`, { headers: auth });
    expect(gone.status).toBe(502);
    expect(await gone.json()).toEqual({
      error: { code: 'bad_gateway', message: expect.stringContaining('the corral API cannot be reached') },
    });
    expect(await stopBackend(dead)).toBe(0);
    expect(dead.output()).toContain('stopping');
    // the log names tokens, never their text
    expect(main.output()).toContain(`for chat/${user}, until`);
    expect(main.output()).not.toContain(token);
  });

  it('--help says what it takes; a bad flag or setting exits 2, naming it', async () => {
    const cases: [string[], string][] = [
      [['--bogus'], "Unknown option '--bogus'"],
      [['--ttl', '5x'], '--ttl: a duration'],
      [['--agent', 'chat*'], '--agent: 1-128'],
      [['--port', '70000'], '--port: a port number'],
      [['--api', 'ftp://x'], "--api: the daemon's HTTP API"],
    ];
    const [help, ...bad] = await Promise.all([runBackend(['--help']), ...cases.map(([args]) => runBackend(args))]);
    expect(help!.code).toBe(0);
    for (const word of ['Usage:', '--port', '--api', '--agent', '--ttl', 'DATABASE_URL', 'CHAT_API_URL', 'login session'])
      expect(help!.out).toContain(word);
    cases.forEach(([args, says], i) => {
      expect(bad[i]!.code, args.join(' ')).toBe(2);
      expect(bad[i]!.out, args.join(' ')).toContain(says);
      expect(bad[i]!.out, args.join(' ')).toContain('Usage:');
    });
  });
});
