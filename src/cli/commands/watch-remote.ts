/**
 * `corral watch <actor> --url URL`: the same live stream from a remote daemon's HTTP API
 * (docs/http.md, `GET /v1/actors/{agent_uid}/{session_id}/stream`), with the token in
 * `CORRAL_TOKEN`. A dropped connection is made again with the last event id (`Last-Event-ID`), so
 * nothing is missed or shown twice; an answer that is not a stream (401, 403, 429 …) ends it with
 * the API's error.
 */
import { formatActorKey, type ActorKey } from '../../base/actor-key.ts';
import { backoffDelayMs } from '../../base/backoff.ts';
import { CorralError } from '../../base/errors.ts';
import type { LiveEvent } from '../../live/events.ts';
import { sseEvents } from '../../live/sse.ts';

export interface RemoteWatchOptions {
  url: string;
  token: string;
  lastEventId?: string;
  signal: AbortSignal;
  /** Told of each reconnect (stderr). */
  onReconnect?: (attempt: number, why: string) => void;
}

/** The live events of `actor` from the HTTP API at `opts.url`, reconnecting as long as the signal allows. */
export async function* remoteLiveEvents(actor: ActorKey, opts: RemoteWatchOptions): AsyncGenerator<LiveEvent> {
  const base = new URL(opts.url);
  if (base.protocol !== 'http:' && base.protocol !== 'https:')
    throw new CorralError('invalid_argument', `--url must be http(s): ${opts.url}`);
  const path = `/v1/actors/${encodeURIComponent(actor.agentUid)}/${encodeURIComponent(actor.sessionId)}/stream`;
  const target = new URL(path, base);
  let lastId = opts.lastEventId;
  for (let attempt = 0; !opts.signal.aborted; attempt++) {
    let res: Response;
    try {
      res = await fetch(target, {
        headers: { authorization: `Bearer ${opts.token}`, accept: 'text/event-stream', ...(lastId ? { 'last-event-id': lastId } : {}) },
        signal: opts.signal,
      });
    } catch (e) {
      if (opts.signal.aborted) return;
      await pause(attempt, opts, `cannot reach ${base.origin}: ${(e as Error).message}`);
      continue;
    }
    if (!res.ok || !res.body) throw await apiError(res, formatActorKey(actor));
    try {
      for await (const e of sseEvents(res.body)) {
        attempt = 0;
        lastId = e.id;
        yield e;
        if (e.type === 'error') return;
      }
    } catch (e) {
      if (opts.signal.aborted) return;
      if (e instanceof CorralError) throw e;
    }
    if (opts.signal.aborted) return;
    await pause(attempt, opts, 'the stream ended');
  }
}

async function pause(attempt: number, opts: RemoteWatchOptions, why: string): Promise<void> {
  opts.onReconnect?.(attempt + 1, why);
  const ms = backoffDelayMs(attempt + 1, { baseMs: 250, maxMs: 5_000 });
  await new Promise<void>((resolve) => {
    const t = setTimeout(resolve, ms);
    opts.signal.addEventListener(
      'abort',
      () => {
        clearTimeout(t);
        resolve();
      },
      { once: true },
    );
  });
}

async function apiError(res: Response, actor: string): Promise<CorralError> {
  let body: { error?: { code?: unknown; message?: unknown } } = {};
  try {
    body = (await res.json()) as typeof body;
  } catch {
    // not the API's JSON: the status says enough
  }
  const message = typeof body.error?.message === 'string' ? body.error.message : `HTTP ${res.status}`;
  const code = res.status === 401 || res.status === 403 ? 'unauthorized' : res.status === 404 ? 'not_found' : 'internal';
  return new CorralError(
    code,
    `watching ${actor}: ${message} (HTTP ${res.status}${body.error?.code ? `, ${String(body.error.code)}` : ''})`,
  );
}
