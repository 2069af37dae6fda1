/**
 * The chat page in a real browser: headless Chromium (Debian's `chromium`, driven by
 * puppeteer-core) against a real daemon serving the API and the page (`httpUi`), an example
 * worker and a test database. A user opens `/?actor=…`, types a token and a message, and sends:
 * the reply shows in the page while its turn still runs (text in the streaming bubble, its event
 * not yet committed, every piece a prefix of the reply), then the committed transcript holds the
 * whole reply. Along the way: the page's request is the documented one, the token is in no URL
 * and no script-readable cookie, the session cookie is HttpOnly and SameSite=Strict, the browser's
 * cookie alone cannot send, and the page breaks no rule of its Content-Security-Policy.
 *
 * Chromium is required, not optional: without it this file fails, saying how to install it.
 */
import { existsSync } from 'node:fs';
import puppeteer, { type Browser, type Page } from 'puppeteer-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDaemon, type CorralDaemon } from '../../src/host/daemon.ts';
import { freePort } from '../../src/db/postgres/net.ts';
import { createToken } from '../../src/ops/api-tokens.ts';
import { runExampleWorker } from '../../src/worker/example.ts';
import type { Worker } from '../../src/worker/sdk.ts';
import { testLogger } from '../helpers/daemon.ts';
import { useTestDatabase } from '../helpers/db.ts';

// What the functions run in the page use of the DOM: the type check has Node's globals, not a
// browser's, so they are declared here, for this file alone.
interface PageElement {
  readonly textContent: string | null;
  readonly value: string;
  readonly dataset: Record<string, string | undefined>;
  readonly classList: { contains(name: string): boolean };
  querySelector(selector: string): PageElement | null;
}
declare const document: {
  querySelector(selector: string): PageElement | null;
  querySelectorAll(selector: string): Iterable<PageElement> & { readonly length: number };
  readonly cookie: string;
  readonly documentElement: { readonly outerHTML: string };
};
declare const window: { partials?: string[] };
declare class MutationObserver {
  constructor(callback: () => void);
  observe(target: PageElement, options: { subtree: boolean; childList: boolean; characterData: boolean }): void;
}

const CHROMIUM = process.env.PUPPETEER_EXECUTABLE_PATH || '/usr/bin/chromium';
/** The reply streams over this long: a wide window to see it before the commit. */
const STREAM_MS = 2_000;

const tdb = useTestDatabase();
let daemon: CorralDaemon | undefined;
let worker: Worker | undefined;
let browser: Browser | undefined;
let token: string;
let base: string;

beforeAll(async () => {
  if (!existsSync(CHROMIUM)) {
    throw new Error(
      `Chromium is not installed (no ${CHROMIUM}): this test drives a real browser. Install Debian's package as root: ` +
        '`apt-get update && apt-get install -y --no-install-recommends chromium` (.ci/run does it), ' +
        'or point PUPPETEER_EXECUTABLE_PATH at a Chromium or Chrome executable',
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
    httpUi: true,
  });
  await daemon.start();
  base = daemon.httpUrl!;
  worker = await runExampleWorker({ endpoint: daemon.endpoint!, workerId: 'chat-w1', capacity: 2, logger: testLogger });
  token = (await createToken(tdb.database.db, 'chat-page', ['read', 'send'])).token;
  browser = await puppeteer.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--headless=new'] });
});

afterAll(async () => {
  await browser?.close();
  await worker?.stop();
  await daemon?.stop();
});

interface Seen {
  /** Console errors and page errors (a CSP violation is one). */
  problems: string[];
  /** Every URL the page requested. */
  urls: string[];
}

async function openPage(path: string): Promise<{ page: Page; seen: Seen }> {
  const page = await browser!.newPage();
  const seen: Seen = { problems: [], urls: [] };
  page.on('console', (m) => {
    if (m.type() === 'error') seen.problems.push(`console: ${m.text()}`);
  });
  page.on('pageerror', (e) => seen.problems.push(`page: ${String(e)}`));
  page.on('request', (r) => seen.urls.push(r.url()));
  await page.goto(`${base}${path}`, { waitUntil: 'load' });
  return { page, seen };
}

