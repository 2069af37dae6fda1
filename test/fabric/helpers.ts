/** Shared helpers for the fabric and worker tests: polling, raw DEALER peers, turn refs. */
import { randomUUID } from 'node:crypto';
import { Dealer } from 'zeromq';
import { waitFor as sharedWaitFor } from '../helpers/wait.ts';
import {
  PROTOCOL_VERSION,
  parseDaemonMessage,
  type DaemonMessage,
  type TurnRef,
  type TurnStart,
} from '../../src/fabric/protocol.ts';

/** The shared `waitFor` (test/helpers/wait.ts) with the positional form these tests use. */
export async function waitFor<T>(probe: () => T | undefined | null | false | 0 | '', what: string, timeoutMs = 5000): Promise<T> {
  return sharedWaitFor(() => probe() || undefined, { what, timeoutMs, intervalMs: 5 }) as Promise<T>;
}

export function makeTurnRef(over: Partial<TurnRef> = {}): TurnRef {
  return {
    agent_uid: 'agent-1',
    session_id: 'session-1',
    activation_uid: randomUUID(),
    actor_epoch: 1,
    event_id: randomUUID(),
    revision: 0,
    delivery_id: randomUUID(),
    ...over,
  };
}

export function makeTurnStart(data: unknown, ref: TurnRef = makeTurnRef()): TurnStart {
  return {
    v: PROTOCOL_VERSION,
    type: 'turn_start',
    turn_ref: ref,
    event: { id: ref.event_id, data: data as TurnStart['event']['data'], enqueued_at: new Date().toISOString() },
    attempt: 1,
    lease_expires_at: new Date(Date.now() + 60_000).toISOString(),
  };
}

/** A hand-driven worker: a raw DEALER that records everything the daemon sends. */
export class RawPeer {
  readonly dealer: Dealer;
  readonly received: DaemonMessage[] = [];
  readonly rawFrames: Buffer[][] = [];
  private queue: Promise<void> = Promise.resolve();

  /** `curve`: connect with CURVE (the daemon's public key and this peer's keypair, Z85). */
  constructor(endpoint: string, routingId?: string, curve?: { serverKey: string; publicKey: string; secretKey: string }) {
    this.dealer = new Dealer({
      linger: 0,
      ...(routingId === undefined ? {} : { routingId }),
      ...(curve ? { curveServerKey: curve.serverKey, curvePublicKey: curve.publicKey, curveSecretKey: curve.secretKey } : {}),
    });
    this.dealer.connect(endpoint);
    void this.loop();
  }

  /** Send frames (serialised: one send in flight per socket). */
  send(...frames: Array<Buffer | string>): Promise<void> {
    this.queue = this.queue.then(() => this.dealer.send(frames));
    return this.queue;
  }

  sendJson(obj: unknown): Promise<void> {
    return this.send(JSON.stringify(obj));
  }

  ofType<K extends DaemonMessage['type']>(type: K): Extract<DaemonMessage, { type: K }>[] {
    return this.received.filter((m): m is Extract<DaemonMessage, { type: K }> => m.type === type);
  }

  waitFor<K extends DaemonMessage['type']>(type: K, n = 1, timeoutMs = 5000): Promise<Extract<DaemonMessage, { type: K }>[]> {
    return waitFor(() => (this.ofType(type).length >= n ? this.ofType(type) : undefined), `${n} × ${type}`, timeoutMs);
  }

  close(): void {
    this.dealer.close();
  }

  private async loop(): Promise<void> {
    // a peer the daemon refused may be closed mid-receive: that ends the loop, quietly
    try {
      await this.receiveAll();
    } catch {
      // closed
    }
  }

  private async receiveAll(): Promise<void> {
    for await (const frames of this.dealer) {
      this.rawFrames.push(frames);
      const parsed = frames.length === 1 ? parseDaemonMessage(frames[0]!) : null;
      if (parsed?.ok) this.received.push(parsed.msg);
    }
  }
}
