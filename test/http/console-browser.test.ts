/**
 * The operator console in a real browser: headless Chromium (Debian's `chromium`, driven by
 * puppeteer-core) against a real daemon with CURVE on, its HTTP API started as `corral daemon
 * --http-port` starts it, a real SDK worker with its own key, and a test database. An operator
 * signs in with the one-time link `corral console` prints, finds an actor by its agent, watches a
 * turn stream in on the actor's page before it commits, replays a dead letter (one, then a
 * confirmed batch) and sees it commit, and revokes the worker, which the daemon then drops; a
 * read-only token cannot sign in nor act. No page breaks its Content-Security-Policy. Each view
 * is photographed into docs/console/ for docs/console.md.
 *
 * Chromium is required, not optional: without it this file fails, saying how to install it.
 */
import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import puppeteer, { type Browser, type Page } from 'puppeteer-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { connect, type Corral } from '../../src/client/index.ts';
import { freePort } from '../../src/db/postgres/net.ts';
import { eventStatus } from '../../src/db/turns/event-status.ts';
import { addWorkerKey, keyPaths, readAllowlist, workerCredentials } from '../../src/fabric/keys.ts';
import { startHostedApi, type HostedApi } from '../../src/host/http-api.ts';
import { createToken } from '../../src/ops/api-tokens.ts';
import { createSignInCode } from '../../src/ops/console-sessions.ts';
import { queuesOf } from '../../src/queue/names.ts';
import { createExampleHandler } from '../../src/worker/example.ts';
import { createWorker, type Worker } from '../../src/worker/sdk.ts';
import { startTestDaemon, testLogger, type TestDaemon } from '../helpers/daemon.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { waitFor } from '../helpers/wait.ts';
import { WebhookReceiver } from '../helpers/webhook-receiver.ts';
import { addSink } from '../../src/outbox/sinks.ts';
import { listOutboxMessages } from '../../src/outbox/operations.ts';

interface PageElement {
  readonly textContent: string | null;
  readonly dataset: Record<string, string | undefined>;
}
declare const document: { querySelector(selector: string): PageElement | null };

const CHROMIUM = process.env.PUPPETEER_EXECUTABLE_PATH || '/usr/bin/chromium';
const SHOTS = join(import.meta.dirname, '../../docs/console');
const WORKER = 'console-w1';

const tdb = useTestDatabase();
let home: string;
let t: TestDaemon<typeof tdb>;
let api: HostedApi;
let corral: Corral;
let worker: Worker;
let browser: Browser;
let base: string;
/** While true, events with `flaky` fail (then they are dead-lettered: no retries). */
let failing = true;
const problems: string[] = [];
const rx = new WebhookReceiver();

beforeAll(async () => {
  if (!existsSync(CHROMIUM)) {
    throw new Error(
      `Chromium is not installed (no ${CHROMIUM}): this test drives a real browser. Install Debian's package as root: ` +
        '`apt-get update && apt-get install -y --no-install-recommends chromium` (.ci/run does it), ' +
        'or point PUPPETEER_EXECUTABLE_PATH at a Chromium or Chrome executable',
    );
  }
  home = mkdtempSync(join(tmpdir(), 'corral-console-'));
  await rx.start();
  // the daemon reads its sinks at start
  await addSink(tdb.database.db, { name: 'audit', url: rx.url('/audit'), allowPrivate: true });
  const settings = { insecure: false, homeDir: home, keyPollMs: 50, retryLimit: 0, outboxRetryLimit: 0, logLevel: 'silent' } as const;
  t = await startTestDaemon({ ...settings, httpPort: await freePort() }, { db: tdb });
  api = await startHostedApi(t.config, t.db.url, testLogger);
  base = api.url;
  corral = await connect({ databaseUrl: t.db.url, env: {} });
  const key = addWorkerKey(keyPaths(home), t.daemon.security!.keys.publicKey, WORKER);
  const example = createExampleHandler();
  worker = createWorker({
    endpoint: t.daemon.broker.endpoint,
    workerId: WORKER,
    capacity: 4,
    logger: testLogger,
    ...workerCredentials(key),
    handler: async (ctx) => {
      const data = ctx.event.data as Record<string, unknown> | null;
      if (failing && data !== null && typeof data === 'object' && data.flaky === true) throw new Error('flaky: the upstream said no');
      return example(ctx);
    },
  });
  await worker.start();
  await waitFor(() => t.daemon.runtime.workers.isReady(WORKER), { what: 'the worker registered', timeoutMs: 15_000 });
  mkdirSync(SHOTS, { recursive: true });
  browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--headless=new'],
    defaultViewport: { width: 1280, height: 860 },
  });
}, 60_000);