const statusOf = (page: Page) => page.$eval('#status', (e) => e.textContent);

/** The texts of the conversation's bubbles, as `role: text`. */
const bubbles = (page: Page) =>
  page.$$eval('#transcript > li', (items) =>
    items.map(
      (li) => `${li.classList.contains('msg-user') ? 'user' : 'assistant'}/${li.dataset.state}: ${li.querySelector('.text')?.textContent}`,
    ),
  );

async function eventState(eventId: string): Promise<string> {
  const res = await fetch(`${base}/v1/events/${eventId}`, { headers: { authorization: `Bearer ${token}` } });
  return ((await res.json()) as { state: string }).state;
}

describe('the chat page in Chromium', () => {
  it('shows the reply streaming in before its turn commits, then the committed transcript with the whole reply', async () => {
    const actor = `chat/b${Date.now().toString(36)}`;
    const { page, seen } = await openPage(`/?actor=${encodeURIComponent(actor)}`);
    expect(await page.$eval('#actor', (e) => (e as PageElement).value)).toBe(actor);
    expect(await statusOf(page)).toBe('Not connected.');

    await page.type('#token', token);
    await page.click('#connect');
    await page.waitForFunction((a) => document.querySelector('#status')?.textContent === `Connected to ${a}.`, { timeout: 10_000 }, actor);
    expect(await page.$eval('#token', (e) => (e as PageElement).value)).toBe('');
    expect(await page.evaluate(() => sessionStorage.getItem('corral.chat.token'))).toBe(token);
    // HttpOnly: no script of the page sees the cookie
    expect(await page.evaluate(() => document.cookie)).toBe('');
    const cookies = await browser!.defaultBrowserContext().cookies();
    expect(cookies.map((c) => ({ name: c.name, value: c.value, httpOnly: c.httpOnly, sameSite: c.sameSite, path: c.path }))).toEqual([
      { name: 'corral_session', value: token, httpOnly: true, sameSite: 'Strict', path: '/v1' },
    ]);

    // the page's send, checked as it leaves, then made to stream slowly (the page sends no streamMs)
    const sends: { body: unknown; authorization: string | undefined }[] = [];
    await page.setRequestInterception(true);
    page.on('request', (r) => {
      if (r.isInterceptResolutionHandled()) return;
      if (r.method() === 'POST' && r.url().endsWith(`/v1/actors/${actor}/events`)) {
        const body = JSON.parse(r.postData() ?? 'null') as Record<string, unknown>;
        sends.push({ body, authorization: r.headers().authorization });
        void r.continue({ postData: JSON.stringify({ ...body, streamMs: STREAM_MS }) });
      } else {
        void r.continue();
      }
    });
    // record, inside the page, every text the streaming bubble shows (it is replaced at turn_committed)
    await page.evaluate(() => {
      const partials: string[] = (window.partials = []);
      new MutationObserver(() => {
        const text = document.querySelector('#transcript li[data-state="streaming"] .text')?.textContent ?? '';
        if (text && partials.at(-1) !== text) partials.push(text);
      }).observe(document.querySelector('#transcript')!, { subtree: true, childList: true, characterData: true });
    });

    const message = 'tell me how a durable actor keeps its transcript safe across crashes';
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
    // part of the reply is on the page while its turn has not committed
    expect(await eventState(early.eventId)).toBe('pending');
    expect(reply.startsWith(early.text)).toBe(true);
    expect(early.text.length).toBeLessThan(reply.length);
    // the reply may have grown since: what shows is still a part of it, from where it was
    const shown = await bubbles(page);
    expect(shown).toHaveLength(2);
    const [mine, streaming] = shown;
    expect(mine).toBe(`user/pending: ${message}`);
    expect(streaming?.startsWith(`assistant/streaming: ${early.text}`), streaming).toBe(true);
    expect(reply.startsWith(streaming!.slice('assistant/streaming: '.length)), streaming).toBe(true);

    await page.waitForFunction(
      (r) =>
        !document.querySelector('#transcript li[data-state="streaming"]') &&
        [...document.querySelectorAll('#transcript li.msg-assistant[data-state="committed"] .text')].some((e) => e.textContent === r),
      { timeout: 15_000 },
      reply,
    );
    expect(await eventState(early.eventId)).toBe('committed');
    // then the committed transcript (read again after the commit): the user's message, the whole reply
    await page.waitForFunction(() => !document.querySelector('#transcript li[data-state="pending"]'), { timeout: 10_000 });
    expect(await bubbles(page)).toEqual([`user/committed: ${message}`, `assistant/committed: ${reply}`]);

    const partials = await page.evaluate(() => window.partials ?? []);
    expect(partials.length).toBeGreaterThanOrEqual(3);
    for (const p of partials) expect(reply.startsWith(p), p).toBe(true);
    expect(partials.at(-1)).toBe(reply);
    // it grew piece by piece
    expect(new Set(partials.map((p) => p.length)).size).toBe(partials.length);

    expect(sends).toEqual([{ body: { text: message, stream: true }, authorization: `Bearer ${token}` }]);
    for (const url of [...seen.urls, page.url()]) expect(url).not.toContain(token);
    expect(await page.evaluate(() => document.documentElement.outerHTML)).not.toContain(token);
    expect(seen.problems).toEqual([]);
    await page.close();
  });

  it('the browser’s cookie reads but cannot send; a reload shows the transcript; signing out clears the cookie', async () => {
    const actor = `chat/c${Date.now().toString(36)}`;
    const { page, seen } = await openPage(`/?actor=${encodeURIComponent(actor)}`);
    await page.type('#token', token);
    await page.click('#connect');
    await page.waitForFunction((a) => document.querySelector('#status')?.textContent === `Connected to ${a}.`, { timeout: 10_000 }, actor);

    const call = (method: string, path: string) =>
      page.evaluate(
        async (m, p) => {
          const res = await fetch(p, {
            method: m,
            credentials: 'same-origin',
            ...(m === 'POST' ? { headers: { 'content-type': 'application/json' }, body: '{"text":"forged"}' } : {}),
          });
          return { status: res.status, code: ((await res.json()) as { error?: { code: string } }).error?.code ?? null };
        },
        method,
        path,
      );
    expect(await call('GET', `/v1/actors/${actor}/transcript`)).toEqual({ status: 200, code: null });
    expect(await call('POST', `/v1/actors/${actor}/events`)).toEqual({ status: 401, code: 'unauthorized' });

    // sent by the page, committed; a reload connects again from sessionStorage and reads it back
    await page.type('#message', 'hello again');
    await page.click('#send');
    await page.waitForFunction(() => document.querySelectorAll('#transcript li[data-state="committed"]').length === 2, { timeout: 15_000 });
    await page.reload({ waitUntil: 'load' });
    await page.waitForFunction(() => document.querySelectorAll('#transcript li[data-state="committed"]').length === 2, { timeout: 10_000 });
    expect(await bubbles(page)).toEqual(['user/committed: hello again', 'assistant/committed: echo: hello again']);

    await page.click('#disconnect');
    await page.waitForFunction(() => document.querySelector('#status')?.textContent === 'Not connected.', { timeout: 10_000 });
    await expect.poll(async () => (await browser!.defaultBrowserContext().cookies()).length).toBe(0);
    expect(await page.evaluate(() => sessionStorage.getItem('corral.chat.token'))).toBeNull();
    expect(await call('GET', `/v1/actors/${actor}/transcript`)).toEqual({ status: 401, code: 'unauthorized' });
    expect(seen.problems.filter((p) => !/401/.test(p))).toEqual([]);
    await page.close();
  });
});
