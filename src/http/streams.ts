/**
 * `GET /v1/actors/{agent_uid}/{session_id}/stream`: an actor's live stream
 * (src/live/events.ts) as Server-Sent Events.
 *
 *  S1 Each event is one SSE message, `id: <id>\nevent: <type>\ndata: <JSON of data>\n\n`; JSON
 *     text holds no line break, so `data` is one line. A `Last-Event-ID` header is passed to the
 *     watch as `lastEventId`: a client that reconnects resumes after the last event it got.
 *  S2 A comment line (`: keepalive`) every `keepAliveMs` (15 s) keeps proxies from closing a quiet
 *     stream and finds a client that is gone.
 *  S3 Bounded: at most `maxStreams` open at once, `maxStreamsPerActor` of one actor and
 *     `maxStreamsPerToken` of one token; the one past any is refused 429 `too_many_streams`
 *     before anything is watched. A token opens at most `opensPerSecond` streams a second (a
 *     burst of twice that); past it, 429 `rate_limited`. A client that
 *     does not read is dropped: once its socket holds more than `bufferBytes` not yet sent,
 *     nothing more is written and the connection is closed. Nothing is ever buffered for a
 *     stream without limit: the watch holds at most `bufferBytes` too, then ends with `error`.
 *  S4 The stream ends after an `error` event, when the watch ends, when the client disconnects
 *     (the watch is aborted), when the server closes, when its token expires (at that moment),
 *     and when its token is revoked: open streams' tokens are checked again, all in one
 *     statement, every `keepAliveMs`.
 *  S5 Until the response starts, a failure is an ordinary JSON error response (a bad
 *     `Last-Event-ID`, the database unavailable); once it has, an unexpected failure is logged
 *     and the stream gets one last `error` event (`internal`).
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import { formatActorKey, type ActorKey } from '../base/actor-key.ts';
import type { LiveEvent, LiveWatch, LiveWatchOptions } from '../live/events.ts';
import { CorralError, toError } from '../base/errors.ts';
import type { Logger } from '../base/logger.ts';
import { systemClock, type Clock } from '../base/clock.ts';
import { TokenBuckets } from '../base/rate-limits.ts';

/** Where the live events come from: `corral.watch` (a `Corral` client), or anything with its shape. */
export interface LiveSource {
  watch(actor: ActorKey, opts: LiveWatchOptions): Promise<LiveWatch>;
}

export interface StreamSettings {
  maxStreams: number;
  maxStreamsPerActor: number;
  maxStreamsPerToken: number;
  opensPerSecond: number;
  bufferBytes: number;
  keepAliveMs: number;
}

interface OpenStream {
  readonly actor: string;
  readonly token: string;
  end: (reason: string) => void;
}

/** An SSE `id` may hold neither a line break nor NUL; ids the watch gives never do, and one that did is left out rather than break the framing. */
const SAFE_ID = /^[^\r\n\0]{1,200}$/;

/** S1: one SSE message. */
export function sseMessage(e: Pick<LiveEvent, 'id' | 'type' | 'data'>): string {
  const id = SAFE_ID.test(e.id) ? `id: ${e.id}\n` : '';
  return `${id}event: ${e.type}\ndata: ${JSON.stringify(e.data ?? null)}\n\n`;
}

export class Streams {
  private readonly open = new Set<OpenStream>();
  private readonly perActor = new Map<string, number>();
  private readonly perToken = new Map<string, number>();
  private readonly opens: TokenBuckets;

  readonly settings: StreamSettings;
  private readonly logger: Logger;

  constructor(settings: StreamSettings, logger: Logger, clock: Clock = systemClock) {
    this.settings = settings;
    this.logger = logger;
    this.opens = new TokenBuckets(clock, settings.opensPerSecond, 2 * settings.opensPerSecond);
  }

  get size(): number {
    return this.open.size;
  }

  /** The names of the tokens open streams were authorized by (S4). */
  tokenNames(): string[] {
    return [...new Set([...this.open].map((s) => s.token))];
  }

  /** S4: ends the streams whose token is not among `live`. */
  endUnauthorized(live: ReadonlySet<string>): void {
    for (const s of [...this.open]) if (!live.has(s.token)) s.end('token revoked');
  }

  /** Ends every stream (the server closes). */
  endAll(reason: string): void {
    for (const s of [...this.open]) s.end(reason);
  }

