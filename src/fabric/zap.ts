/**
 * The ZAP handler (ZeroMQ RFC 27): hands each handshake's request to `admit`, which answers it
 * (the allow-list, the connection limits: see src/fabric/admission.ts), now or later.
 *
 * Invariants:
 * 1. It runs its own receive loop on a ROUTER bound to `inproc://zeromq.zap.01` in the broker's
 *    own context (one handler per context, so two brokers in one process do not collide).
 * 2. `admit` is synchronous and in-memory; it may keep the `answer` and call it later (libzmq
 *    holds the peer's handshake until the reply, at most the handshake interval). The broker's
 *    loop never waits for it.
 * 3. Replies are `mandatory`: `answer` resolves false when the peer's session is gone (it gave
 *    up before the reply), so an admission that can never become a connection is known.
 * 4. Any malformed request is answered 500 when it can be addressed, else dropped; the loop
 *    survives everything. Each request is answered at most once.
 */
import type { Context, Router as RouterType } from 'zeromq';
import type { Clock } from '../base/clock.ts';
import type { Logger } from '../base/logger.ts';
import { z85Encode } from './keys.ts';
import { runReceiveLoop } from './receive-loop.ts';

export const ZAP_ENDPOINT = 'inproc://zeromq.zap.01';

export type ZapDecision = { ok: true; userId?: string } | { ok: false; status: 400 | 500; reason: string };

export interface ZapRequest {
  mechanism: string;
  address: string;
  /** Z85 public key for CURVE; undefined for NULL. */
  publicKey?: string;
}

/** Sends the reply to one ZAP request; resolves true when it reached the peer's session. */
export type ZapAnswer = (decision: ZapDecision) => Promise<boolean>;

export class ZapHandler {
  private socket: RouterType | null = null;
  private loop: Promise<void> = Promise.resolve();
  private sendChain: Promise<void> = Promise.resolve();
  readonly counters = { allowed: 0, denied: 0 };

  private readonly opts: { context: Context; clock: Clock; log: Logger; admit: (req: ZapRequest, answer: ZapAnswer) => void };

  constructor(opts: { context: Context; clock: Clock; log: Logger; admit: (req: ZapRequest, answer: ZapAnswer) => void }) {
    this.opts = opts;
  }

  async start(): Promise<void> {
    const { Router } = await import('zeromq');
    const socket = new Router({ context: this.opts.context, linger: 0, mandatory: true, sendTimeout: 0 });
    await socket.bind(ZAP_ENDPOINT);
    this.socket = socket;
    this.loop = runReceiveLoop(socket, { clock: this.opts.clock, log: this.opts.log, what: 'zap', handle: (f) => this.handle(f) });
  }

  async stop(): Promise<void> {
    const s = this.socket;
    this.socket = null;
    if (!s) return;
    await this.sendChain.catch(() => undefined);
    s.close();
    await this.loop;
  }

  private handle(frames: Buffer[]): void {
    // [routing, empty, version, request_id, domain, address, identity, mechanism, ...credentials]
    const [routing, , version, requestId, , address, , mechanism, ...creds] = frames;
    if (!routing || !requestId) return;
    let answered = false;
    const answer: ZapAnswer = (decision) => {
      if (answered) return Promise.resolve(false);
      answered = true;
      return this.reply(routing, requestId, decision);
    };
    if (version?.toString() !== '1.0' || !mechanism) {
      void answer({ ok: false, status: 500, reason: 'bad ZAP request' });
      return;
    }
    const mech = mechanism.toString();
    const key = mech === 'CURVE' && creds[0]?.length === 32 ? z85Encode(creds[0]) : undefined;
    try {
      this.opts.admit({ mechanism: mech, address: address?.toString() ?? '', ...(key ? { publicKey: key } : {}) }, answer);
    } catch (e) {
      void answer({ ok: false, status: 500, reason: `zap handler failed: ${String(e)}` });
    }
  }

  private reply(routing: Buffer, requestId: Buffer, decision: ZapDecision): Promise<boolean> {
    if (decision.ok) this.counters.allowed++;
    else this.counters.denied++;
    const status = decision.ok ? '200' : String(decision.status);
    const text = decision.ok ? 'OK' : decision.reason.slice(0, 200);
    const userId = decision.ok ? (decision.userId ?? '') : '';
    const reply = [
      routing,
      Buffer.alloc(0),
      Buffer.from('1.0'),
      requestId,
      Buffer.from(status),
      Buffer.from(text),
      Buffer.from(userId),
      Buffer.alloc(0),
    ];
    const sent = this.sendChain.then(async () => {
      try {
        if (!this.socket || this.socket.closed) return false;
        await this.socket.send(reply);
        return true;
      } catch (e) {
        // EHOSTUNREACH: the peer's session ended before its reply (invariant 3)
        if ((e as { code?: unknown }).code !== 'EHOSTUNREACH') this.opts.log.warn({ err: String(e) }, 'zap reply failed');
        return false;
      }
    });
    this.sendChain = sent.then(() => undefined);
    return sent;
  }
}
