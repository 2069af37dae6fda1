/**
 * One connection that LISTENs on turn channels (src/db/turns/turn-events.ts) for a process's watchers:
 * each channel is listened on while someone subscribes to it (and `lingerMs` after the last one
 * left, so a busy client does not register again and again), and every notification on it goes
 * to its subscribers, parsed.
 *
 *  L1 `subscribe` resolves once every turn event committed from then on is heard: the channel is
 *     LISTENed on, registered in `corral.turn_watchers` (T4 of turn-events.ts: daemons notify only
 *     watched channels), and the transactions that may have decided before the registration
 *     (those holding the table's ACCESS SHARE lock at that moment) have ended. That wait reads
 *     pg_locks until they are gone: a few milliseconds, once per registration, never per event.
 *     When some are still open after `barrierMs`, the subscribers get a gap from the registration
 *     on: what those transactions commit, now or later, may not be heard.
 *  L2 A lost connection is made again with backoff (while anyone subscribes), its channels
 *     listened on and registered again, and each subscriber is told of the gap: what committed
 *     between the loss and the new registration was not heard.
 *  L3 A registration is the LISTENing backend's (`pid`): removed when the channel is dropped or
 *     the listener closes, and, for a backend that died, by the next registration of anyone.
 */
import pg from 'pg';
import { backoffDelayMs } from '../../base/backoff.ts';
import { CorralError, toError } from '../../base/errors.ts';
import type { Logger } from '../../base/logger.ts';
import { SerialQueue } from '../../base/serial-queue.ts';
import { parseTurnNotices, type TurnNotice } from './turn-events.ts';

export interface TurnSubscriber {
  /** A turn channel's notifications, parsed (src/db/turns/turn-events.ts). */
  notices?(notices: TurnNotice[]): void;
  /** Any other channel's (a stream channel, src/db/live/chunks.ts): the payload as sent. */
  payload?(payload: string): void;
  /** L2: the connection was lost at `since` and listens again since `until`; events in between were not heard. */
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
  /** How long a channel stays listened on after its last subscriber left (default 30 s). */
  lingerMs?: number;
  /** Longest wait for the transactions a registration must outlast (default 10 s; L1). */
  barrierMs?: number;
  /** The connection's class: a shard's, whose statements name its schemas (src/db/shards/shard-sql.ts). */
  Client?: typeof pg.Client;
}

export const DEFAULT_LINGER_MS = 30_000;
const DEFAULT_BARRIER_MS = 10_000;
const BARRIER_POLL_MS = 2;
const BARRIER_POLL_MAX_MS = 100;

/** L1, L3: registers `$1` for this backend, deleting the registrations of backends that are gone. */
const REGISTER = `
  with gone as (
    delete from corral.turn_watchers w where not exists (select 1 from pg_stat_activity a where a.pid = w.pid)
  )
  insert into corral.turn_watchers (channel, pid) values ($1, pg_backend_pid()) on conflict do nothing`;
const UNREGISTER = 'delete from corral.turn_watchers where channel = $1 and pid = pg_backend_pid()';
const UNREGISTER_ALL = 'delete from corral.turn_watchers where pid = pg_backend_pid()';
/** L1: the transactions of other backends holding a lock on the registry now. */
const REGISTRY_HOLDERS = `
  select coalesce(array_agg(distinct l.virtualtransaction), '{}') as vxids
    from pg_locks l
   where l.locktype = 'relation' and l.relation = to_regclass('corral.turn_watchers') and l.granted
     and l.database = (select oid from pg_database where datname = current_database())
     and l.pid <> pg_backend_pid()`;
/** L1: how many of those transactions are still open. */
const STILL_OPEN = 'select count(*)::int as n from pg_locks where virtualtransaction = any($1::text[])';

interface Channel {
  subscribers: Set<TurnSubscriber>;
  /** Whether the current connection listens on it and has it registered. */
  listening: boolean;
  /** Drops the channel once the linger is over. */
  linger: NodeJS.Timeout | undefined;
}

export class TurnListener {
  private readonly opts: TurnListenerOptions;
  private client: pg.Client | undefined;
  private connecting: Promise<pg.Client> | undefined;
  private readonly channels = new Map<string, Channel>();
  /** Statements on the connection, one after another (a pg connection runs one at a time). */
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

