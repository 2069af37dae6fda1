/**
 * A real HTTP receiver for outbox tests: records every request (the Standard Webhooks headers, the
 * body as received, when), answers each as `respond` says (a status, a delay, or never), and
 * de-duplicates by `webhook-id` as a receiver must. It also notes every `webhook-id` that ever
 * had two requests open at once (two senders holding one message).
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { verifyWebhook } from '../../src/outbox/signature.ts';

export interface ReceivedWebhook {
  path: string;
  id: string;
  /** `corral-actor` and `corral-key` (empty when absent). */
  actor: string;
  key: string;
  timestamp: string;
  signature: string;
  /** W3C `traceparent` and `tracestate` (empty when absent). */
  traceparent: string;
  tracestate: string;
  body: string;
  at: number;
  /** When it stopped being open: answered, or its connection closed (unset while open). */
  doneAt?: number;
}

/** What to answer: a status (and headers), after `delayMs`; `hang` never answers (the socket stays open). */
export type Answer = { status: number; headers?: Record<string, string>; delayMs?: number } | 'hang';

export class WebhookReceiver {
  readonly received: ReceivedWebhook[] = [];
  /** Chooses each answer; the default is 200. `n` counts the requests so far with this id (1 for the first). */
  respond: (req: ReceivedWebhook, n: number) => Answer = () => ({ status: 200 });
  private server: Server | undefined;
  private readonly hanging = new Set<ServerResponse>();
  /** Requests being handled now, most at once so far. */
  open = 0;
  mostOpen = 0;
  /** Requests open now per `webhook-id`: from their arrival until the answer ends or the connection closes. */
  private readonly openById = new Map<string, number>();
  /** Each `webhook-id` that had a second request arrive while one was open (once per overlap). */
  readonly overlapping: string[] = [];

  async start(): Promise<string> {
    this.server = createServer((req, res) => void this.handle(req, res));
    this.server.keepAliveTimeout = 30_000;
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    return this.url('/');
  }

  url(path: string): string {
    return `http://127.0.0.1:${(this.server!.address() as AddressInfo).port}${path}`;
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const id = String(req.headers['webhook-id'] ?? '');
    const openNow = (this.openById.get(id) ?? 0) + 1;
    this.openById.set(id, openNow);
    if (openNow > 1) this.overlapping.push(id);
    res.once('close', () => {
      const left = (this.openById.get(id) ?? 1) - 1;
      if (left > 0) this.openById.set(id, left);
      else this.openById.delete(id);
    });
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const got: ReceivedWebhook = {
      path: req.url ?? '/',
      id,
      actor: String(req.headers['corral-actor'] ?? ''),
      key: String(req.headers['corral-key'] ?? ''),
      timestamp: String(req.headers['webhook-timestamp'] ?? ''),
      signature: String(req.headers['webhook-signature'] ?? ''),
      traceparent: String(req.headers.traceparent ?? ''),
      tracestate: String(req.headers.tracestate ?? ''),
      body: Buffer.concat(chunks).toString('utf8'),
      at: Date.now(),
    };
    this.received.push(got);
    res.once('close', () => (got.doneAt ??= Date.now()));
    const n = this.received.filter((r) => r.id === got.id).length;
    const answer = this.respond(got, n);
    if (answer === 'hang') {
      this.hanging.add(res);
      res.on('close', () => this.hanging.delete(res));
      return;
    }
    this.open++;
    this.mostOpen = Math.max(this.mostOpen, this.open);
    if (answer.delayMs) await new Promise((r) => setTimeout(r, answer.delayMs));
    this.open--;
    got.doneAt = Date.now();
    res.writeHead(answer.status, { 'content-type': 'text/plain', ...answer.headers });
    res.end(answer.status < 300 ? 'ok' : `status ${answer.status}`);
  }

  /** One entry per `webhook-id`, in order of first receipt (what a de-duplicating receiver keeps). */
  unique(path?: string): ReceivedWebhook[] {
    const seen = new Set<string>();
    return this.received.filter((r) => (path === undefined || r.path === path) && !seen.has(r.id) && seen.add(r.id) !== undefined);
  }

  /** Whether every request carries a valid signature for `secret`. */
  allSigned(secret: string, path?: string): boolean {
    return this.received
      .filter((r) => path === undefined || r.path === path)
      .every((r) => verifyWebhook(secret, { id: r.id, timestamp: r.timestamp, signature: r.signature }, r.body).ok);
  }

  async stop(): Promise<void> {
    for (const res of this.hanging) res.destroy();
    this.server?.closeAllConnections();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}
