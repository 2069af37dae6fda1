/**
 * A hand-driven worker on a real ZeroMQ DEALER socket, for fabric, fence, protocol and hostile-
 * peer tests: sends anything (well-formed messages, raw frames), records everything received.
 */
import { Dealer } from 'zeromq';
import { parseDaemonMessage, type DaemonMessage } from '../../src/fabric/protocol.ts';
import { workerProof } from '../../src/fabric/proof.ts';
import { waitFor } from './wait.ts';

/** A received message as loose JSON (tests read fields the protocol types do not name). */
export type Msg = Record<string, unknown> & { type: string };

export interface CurveClientKeys {
  /** The daemon's public key, and this peer's keypair (Z85). */
  serverKey: string;
  publicKey: string;
  secretKey: string;
}

export class RawPeer {
  /** The routing id (undefined: ZeroMQ picks one). */
  readonly id: string | undefined;
  /** The worker id it registers as (default: the routing id). */
  readonly workerId: string | undefined;
  readonly dealer: Dealer;
  /** Every message received that the protocol accepts, in order (never consumed). */
  readonly received: DaemonMessage[] = [];
  /** Every multipart message received, as frames. */
  readonly rawFrames: Buffer[][] = [];
  /** Received JSON messages not yet taken by `next()`. */
  readonly inbox: Msg[] = [];
  private sending: Promise<void> = Promise.resolve();
  private readonly loop: Promise<void>;
  private closed = false;

  /**
   * `curve`: connect with CURVE. `workerId`: the id it registers as, when it is not the routing
   * id (a restarted worker reconnects under a new routing id while the old one may linger).
   */
  constructor(endpoint: string, routingId?: string, curve?: CurveClientKeys, workerId = routingId) {
    this.id = routingId;
    this.workerId = workerId;
    this.dealer = new Dealer({
      linger: 0,
      ...(routingId === undefined ? {} : { routingId }),
      ...(curve ? { curveServerKey: curve.serverKey, curvePublicKey: curve.publicKey, curveSecretKey: curve.secretKey } : {}),
    });
    this.dealer.connect(endpoint);
    this.loop = this.receive();
  }

  private async receive(): Promise<void> {
    // a peer the daemon refused may be closed mid-receive: that ends the loop, quietly
    try {
      for await (const frames of this.dealer) {
        this.rawFrames.push(frames);
        const parsed = frames.length === 1 ? parseDaemonMessage(frames[0]!) : null;
        if (parsed?.ok) this.received.push(parsed.msg);
        const last = frames[frames.length - 1];
        try {
          if (last) this.inbox.push(JSON.parse(last.toString('utf8')) as Msg);
        } catch {
          // not JSON: only in rawFrames
        }
      }
    } catch {
      // closed
    }
  }

  /** Sends frames as they are (serialised: one send in flight per socket). */
  sendRaw(...frames: Array<Buffer | string>): Promise<void> {
    this.sending = this.sending.then(() => this.dealer.send(frames));
    return this.sending;
  }

  /** Sends `obj` as JSON, as it is (no protocol version added). */
  sendJson(obj: unknown): Promise<void> {
    return this.sendRaw(JSON.stringify(obj));
  }

  /** Sends a protocol message (`v: 1` added). */
  send(msg: Record<string, unknown>): Promise<void> {
    return this.sendJson({ v: 1, ...msg });
  }

  /** Registers as worker `workerId` (`extra`: more worker_ready fields) and waits for the welcome. */
  async register(capacity = 1, extra: Record<string, unknown> = {}): Promise<Msg> {
    await this.send({ type: 'worker_ready', worker_id: this.workerId, capacity, ...extra });
    return this.next('worker_welcome');
  }

  /**
   * Registers with a key file's credentials the way docs/protocol.md §13 says: `worker_ready`
   * with the token, then again with the key proof over the challenge's nonce; waits for the
   * welcome (or returns the `error` the daemon answered instead).
   */
  async registerWithKey(
    key: { worker_id: string; token: string; secret_key: string; server_key: string },
    capacity = 1,
    extra: Record<string, unknown> = {},
  ): Promise<Msg> {
    const auth = { scheme: 'key', credential: key.token };
    await this.send({ type: 'worker_ready', worker_id: key.worker_id, capacity, auth, ...extra });
    const challenge = await this.next('worker_challenge', (m) => m.worker_id === key.worker_id);
    const nonce = challenge.nonce as string;
    const proof = workerProof(key.secret_key, key.server_key, key.worker_id, nonce);
    await this.send({ type: 'worker_ready', worker_id: key.worker_id, capacity, auth: { ...auth, nonce, proof }, ...extra });
    return this.next('', (m) => m.type === 'worker_welcome' || m.type === 'error');
  }

  /** Takes the first message of `type` ('' = any type) matching `where` from the inbox, waiting for it. */
  async next(type: string, where: (m: Msg) => boolean = () => true, timeoutMs = 15_000): Promise<Msg> {
    return waitFor(
      () => {
        const i = this.inbox.findIndex((m) => (type === '' || m.type === type) && where(m));
        return i >= 0 ? this.inbox.splice(i, 1)[0] : undefined;
      },
      { timeoutMs, what: `${type} for ${this.id ?? 'a raw peer'}` },
    );
  }

  ofType<K extends DaemonMessage['type']>(type: K): Extract<DaemonMessage, { type: K }>[] {
    return this.received.filter((m): m is Extract<DaemonMessage, { type: K }> => m.type === type);
  }

  /** Waits until `n` messages of `type` were received (all of them, none consumed). */
  waitFor<K extends DaemonMessage['type']>(type: K, n = 1, timeoutMs = 5000): Promise<Extract<DaemonMessage, { type: K }>[]> {
    return waitFor(() => (this.ofType(type).length >= n ? this.ofType(type) : undefined), {
      what: `${n} × ${type}`,
      timeoutMs,
      intervalMs: 5,
    });
  }

  /** Closes the socket (at once) and waits for the receive loop to end. Idempotent. */
  async close(): Promise<void> {
    if (!this.closed) {
      this.closed = true;
      this.dealer.close();
    }
    await this.loop;
  }
}
