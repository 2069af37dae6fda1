/**
 * One connection that LISTENs on turn channels (src/db/turn-events.ts) for a process's watchers:
 * each channel is listened on while someone subscribes to it, and every notification on it goes
 * to its subscribers, parsed. `subscribe` resolves once the LISTEN is in effect, so every event
 * committed after that is heard.
 *
 * A lost connection is made again with backoff (while anyone subscribes), its channels listened
 * on again, and each subscriber is told of the gap: what committed between the loss and the new
 * LISTEN was not heard (L1). Nothing here polls.
 */
import pg from 'pg';
import { backoffDelayMs } from '../backoff.ts';
import { CorralError, toError } from '../errors.ts';
import type { Logger } from '../logger.ts';
import { SerialQueue } from '../serial-queue.ts';
import { parseTurnNotices, type TurnNotice } from './turn-events.ts';

export interface TurnSubscriber {
  notices(notices: TurnNotice[]): void;
  /** L1: the connection was lost at `since` and listens again since `until`; events in between were not heard. */
  gap(since: Date, until: Date): void;
}

export interface TurnSubscription {
  close(): Promise<void>;
}

export interface TurnListenerOptions {
  url: string;
  applicationName?: string;
  logger?: Logger;
  /** Counts each statement run (the client's diagnostics). */
  onStatement?: () => void;
}

interface Channel {
  subscribers: Set<TurnSubscriber>;
  /** Whether the current connection LISTENs on it. */
  listening: boolean;
}

export class TurnListener {
  private readonly opts: TurnListenerOptions;
  private client: pg.Client | undefined;
  private connecting: Promise<pg.Client> | undefined;
  private readonly channels = new Map<string, Channel>();
  /** LISTEN and UNLISTEN, one after another (a pg connection runs one statement at a time). */
  private readonly ops = new SerialQueue();
  private lostAt: Date | undefined;
  private reconnectTimer: NodeJS.Timeout | undefined;
  private failures = 0;
  private closed = false;
  /** Connections lost and made again. */
  reconnects = 0;

  constructor(opts: TurnListenerOptions) {
    this.opts = opts;
  }

  /** Channels listened on now. */
  get listening(): number {
    return [...this.channels.values()].filter((c) => c.listening).length;
  }