afterAll(async () => {
  await browser?.close();
  await worker?.stop({ graceMs: 0 });
  await corral?.close();
  await api?.close();
  await t?.stop();
  await rx.stop();
  if (home) rmSync(home, { recursive: true, force: true });
});

async function newPage(): Promise<Page> {
  const page = await browser.newPage();
  page.on('console', (m) => {
    if (m.type() === 'error') problems.push(`console: ${m.text()}`);
  });
  page.on('pageerror', (e) => problems.push(`page: ${String(e)}`));
  page.on('dialog', (d) => void d.accept());
  return page;
}

const shot = (page: Page, name: string) => page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });
const text = (page: Page, selector: string) => page.$eval(selector, (e) => e.textContent ?? '');
const stateOf = async (eventId: string) => (await eventStatus(t.daemon.database.db, queuesOf(t.config), eventId)).state;

/** Sends and waits for its commit (a turn begun makes the actor's row). */
async function settled(agent: string, session: string, data: unknown): Promise<string> {
  const { eventId } = await corral.send(actorKey(agent, session), data);
  await waitFor(async () => ['committed', 'dead_lettered'].includes(await stateOf(eventId)), {
    what: `${eventId} settled`,
    timeoutMs: 15_000,
  });
  return eventId;
}

describe('the operator console in Chromium', () => {
  let page: Page;

  it('signs in with the one-time link, shows the overview', async () => {
    await createToken(t.daemon.database.db, 'ops', ['admin']);
    for (const s of ['s1', 's2', 's3']) await settled('support-bot', s, { text: `hello ${s}` });
    await settled('billing-bot', 'b1', { text: '<b>not bold</b>' });
    const { code } = await createSignInCode(t.daemon.database.db, 'ops');
    page = await newPage();
    await page.goto(`${base}/console/sign-in#code=${code}`, { waitUntil: 'load' });
    await page.waitForFunction(() => document.querySelector('#who')?.textContent === 'ops', { timeout: 10_000 });
    expect(new URL(page.url()).pathname).toBe('/console');
    // the code is in no URL the browser asked for, and the session cookie is out of scripts' reach
    const cookies = await browser.defaultBrowserContext().cookies();
    expect(cookies.map((c) => ({ name: c.name, httpOnly: c.httpOnly, sameSite: c.sameSite, path: c.path }))).toEqual([
      { name: 'corral_console', httpOnly: true, sameSite: 'Strict', path: '/console' },
    ]);
    expect(await text(page, '#card-turns .muted')).toBe('Turns/s (last full minute)');
    await shot(page, 'overview');
  });

  it('finds an actor by its agent, and its page escapes what its transcript holds', async () => {
    await page.goto(`${base}/console/actors`, { waitUntil: 'load' });
    expect(await page.$$eval('#actors tbody tr[data-actor]', (rows) => rows.length)).toBe(4);
    await page.type('#filter-agent', 'billing');
    await Promise.all([page.waitForNavigation(), page.click('#filter-apply')]);
    expect(
      await page.$$eval('#actors tbody tr[data-actor]', (rows) => rows.map((r) => (r as unknown as PageElement).dataset.actor)),
    ).toEqual(['billing-bot/b1']);
    await shot(page, 'actors');
    await Promise.all([page.waitForNavigation(), page.click('#actors a')]);
    expect(new URL(page.url()).pathname).toBe('/console/actors/billing-bot/b1');
    expect(await page.$$eval('#transcript b', (b) => b.length)).toBe(0);
    expect(await text(page, '#transcript')).toContain('<b>not bold</b>');
  });

  it('shows a live turn streaming in on the actor page before it commits', async () => {
    await page.goto(`${base}/console/actors/support-bot/s1`, { waitUntil: 'load' });
    await page.waitForFunction(() => document.querySelector('#live')?.dataset.state === 'waiting for a turn', { timeout: 10_000 });
    const reply = 'echo: tell me about durable actors and their transcripts';
    // sent from the page's own form: back on the page, its stream picks the turn up from its start
    const event = JSON.stringify({ text: 'tell me about durable actors and their transcripts', stream: true, streamMs: 3_000 });
    await page.$eval('#send-event', (e, v) => ((e as unknown as { value: string }).value = v), event);
    await Promise.all([page.waitForNavigation(), page.click('#send-button')]);
    const eventId = /^Sent event ([0-9a-f-]{36})\.$/.exec(await text(page, '#notice'))?.[1];
    expect(eventId).toBeDefined();
    await page.waitForFunction(() => (document.querySelector('#live-text')?.textContent ?? '').length > 0, {
      timeout: 15_000,
      polling: 50,
    });
    const early = await text(page, '#live-text');
    expect(await stateOf(eventId!)).toBe('pending');
    expect(reply.startsWith(early)).toBe(true);
    expect(early.length).toBeLessThan(reply.length);
    expect(await text(page, '#live-state')).toMatch(/^turn running \(event /);
    // while it runs, the list's state filter finds the actor running (the page's own JSON)
    const running = await page.evaluate(async () => {
      const res = await fetch('/console/actors?state=running', { headers: { accept: 'application/json' } });
      return ((await res.json()) as { actors: { agentUid: string; sessionId: string; state: string }[] }).actors;
    });
    expect(running.map((a) => `${a.agentUid}/${a.sessionId}/${a.state}`)).toEqual(['support-bot/s1/running']);
    await shot(page, 'actor');
    await page.waitForFunction(() => (document.querySelector('#live-state')?.textContent ?? '').startsWith('turn committed'), {
      timeout: 15_000,
    });
    expect(await text(page, '#live-text')).toBe(reply);
    expect(await stateOf(eventId!)).toBe('committed');
  });

  it('cancels the turn in flight from the actor page, after a confirmation', async () => {
    const { eventId } = await corral.send(actorKey('support-bot', 's2'), { text: 'a slow one', delayMs: 30_000 });
    await page.goto(`${base}/console/actors/support-bot/s2`, { waitUntil: 'load' });
    await page.waitForFunction(() => (document.querySelector('#live-state')?.textContent ?? '').startsWith('turn running'), {
      timeout: 15_000,
    });
    await page.reload({ waitUntil: 'load' });
    expect(await text(page, 'h1 .state')).toBe('running');
    await Promise.all([page.waitForNavigation(), page.click('#cancel-button')]);
    expect(await text(page, '#notice')).toBe(`Cancelled the turn of event ${eventId}.`);
    expect(await stateOf(eventId)).toBe('cancelled');
    expect(await text(page, 'h1 .state')).toBe('idle');
  });

  it('replays a dead letter and sees it commit; then a filtered batch, after a confirmation', async () => {
    failing = true;
    const one = await settled('orders-bot', 'o1', { text: 'charge the card', flaky: true });
    const more = [
      await settled('orders-bot', 'o2', { text: 'again', flaky: true }),
      await settled('orders-bot', 'o3', { text: 'and again', flaky: true }),
    ];
    for (const id of [one, ...more]) expect(await stateOf(id)).toBe('dead_lettered');
    await page.goto(`${base}/console/dead-letters`, { waitUntil: 'load' });
    expect(await page.$$eval('#dead-letters tbody tr[data-dead-letter]', (rows) => rows.length)).toBe(3);
    expect(await text(page, '#dead-letters')).toContain('flaky: the upstream said no');
    await shot(page, 'dead-letters');

    failing = false;
    await Promise.all([
      page.waitForNavigation(),
      page.$$eval('#dead-letters tr[data-dead-letter]', (rows) => {
        const mine = rows.find((r) => r.textContent?.includes('orders-bot/o1'));
        (mine?.querySelector('button.replay') as unknown as { click(): void }).click();
      }),
    ]);
    expect(await text(page, '#notice')).toBe('Replayed 1 of 1 dead letter.');
    await waitFor(async () => (await stateOf(one)) === 'committed', { what: 'the replayed event committed', timeoutMs: 15_000 });
    await page.goto(`${base}/console/actors/orders-bot/o1`, { waitUntil: 'load' });
    expect(await text(page, '#transcript')).toContain('echo: charge the card');

    // the batch: filtered, counted, confirmed (the page's dialog, accepted here)
    await page.goto(`${base}/console/dead-letters?actor=&error=upstream`, { waitUntil: 'load' });
    expect(await text(page, '#batch-replay button')).toBe('Replay all 2 matching');
    await Promise.all([page.waitForNavigation(), page.click('#batch-replay button')]);
    expect(await text(page, '#notice')).toBe('Replayed 2 of 2 dead letters.');
    for (const id of more) await waitFor(async () => (await stateOf(id)) === 'committed', { what: `${id} committed`, timeoutMs: 15_000 });
  });

  it('replays a dead outbox message, and disables and enables its sink', async () => {
    rx.respond = () => ({ status: 500 });
    const shipped = await settled('orders-bot', 'o9', { text: 'ship it', deliver: { sink: 'audit' } });
    expect(await stateOf(shipped)).toBe('committed');
    const messages = () => listOutboxMessages(t.daemon.database.db, { sink: 'audit' });
    await waitFor(async () => (await messages()).messages[0]?.state === 'dead', { what: 'the message dead', timeoutMs: 15_000 });
    await page.goto(`${base}/console/outbox`, { waitUntil: 'load' });
    expect(await text(page, '#sinks tr[data-sink="audit"]')).toContain('1');
    const id = (await messages()).messages[0]!.id;
    expect(await text(page, `#outbox tr[data-message="${id}"]`)).toContain('dead');
    await shot(page, 'outbox');

    rx.respond = () => ({ status: 200 });
    await Promise.all([page.waitForNavigation(), page.click(`#outbox tr[data-message="${id}"] button[value="replay"]`)]);
    expect(await text(page, '#notice')).toBe('Replayed 1 message(s).');
    await waitFor(async () => (await messages()).messages[0]?.state === 'delivered', { what: 'the message delivered', timeoutMs: 15_000 });
    expect(rx.received.filter((r) => r.path === '/audit')).toHaveLength(2);

    await Promise.all([page.waitForNavigation(), page.click('#sinks tr[data-sink="audit"] button')]);
    expect(await text(page, '#notice')).toBe('Sink audit disabled.');
    expect(await text(page, '#sinks tr[data-sink="audit"]')).toContain('paused');
    await Promise.all([page.waitForNavigation(), page.click('#sinks tr[data-sink="audit"] button')]);
    expect(await text(page, '#notice')).toBe('Sink audit enabled.');
    expect(await text(page, '#sinks tr[data-sink="audit"]')).not.toContain('paused');
  });

  it('revokes a worker: off the allow-list, and the daemon drops it', async () => {
    await page.goto(`${base}/console/workers`, { waitUntil: 'load' });
    expect(await text(page, `#workers tr[data-worker="${WORKER}"]`)).toContain('ready');
    await shot(page, 'workers');
    await Promise.all([page.waitForNavigation(), page.click(`#revoke-${WORKER}`)]);
    expect(await text(page, '#notice')).toMatch(/^Revoked the key of worker console-w1/);
    expect(readAllowlist(keyPaths(home).allowlist).map((e) => e.worker_id)).toEqual([]);
    await waitFor(() => !t.daemon.runtime.workers.isReady(WORKER), { what: 'the revoked worker dropped', timeoutMs: 15_000 });
  });

  it('a read-only token can neither sign in nor act', async () => {
    const reader = (await createToken(t.daemon.database.db, 'reader', ['read'])).token;
    const context = await browser.createBrowserContext();
    const other = await context.newPage();
    other.on('pageerror', (e) => problems.push(`page: ${String(e)}`));
    await other.goto(`${base}/console/sign-in`, { waitUntil: 'load' });
    await other.type('#token', reader);
    await Promise.all([other.waitForNavigation(), other.click('#sign-in-button')]);
    expect(await text(other, '#error')).toBe('the token reader has no scope admin (its scopes: read): the console needs an admin token');
    expect(await context.cookies()).toEqual([]);
    await other.goto(`${base}/console/actors`, { waitUntil: 'load' });
    expect(new URL(other.url()).pathname).toBe('/console/sign-in');
    // with the token as a bearer header, from the page itself
    const status = await other.evaluate(
      async (tok) =>
        (
          await fetch('/console/dead-letters/batch', {
            method: 'POST',
            headers: { authorization: `Bearer ${tok}`, 'content-type': 'application/json' },
            body: '{"action":"discard","expected":1}',
          })
        ).status,
      reader,
    );
    expect(status).toBe(403);
    await context.close();
  });

  it('broke no rule of the Content-Security-Policy on any page', () => {
    if (problems.length > 0) console.error(problems);
    expect(problems).toEqual([]);
  });
});
