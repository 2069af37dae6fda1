/** A hand-driven worker on a real ZeroMQ DEALER socket, for fence and protocol tests. */
import { Dealer } from 'zeromq';
import { waitFor } from './wait.ts';

export type Msg = Record<string, unknown> & { type: string };

export class RawWorker {
  readonly id: string;
  readonly inbox: Msg[] = [];
  private readonly socket: Dealer;
  private closed = false;
  private loop: Promise<void>;

  /** `routingId` defaults to the worker id; give a fresh one to reconnect while the old connection may linger. */
  constructor(id: string, endpoint: string, routingId = id) {
    this.id = id;
    this.socket = new Dealer({ routingId, linger: 0 });
    this.socket.connect(endpoint);
    this.loop = this.receive();
  }

  private async receive(): Promise<void> {
    try {
      for await (const frames of this.socket) {
        const last = frames[frames.length - 1];
        if (last) this.inbox.push(JSON.parse(last.toString('utf8')) as Msg);
      }
    } catch {
      // closed
    }
  }

  async sendRaw(...frames: (Buffer | string)[]): Promise<void> {
    await this.socket.send(frames);
  }

  async send(msg: Record<string, unknown>): Promise<void> {
    await this.socket.send(JSON.stringify({ v: 1, ...msg }));
  }

  async register(capacity = 1, extra: Record<string, unknown> = {}): Promise<Msg> {
    await this.send({ type: 'worker_ready', worker_id: this.id, capacity, ...extra });
    return this.next('worker_welcome');
  }

  /** Takes the first message of `type` (optionally matching `where`) from the inbox, waiting for it. */
  async next(type: string, where: (m: Msg) => boolean = () => true, timeoutMs = 15_000): Promise<Msg> {
    return waitFor(
      () => {
        const i = this.inbox.findIndex((m) => m.type === type && where(m));
        return i >= 0 ? this.inbox.splice(i, 1)[0] : undefined;
      },
      { timeoutMs, what: `${type} for ${this.id}` },
    );
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.socket.close();
    await this.loop;
  }
}
