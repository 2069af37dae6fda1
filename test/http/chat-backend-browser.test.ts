/**
 * The chat page behind an application's backend (examples/chat-backend/backend.js), in a real
 * browser: headless Chromium (Debian's `chromium`, puppeteer-core) opens the backend's page, which
 * takes its token from the backend's `POST /token` (a token for its one conversation, short-lived)
 * and talks to the daemon's API through the backend's pass-through, streams included. A real
 * daemon with its HTTP API, the example worker, a test database, the backend's real HTTP server.
 * Checked: the token's row (one actor, an expiry, read and send), the reply streaming in before
 * its commit and then committed, another conversation's transcript 404 with that token, the token
 * in no URL, no CSP violation; and the backend's refusals (a bad user 400, a body too large 413,
 * a wrong method 405, an unknown path 404, a daemon it cannot reach 502).
 */
import { existsSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import puppeteer, { type Browser, type Page } from 'puppeteer-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connect, type Corral } from '../../src/client/index.ts';
import { createDaemon, type CorralDaemon } from '../../src/host/daemon.ts';
import { freePort } from '../../src/db/postgres/net.ts';
import { runExampleWorker } from '../../src/worker/example.ts';
import type { Worker } from '../../src/worker/sdk.ts';
// @ts-expect-error: an example in plain JavaScript, without declarations
import { createChatBackend } from '../../examples/chat-backend/backend.js';
import { testLogger } from '../helpers/daemon.ts';
import { useTestDatabase } from '../helpers/db.ts';

// What the functions run in the page use of the DOM (the type check has Node's globals only).
interface PageElement {
  readonly textContent: string | null;
  readonly value: string;
  readonly hidden: boolean;
  readonly dataset: Record<string, string | undefined>;
  closest(selector: string): PageElement | null;
  querySelector(selector: string): PageElement | null;
}
declare const document: {
  querySelector(selector: string): PageElement | null;
  querySelectorAll(selector: string): Iterable<PageElement> & { readonly length: number };
};

type Handler = (req: unknown, res: unknown) => void;
const makeBackend = createChatBackend as (opts: { corral: Corral; apiUrl: string; agent?: string; ttl?: string }) => Promise<Handler>;

const CHROMIUM = process.env.PUPPETEER_EXECUTABLE_PATH || '/usr/bin/chromium';
const STREAM_MS = 2_000;

const tdb = useTestDatabase();
let daemon: CorralDaemon | undefined;
let worker: Worker | undefined;
let browser: Browser | undefined;
let corral: Corral | undefined;
const servers: Server[] = [];
let backend: string;

async function serve(handler: Handler): Promise<string> {
  const server = createServer(handler as Parameters<typeof createServer>[1]);
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
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
  worker = await runExampleWorker({ endpoint: daemon.endpoint!, workerId: 'chat-backend-w1', capacity: 2, logger: testLogger });
  corral = await connect({ databaseUrl: tdb.url, env: {} });
  backend = await serve(await makeBackend({ corral, apiUrl: daemon.httpUrl!, agent: 'chat', ttl: '10m' }));
  browser = await puppeteer.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--headless=new'] });
});

afterAll(async () => {
  await browser?.close();
  for (const s of servers) {
    s.closeAllConnections();
    await new Promise((r) => s.close(r));
  }
  await corral?.close();
  await worker?.stop();
  await daemon?.stop();
});

const bubbles = (page: Page) =>
  page.$$eval('#transcript > li', (items) =>
    items.map(
      (li) =>
        `${li.classList.contains('msg-user') ? 'user' : 'assistant'}/${(li as unknown as PageElement).dataset.state}: ${li.querySelector('.text')?.textContent}`,
    ),
  );

