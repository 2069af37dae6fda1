/**
 * One POST of the delivery loop, on node:http / node:https, connecting only where the address
 * guard allows (src/outbox/address-guard.ts, A4):
 *
 *  H1 A sink without `allow_private` is sent to through an agent whose sockets resolve with
 *     `guardedLookup`: the socket connects to an address that passed the check, and to no other
 *     (no check-then-connect gap). A URL whose host is an address (which Node connects to without
 *     a lookup) is judged before the request.
 *  H2 Sinks that allow private addresses have agents of their own: a kept-alive socket opened for
 *     one of them is never reused for a sink that does not.
 *  H3 A refused address is an answer-less attempt (`refused: true`), like a connection error:
 *     the sender retries it with the usual backoff and dead-letters it after the retry limit
 *     (docs/operations.md, "Webhook sinks"). No byte is sent to the refused address.
 *  H4 Bounded: the whole attempt by the sink's timeout, the response read by 64 KiB, redirects
 *     never followed (node:http does not), no proxy from the environment (these agents have none).
 */
import { Agent as HttpAgent, request as httpRequest, type IncomingMessage } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import { errorMessage } from '../base/errors.ts';
import { AddressRefused, addressRefusal, guardedLookup, type Resolver } from './address-guard.ts';

/** What one attempt got back: a status (with its Retry-After and a little of its body), or no answer. */
export type AttemptResult =
  { status: number; retryAfter: string | null; text: string } | { status: null; error: string; refused?: boolean };

export interface WebhookPost {
  url: string;
  headers: Record<string, string>;
  body: string;
  timeoutMs: number;
  /** The sink's `allow_private` (H1, H2). */
  allowPrivate: boolean;
}

const RESPONSE_READ_BYTES = 64 * 1024;
const ERROR_TEXT_CHARS = 300;
/** A kept-alive socket unused this long is closed (a receiver's own keep-alive is usually shorter). */
const IDLE_SOCKET_MS = 30_000;

/** A response's first bytes as text; the rest is read and dropped up to the limit, then the socket is dropped. */
async function readSome(res: IncomingMessage): Promise<string> {
  const parts: Buffer[] = [];
  let size = 0;
  for await (const chunk of res) {
    const b = chunk as Buffer;
    if (size < RESPONSE_READ_BYTES) parts.push(b);
    size += b.length;
    if (size >= RESPONSE_READ_BYTES) {
      res.destroy();
      break;
    }
  }
  return Buffer.concat(parts)
    .toString('utf8', 0, Math.min(size, ERROR_TEXT_CHARS * 4))
    .slice(0, ERROR_TEXT_CHARS)
    .trim();
}

/** Why a request got no answer, for the message's `last_error`. */
function failureText(e: unknown, timeoutMs: number, timedOut: boolean): string {
  if (timedOut) return `no answer within ${timeoutMs} ms`;
  const err = e as { code?: string; cause?: { code?: string; message?: string } };
  const cause = err.code ?? err.cause?.code ?? err.cause?.message;
  return `${errorMessage(e)}${cause ? ` (${cause})` : ''}`.slice(0, ERROR_TEXT_CHARS);
}

/** The keep-alive agents of one sender: guarded and not, per protocol (H1, H2). */
export class WebhookPoster {
  private readonly agents;

  /** `resolve`: the resolver behind the guarded lookup (default `dns.lookup`; tests give their own answers). */
  constructor(opts: { resolve?: Resolver } = {}) {
    const lookup = guardedLookup(opts.resolve);
    this.agents = {
      guarded: {
        http: new HttpAgent({ keepAlive: true, timeout: IDLE_SOCKET_MS, lookup }),
        https: new HttpsAgent({ keepAlive: true, timeout: IDLE_SOCKET_MS, lookup }),
      },
      open: {
        http: new HttpAgent({ keepAlive: true, timeout: IDLE_SOCKET_MS }),
        https: new HttpsAgent({ keepAlive: true, timeout: IDLE_SOCKET_MS }),
      },
    };
  }

  /** One attempt; never rejects. `stop` aborts it (the daemon stops). */
  async post(p: WebhookPost, stop: AbortSignal): Promise<AttemptResult> {
    const url = new URL(p.url);
    if (!p.allowPrivate) {
      const refusal = addressRefusal(url);
      if (refusal)
        return {
          status: null,
          refused: true,
          error: `refused to connect: ${refusal}; the sink does not allow private addresses`.slice(0, 300),
        };
    }
    const https = url.protocol === 'https:';
    const agent = this.agents[p.allowPrivate ? 'open' : 'guarded'][https ? 'https' : 'http'];
    const timeout = AbortSignal.timeout(p.timeoutMs);
    const signal = AbortSignal.any([timeout, stop]);
    try {
      const res = await new Promise<IncomingMessage>((resolve, reject) => {
        const req = (https ? httpsRequest : httpRequest)(
          url,
          { method: 'POST', agent, signal, headers: { ...p.headers, 'content-length': String(Buffer.byteLength(p.body)) } },
          resolve,
        );
        req.on('error', reject);
        req.end(p.body);
      });
      // the status is the answer; its body is only for the error text, and may be cut short
      const text = await readSome(res).catch(() => '');
      const retryAfter = res.headers['retry-after'];
      return { status: res.statusCode ?? 0, retryAfter: typeof retryAfter === 'string' ? retryAfter : null, text };
    } catch (e) {
      const refused = e instanceof AddressRefused || (e as { cause?: unknown }).cause instanceof AddressRefused;
      if (refused)
        return {
          status: null,
          refused: true,
          error: errorMessage(e instanceof AddressRefused ? e : (e as { cause: unknown }).cause).slice(0, 300),
        };
      return { status: null, error: failureText(e, p.timeoutMs, timeout.aborted) };
    }
  }

  /** Closes every kept-alive socket (the sender stopped). */
  close(): void {
    for (const side of [this.agents.guarded, this.agents.open]) {
      side.http.destroy();
      side.https.destroy();
    }
  }
}
