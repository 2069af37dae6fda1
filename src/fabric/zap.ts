/**
 * The ZAP handler (ZeroMQ RFC 27): admits CURVE clients whose public key is on the allow-list,
 * and refuses new connections beyond the connection cap.
 *
 * Invariants:
 * 1. It runs its own receive loop on a ROUTER bound to `inproc://zeromq.zap.01` in the broker's
 *    own context (one handler per context, so two brokers in one process do not collide).
 * 2. A decision is synchronous and in-memory (`admit`): libzmq holds the peer's handshake until
 *    the reply, and the broker's loop is never involved.
 * 3. Any malformed request is answered 500 when it can be addressed, else dropped; the loop
 *    survives everything.
 */
import type { Context, Router as RouterType } from 'zeromq';
import type { Clock } from '../clock.ts';
import type { Logger } from '../logger.ts';
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

export class ZapHandler {
  private socket: RouterType | null = null;
  private loop: Promise<void> = Promise.resolve();
  private sendChain: Promise<void> = Promise.resolve();
  readonly counters = { allowed: 0, denied: 0 };

  private readonly opts: { context: Context; clock: Clock; log: Logger; admit: (req: ZapRequest) => ZapDecision };

  constructor(opts: { context: Context; clock: Clock; log: Logger; admit: (req: ZapRequest) => ZapDecision }) {
    this.opts = opts;
  }

  async start(): Promise<void> {
    const { Router } = await import('zeromq');
    const socket = new Router({ context: this.opts.context, linger: 0 });
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
    let decision: ZapDecision;
    if (version?.toString() !== '1.0' || !mechanism) {
      decision = { ok: false, status: 500, reason: 'bad ZAP request' };
    } else {
      const mech = mechanism.toString();
      const key = mech === 'CURVE' && creds[0]?.length === 32 ? z85Encode(creds[0]) : undefined;
      try {
        decision = this.opts.admit({ mechanism: mech, address: address?.toString() ?? '', ...(key ? { publicKey: key } : {}) });
      } catch (e) {
        decision = { ok: false, status: 500, reason: `zap handler failed: ${String(e)}` };
      }
    }
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
    this.sendChain = this.sendChain.then(async () => {
      try {
        if (this.socket && !this.socket.closed) await this.socket.send(reply);
      } catch (e) {
        this.opts.log.warn({ err: String(e) }, 'zap reply failed');
      }
    });
  }
}