  /** Subscribes to `channel`; resolves once its LISTEN is in effect. */
  async subscribe(channel: string, subscriber: TurnSubscriber): Promise<TurnSubscription> {
    if (this.closed) throw new CorralError('closed', 'the client is closed');
    let ch = this.channels.get(channel);
    if (!ch) {
      ch = { subscribers: new Set(), listening: false };
      this.channels.set(channel, ch);
    }
    ch.subscribers.add(subscriber);
    try {
      const client = await this.connection();
      await this.listen(client, channel, ch);
    } catch (e) {
      ch.subscribers.delete(subscriber);
      throw e instanceof CorralError
        ? e
        : new CorralError('database_unavailable', `cannot listen for turn events: ${toError(e).message}`, { cause: e });
    }
    let open = true;
    return {
      close: async () => {
        if (!open) return;
        open = false;
        ch.subscribers.delete(subscriber);
        if (ch.subscribers.size === 0) await this.unlisten(channel, ch);
      },
    };
  }

  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.reconnectTimer);
    for (const ch of this.channels.values()) ch.subscribers.clear();
    const client = this.client ?? (await this.connecting?.catch(() => undefined));
    this.client = undefined;
    await client?.end().catch(() => undefined);
  }

  private async query(client: pg.Client, text: string): Promise<void> {
    this.opts.onStatement?.();
    await client.query(text);
  }

  private listen(client: pg.Client, channel: string, ch: Channel): Promise<void> {
    return this.ops.run(async () => {
      if (ch.listening && this.client === client) return;
      await this.query(client, `LISTEN ${pg.escapeIdentifier(channel)}`);
      if (this.client === client) ch.listening = true;
    });
  }

  private unlisten(channel: string, ch: Channel): Promise<void> {
    return this.ops.run(async () => {
      if (ch.subscribers.size > 0 || !ch.listening) return;
      ch.listening = false;
      const client = this.client;
      if (client) await this.query(client, `UNLISTEN ${pg.escapeIdentifier(channel)}`).catch(() => undefined);
    });
  }

  /** The connection, made if there is none (one attempt: a failure is thrown). */
  private connection(): Promise<pg.Client> {
    if (this.client) return Promise.resolve(this.client);
    this.connecting ??= this.connect().finally(() => (this.connecting = undefined));
    return this.connecting;
  }

  private async connect(): Promise<pg.Client> {
    const client = new pg.Client({
      connectionString: this.opts.url,
      application_name: this.opts.applicationName ?? 'corral-client-listen',
      connectionTimeoutMillis: 10_000,
      keepAlive: true,
      keepAliveInitialDelayMillis: 10_000,
    });
    client.on('error', (e) => this.lost(client, e));
    client.on('end', () => this.lost(client, undefined));
    client.on('notification', (n) => this.deliver(n.channel, n.payload ?? ''));
    try {
      this.opts.onStatement?.();
      await client.connect();
    } catch (e) {
      client.removeAllListeners('end');
      await client.end().catch(() => undefined);
      throw e;
    }
    if (this.closed) {
      await client.end().catch(() => undefined);
      throw new CorralError('closed', 'the client is closed');
    }
    this.client = client;
    for (const ch of this.channels.values()) ch.listening = false;
    return client;
  }

  private deliver(channel: string, payload: string): void {
    const ch = this.channels.get(channel);
    if (!ch || ch.subscribers.size === 0) return;
    const notices = parseTurnNotices(payload);
    if (notices.length === 0) return;
    for (const s of [...ch.subscribers]) {
      try {
        s.notices(notices);
      } catch (e) {
        this.opts.logger?.warn({ err: toError(e).message, channel }, 'a turn event subscriber threw');
      }
    }
  }

  private lost(client: pg.Client, err: Error | undefined): void {
    if (this.client !== client) return;
    this.client = undefined;
    for (const ch of this.channels.values()) ch.listening = false;
    this.lostAt ??= new Date();
    client.end().catch(() => undefined);
    if (this.closed) return;
    this.opts.logger?.warn({ err: err?.message }, 'turn event connection lost; listening again');
    this.scheduleReconnect();
  }

  private scheduleReconnect(): void {
    if (this.closed || this.reconnectTimer) return;
    const wanted = [...this.channels.values()].some((c) => c.subscribers.size > 0);
    if (!wanted) {
      // no one listens: the next subscribe connects, and nobody is owed a gap
      this.lostAt = undefined;
      return;
    }
    const delay = this.failures === 0 ? 0 : backoffDelayMs(this.failures, { baseMs: 100, maxMs: 5_000 });
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = undefined;
      void this.reconnect();
    }, delay);
  }

  private async reconnect(): Promise<void> {
    try {
      const client = await this.connection();
      for (const [name, ch] of this.channels) if (ch.subscribers.size > 0) await this.listen(client, name, ch);
    } catch (e) {
      this.failures++;
      this.opts.logger?.debug({ err: toError(e).message, failures: this.failures }, 'turn event connection: reconnect failed');
      if (this.client) {
        // connected, but a LISTEN failed: start over
        const c = this.client;
        this.lost(c, toError(e));
      } else this.scheduleReconnect();
      return;
    }
    this.failures = 0;
    this.reconnects++;
    const since = this.lostAt ?? new Date();
    this.lostAt = undefined;
    const until = new Date();
    for (const ch of this.channels.values()) {
      for (const s of [...ch.subscribers]) {
        try {
          s.gap(since, until);
        } catch (e) {
          this.opts.logger?.warn({ err: toError(e).message }, 'a turn event subscriber threw');
        }
      }
    }
  }
}