describe('the chat page behind an application backend, in Chromium', () => {
  it('gets a token for its one conversation from the backend, sends, streams and commits through it, and reads no other conversation', async () => {
    const page = await browser!.newPage();
    const problems: string[] = [];
    const urls: string[] = [];
    page.on('console', (m) => {
      if (m.type() === 'error') problems.push(`console: ${m.text()}`);
    });
    page.on('pageerror', (e) => problems.push(`page: ${String(e)}`));
    page.on('request', (r) => urls.push(r.url()));
    const user = `alice${Date.now().toString(36)}`;
    await page.goto(`${backend}/?actor=${encodeURIComponent(`chat/${user}`)}`, { waitUntil: 'load' });
    await page.waitForFunction(
      (a) => document.querySelector('#status')?.textContent === `Connected to ${a}.`,
      { timeout: 15_000 },
      `chat/${user}`,
    );
    // no token field: the backend gives the token
    expect(await page.$eval('#token', (e) => (e as unknown as PageElement).closest('.field')!.hidden)).toBe(true);
    const token = await page.evaluate(() => sessionStorage.getItem('corral.chat.token'));
    expect(token).toMatch(/^crl_/);
    const rows = await tdb.client.query<{ scopes: string[]; actors: string[]; ttl_s: number }>(
      `select scopes, actors, extract(epoch from expires_at - created_at)::int as ttl_s from corral.api_tokens where name like $1`,
      [`chat-${user}-%`],
    );
    expect(rows.rows).toEqual([{ scopes: ['read', 'send'], actors: [`chat/${user}`], ttl_s: 600 }]);

    // the send streams slowly, so its reply shows before the commit (through the pass-through)
    await page.setRequestInterception(true);
    page.on('request', (r) => {
      if (r.isInterceptResolutionHandled()) return;
      if (r.method() === 'POST' && r.url().endsWith(`/v1/actors/chat/${user}/events`)) {
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
    const state = await fetch(`${backend}/v1/events/${early.eventId}`, { headers: { authorization: `Bearer ${token}` } });
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

    // no CSP violation, no failed load, no script error so far (the 404 below is on purpose)
    expect(problems).toEqual([]);
    // the page's token reads its own conversation only: another one is 404, as if it did not exist
    const other = await page.evaluate(async (t) => {
      const res = await fetch('/v1/actors/chat/bob/transcript', { headers: { authorization: `Bearer ${t}` } });
      return { status: res.status, body: await res.text() };
    }, token!);
    expect(other.status).toBe(404);
    expect(JSON.parse(other.body)).toEqual({
      error: { code: 'not_found', message: expect.stringContaining('not one this token may touch') },
    });
    const own = await page.evaluate(
      async ([t, u]) => (await fetch(`/v1/actors/chat/${u}/transcript`, { headers: { authorization: `Bearer ${t}` } })).status,
      [token!, user] as const,
    );
    expect(own).toBe(200);
    expect(urls.some((u) => u.includes(token!))).toBe(false);
    await page.close();
  });

  it('refuses a bad user, a body too large, a wrong method and an unknown path, and says when the daemon cannot be reached', async () => {
    const post = (body: string, type = 'application/json') =>
      fetch(`${backend}/token`, { method: 'POST', headers: { 'content-type': type }, body });
    const codeOf = async (res: Response) => [res.status, ((await res.json()) as { error: { code: string } }).error.code];
    expect(await codeOf(await post(JSON.stringify({ user: '../admin' })))).toEqual([400, 'invalid_user']);
    expect(await codeOf(await post(JSON.stringify({ user: 'x'.repeat(41) })))).toEqual([400, 'invalid_user']);
    expect(await codeOf(await post(JSON.stringify({ user: 7 })))).toEqual([400, 'invalid_user']);
    expect(await codeOf(await post('{not json'))).toEqual([400, 'invalid_json']);
    expect(await codeOf(await post(JSON.stringify({ user: 'a', pad: 'x'.repeat(4096) })))).toEqual([413, 'payload_too_large']);
    expect(await codeOf(await post('user=a', 'application/x-www-form-urlencoded'))).toEqual([415, 'unsupported_media_type']);
    const get = await fetch(`${backend}/token`);
    expect([get.status, get.headers.get('allow')]).toEqual([405, 'POST']);
    expect((await fetch(`${backend}/../package.json`)).status).toBe(404);
    expect((await fetch(`${backend}/backend.js`)).status).toBe(404);
    // nothing was minted for any of them
    const minted = await tdb.client.query<{ n: number }>(`select count(*)::int as n from corral.api_tokens where name like 'chat-a-%'`);
    expect(minted.rows[0]!.n).toBe(0);
    // a backend whose daemon is gone: 502, with a clear code
    const dead = await serve(await makeBackend({ corral: corral!, apiUrl: `http://127.0.0.1:${await freePort()}` }));
    expect(await codeOf(await fetch(`${dead}/v1/actors/chat/x/transcript`))).toEqual([502, 'bad_gateway']);
  });
});