  /** Subscribes to `channel`; resolves once every event committed from now on is heard (L1). */
  async subscribe(channel: string, subscriber: TurnSubscriber): Promise<TurnSubscription> {
    if (this.closed) throw new CorralError('closed', 'the client is closed');
    let ch = this.channels.get(channel);
    if (!ch) {
      ch = { subscribers: new Set(), listening: false, linger: undefined };
      this.channels.set(channel, ch);
    }
    clearTimeout(ch.linger);
    ch.linger = undefined;
    ch.subscribers.add(subscriber);
    try {
      const client = await this.connection();
      await this.listen(client, channel, ch);
    } catch (e) {
      ch.subscribers.delete(subscriber);
      if (ch.subscribers.size === 0 && !ch.listening) this.channels.delete(channel);
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
        if (ch.subscribers.size > 0 || this.closed) return;
        const linger = this.opts.lingerMs ?? DEFAULT_LINGER_MS;
        if (linger > 0) {
          ch.linger = setTimeout(() => void this.drop(channel, ch), linger);
          ch.linger.unref();
        } else await this.drop(channel, ch);
      },
    };
  }

  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.reconnectTimer);
    for (const ch of this.channels.values()) {
      ch.subscribers.clear();
      clearTimeout(ch.linger);
    }
    const client = this.client ?? (await this.connecting?.catch(() => undefined));
    this.client = undefined;
    if (client) {
      // L3: the registrations go with the listener (they would also go once its backend is gone)
      await this.ops.run(() => this.query(client, UNREGISTER_ALL)).catch(() => undefined);
      await client.end().catch(() => undefined);
    }
  }

  private async query<R extends pg.QueryResultRow>(client: pg.Client, text: string, values?: unknown[]): Promise<R[]> {
    this.opts.onStatement?.();
    return (await client.query<R>(text, values)).rows;
  }

  /** L1: LISTEN, register, then outlast the transactions that may not have seen the registration. */
  private listen(client: pg.Client, channel: string, ch: Channel): Promise<void> {
    return this.ops.run(async () => {
      if (ch.listening && this.client === client) return;
      await this.query(client, `LISTEN ${pg.escapeIdentifier(channel)}`);
      const registeredAt = new Date();
      await this.query(client, REGISTER, [channel]);
      const [holders] = await this.query<{ vxids: string[] }>(client, REGISTRY_HOLDERS);
      const vxids = holders?.vxids ?? [];
      const deadline = Date.now() + (this.opts.barrierMs ?? DEFAULT_BARRIER_MS);
      let pollMs = BARRIER_POLL_MS;
      let gaveUp = false;
      while (vxids.length > 0) {
        const [open] = await this.query<{ n: number }>(client, STILL_OPEN, [vxids]);
        if ((open?.n ?? 0) === 0) break;
        if (Date.now() > deadline) {
          this.opts.logger?.warn({ channel, transactions: vxids }, 'turn events: transactions older than the registration are still open');
          gaveUp = true;
          break;
        }
        await new Promise((r) => setTimeout(r, pollMs));
        pollMs = Math.min(pollMs * 2, BARRIER_POLL_MAX_MS);
      }
      if (this.client === client) ch.listening = true;
      // L1: what those transactions commit may not be notified: the subscribers are told so
      if (gaveUp) for (const sub of ch.subscribers) sub.gap(registeredAt, new Date());
    });
  }

  /** The linger is over (or there is none): UNLISTEN and unregister, unless someone subscribed meanwhile. */
  private drop(channel: string, ch: Channel): Promise<void> {
    ch.linger = undefined;
    return this.ops.run(async () => {
      if (ch.subscribers.size > 0 || ch.linger) return;
      this.channels.delete(channel);
      const client = this.client;
      if (!ch.listening || !client) return;
      ch.listening = false;
      await this.query(client, `UNLISTEN ${pg.escapeIdentifier(channel)}`).catch(() => undefined);
      await this.query(client, UNREGISTER, [channel]).catch(() => undefined);
    });
  }

  /** The connection, made if there is none (one attempt: a failure is thrown). */
  private connection(): Promise<pg.Client> {
    if (this.client) return Promise.resolve(this.client);
    this.connecting ??= this.connect().finally(() => (this.connecting = undefined));
    return this.connecting;
  }

  private async connect(): Promise<pg.Client> {
    const client = new (this.opts.Client ?? pg.Client)({
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
    let notices: TurnNotice[] | undefined;
    for (const s of [...ch.subscribers]) {
      try {
        if (s.payload) s.payload(payload);
        else if (s.notices) {
          notices ??= parseTurnNotices(payload);
          if (notices.length > 0) s.notices(notices);
        }
      } catch (e) {
        this.opts.logger?.warn({ err: toError(e).message, channel }, 'a turn event subscriber threw');
      }
    }
  }

  private lost(client: pg.Client, err: Error | undefined): void {
    if (this.client !== client) return;
    this.client = undefined;
    for (const [name, ch] of this.channels) {
      ch.listening = false;
      // a lingering channel is simply dropped: nobody is owed its events
      if (ch.subscribers.size === 0) {
        clearTimeout(ch.linger);
        this.channels.delete(name);
      }
    }
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
        // connected, but a registration failed: start over
        this.lost(this.client, toError(e));
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