  /** S3: a slot for a stream of `actor` by `token`, or 429. */
  private reserve(actor: string, token: string): OpenStream {
    const { maxStreams, maxStreamsPerActor, maxStreamsPerToken } = this.settings;
    if (this.open.size >= maxStreams) {
      throw new CorralError('too_many_streams', `the server has ${maxStreams} streams open, its limit (CORRAL_HTTP_MAX_STREAMS)`);
    }
    const ofActor = this.perActor.get(actor) ?? 0;
    if (ofActor >= maxStreamsPerActor) {
      throw new CorralError(
        'too_many_streams',
        `actor ${actor} has ${maxStreamsPerActor} streams open, the limit per actor (CORRAL_HTTP_MAX_STREAMS_PER_ACTOR)`,
      );
    }
    const ofToken = this.perToken.get(token) ?? 0;
    if (ofToken >= maxStreamsPerToken) {
      throw new CorralError(
        'too_many_streams',
        `the token ${token} has ${maxStreamsPerToken} streams open, the limit per token (CORRAL_HTTP_MAX_STREAMS_PER_TOKEN)`,
      );
    }
    if (!this.opens.take(token)) {
      throw new CorralError(
        'rate_limited',
        `the token ${token} opens streams faster than ${this.settings.opensPerSecond} a second (CORRAL_HTTP_STREAM_OPENS_PER_S)`,
        { details: { retryAfterS: 1 } },
      );
    }
    const slot: OpenStream = { actor, token, end: () => this.release(slot) };
    this.open.add(slot);
    this.perActor.set(actor, ofActor + 1);
    this.perToken.set(token, ofToken + 1);
    return slot;
  }

  private release(slot: OpenStream): void {
    if (!this.open.delete(slot)) return;
    for (const [counts, key] of [
      [this.perActor, slot.actor],
      [this.perToken, slot.token],
    ] as const) {
      const left = (counts.get(key) ?? 1) - 1;
      if (left > 0) counts.set(key, left);
      else counts.delete(key);
    }
  }

  /** Serves one stream (S1-S5); resolves once it ended. */
  async serve(
    req: FastifyRequest,
    reply: FastifyReply,
    opts: { live: LiveSource; actor: ActorKey; lastEventId: string | undefined; token: string; expiresAt?: Date | null },
  ): Promise<void> {
    const actor = formatActorKey(opts.actor);
    const slot = this.reserve(actor, opts.token);
    const log = this.logger.child({ actor, token: opts.token });
    const abort = new AbortController();
    const res = reply.raw;
    let watch: LiveWatch | undefined;
    let started = false;
    let ended = false;
    let keepAlive: NodeJS.Timeout | undefined;
    let expiry: NodeJS.Timeout | undefined;
    let finished!: () => void;
    const done = new Promise<void>((resolve) => (finished = resolve));

    let endReason = '';
    const end = (reason: string, drop = false): void => {
      if (ended) return;
      ended = true;
      endReason = reason;
      clearInterval(keepAlive);
      clearTimeout(expiry);
      this.release(slot);
      abort.abort();
      void watch?.close().catch((e: unknown) => log.debug({ err: toError(e) }, 'stream: the watch did not close cleanly'));
      if (started) {
        if (drop) res.destroy();
        else res.end();
      }
      log.debug({ reason }, 'stream ended');
      finished();
    };
    slot.end = (reason) => end(reason);
    const onClose = () => end('client gone');
    res.on('close', onClose);

    try {
      watch = await opts.live.watch(opts.actor, {
        signal: abort.signal,
        maxBufferedBytes: this.settings.bufferBytes,
        ...(opts.lastEventId === undefined ? {} : { lastEventId: opts.lastEventId }),
      });
    } catch (e) {
      res.off('close', onClose);
      end('the watch did not start');
      // S5: nothing was sent yet, so this is the route's error response
      throw e;
    }
    if (ended) {
      // the client left, the token was revoked or the server closes while the watch started:
      // nothing was sent, so the route still answers (to a client that is there to hear it)
      void watch.close().catch(() => undefined);
      throw endReason === 'token revoked'
        ? new CorralError('unauthorized', 'the token is not valid (unknown, revoked or expired)', { details: { tokenGiven: true } })
        : new CorralError('shutdown', 'the stream ended before it began');
    }

    reply.hijack();
    started = true;
    res.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-store',
      // nginx and the proxies that follow it would otherwise hold the events back
      'x-accel-buffering': 'no',
    });
    res.flushHeaders();
    res.socket?.setNoDelay(true);
    log.debug({ lastEventId: opts.lastEventId }, 'stream started');

    const write = (text: string): boolean => {
      if (ended) return false;
      res.write(text);
      if (res.writableLength > this.settings.bufferBytes) {
        log.warn({ buffered: res.writableLength, limit: this.settings.bufferBytes }, 'stream: the client does not keep up, dropped');
        end('slow client', true);
        return false;
      }
      return true;
    };
    keepAlive = setInterval(() => write(': keepalive\n\n'), this.settings.keepAliveMs);
    // S4: a token that expires ends its streams then, not at the next check
    if (opts.expiresAt)
      expiry = setTimeout(() => end('token expired'), Math.max(0, Math.min(opts.expiresAt.getTime() - Date.now(), 2 ** 31 - 1)));

    void (async () => {
      try {
        for await (const e of watch) {
          if (!write(sseMessage(e)) || e.type === 'error') break;
        }
      } catch (e) {
        if (!ended) {
          log.error({ err: toError(e) }, 'stream failed');
          write(sseMessage({ id: '', type: 'error', data: { code: 'internal', message: 'the stream failed' } }));
        }
      } finally {
        end('the watch ended');
      }
    })();
    await done;
  }
}
