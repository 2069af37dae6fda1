/**
 * `corral watch <agent_uid>/<session_id> [--json] [--once] [--last-event-id ID]`: an actor's live
 * turns as they run (src/live/stream.ts), from the database the other commands use: each
 * turn's start, what its worker streams, then the committed turn or its failure. `--json` prints
 * one event per line (`{"id","type","data"}`, the events of `corral.watch` and the HTTP API).
 * Runs until Ctrl-C (or, with `--once`, until a turn ended); a reader that falls too far behind
 * gets the `error` event and exit code 1. `--url` reads a remote daemon's HTTP API instead
 * (watch-remote.ts), with the token in CORRAL_TOKEN.
 */
import { formatActorKey, parseActorKey, type ActorKey } from '../../base/actor-key.ts';
import type { Config } from '../../config.ts';
import { TurnListener } from '../../db/turns/turn-listener.ts';
import { CorralError } from '../../base/errors.ts';
import type { LiveEvent } from '../../live/events.ts';
import { parseLiveEventId } from '../../live/events.ts';
import { LiveStream } from '../../live/stream.ts';
import { queuesOf } from '../../queue/names.ts';
import { openCommandContext } from '../context.ts';
import { remoteLiveEvents } from './watch-remote.ts';

export interface WatchCommandOptions {
  json?: boolean;
  once?: boolean;
  lastEventId?: string;
  /** A remote daemon's HTTP API (the token from CORRAL_TOKEN) instead of the database. */
  url?: string;
}

export interface WatchIo {
  out: NodeJS.WritableStream;
  err: NodeJS.WritableStream;
  /** Ends the watch (Ctrl-C): exit code 0. */
  signal: AbortSignal;
}

export async function runWatchCommand(config: Config, actor: string, opts: WatchCommandOptions, io: WatchIo): Promise<number> {
  const key = parseActorKey(actor);
  if (opts.lastEventId !== undefined && parseLiveEventId(opts.lastEventId) === undefined) {
    throw new CorralError(
      'invalid_argument',
      `--last-event-id ${JSON.stringify(opts.lastEventId.slice(0, 80))} is not an event id of a stream`,
    );
  }
  if (opts.url !== undefined) return watchRemote(key, opts, config.apiToken, io);
  const ctx = await openCommandContext(config, { connections: 1 });
  const listener = new TurnListener({ url: ctx.database.url, applicationName: 'corral-watch', logger: ctx.logger });
  const stream = new LiveStream(
    key,
    { db: ctx.database.db, queues: queuesOf(config), listener },
    { signal: io.signal, ...(opts.lastEventId !== undefined ? { lastEventId: opts.lastEventId } : {}) },
    () => undefined,
  );
  // a closed pipe (`corral watch … | head`) ends the watch, quietly
  const onPipeError = () => void stream.close();
  io.out.on('error', onPipeError);
  const print = opts.json ? jsonPrinter(io.out) : textPrinter(io.out);
  try {
    await stream.start();
    if (!opts.json) io.err.write(`watching ${formatActorKey(key)} (Ctrl-C to stop)\n`);
    return await printEvents(stream, print, opts, io);
  } finally {
    io.out.off('error', onPipeError);
    await stream.close();
    await listener.close();
    await ctx.close();
  }
}

/** Prints `events` until the end, an `error` (exit 1), or with `--once` a turn's end. */
async function printEvents(
  events: AsyncIterable<LiveEvent>,
  print: (e: LiveEvent) => void,
  opts: WatchCommandOptions,
  io: WatchIo,
): Promise<number> {
  for await (const e of events) {
    print(e);
    if (e.type === 'error') {
      io.err.write(`corral watch: ${e.data.message}\n`);
      return 1;
    }
    if (opts.once && (e.type === 'turn_committed' || e.type === 'turn_failed')) break;
  }
  return 0;
}

/** `--url`: the stream of a remote daemon's HTTP API, with the bearer token in CORRAL_TOKEN. */
async function watchRemote(key: ActorKey, opts: WatchCommandOptions, token: string | undefined, io: WatchIo): Promise<number> {
  if (!token)
    throw new CorralError('invalid_argument', '--url needs an API token in CORRAL_TOKEN (corral tokens create NAME --scope read)');
  const stop = new AbortController();
  const onAbort = () => stop.abort();
  io.signal.addEventListener('abort', onAbort, { once: true });
  io.out.on('error', onAbort);
  try {
    const events = remoteLiveEvents(key, {
      url: opts.url!,
      token,
      signal: stop.signal,
      ...(opts.lastEventId !== undefined ? { lastEventId: opts.lastEventId } : {}),
      onReconnect: (n, why) => io.err.write(`corral watch: ${why}; connecting again (${n})\n`),
    });
    if (!opts.json) io.err.write(`watching ${formatActorKey(key)} at ${opts.url} (Ctrl-C to stop)\n`);
    return await printEvents(events, opts.json ? jsonPrinter(io.out) : textPrinter(io.out), opts, io);
  } finally {
    io.signal.removeEventListener('abort', onAbort);
    io.out.off('error', onAbort);
    stop.abort();
  }
}

function jsonPrinter(out: NodeJS.WritableStream): (e: LiveEvent) => void {
  return (e) => out.write(`${JSON.stringify(e)}\n`);
}

/** Chunks with a text `delta` print as running text; any other chunk on a line of its own. */
function textPrinter(out: NodeJS.WritableStream): (e: LiveEvent) => void {
  let midLine = false;
  const line = (text: string) => {
    out.write(`${midLine ? '\n' : ''}${text}\n`);
    midLine = false;
  };
  return (e) => {
    switch (e.type) {
      case 'turn_started': {
        const batch = e.data.events.length > 1 ? `, ${e.data.events.length} events` : '';
        line(`── turn ${e.data.event_id} (epoch ${e.data.epoch}, attempt ${e.data.attempt}${batch})`);
        return;
      }
      case 'chunk': {
        const data = e.data.data as { delta?: unknown } | null;
        if (data !== null && typeof data === 'object' && typeof data.delta === 'string') {
          out.write(data.delta);
          midLine = true;
        } else line(`  chunk ${e.data.seq}: ${JSON.stringify(e.data.data)}`);
        return;
      }
      case 'turn_committed':
        line(`── committed`);
        for (const m of e.data.messages) line(`  ${String(m.seq).padStart(4)} ${m.role.padEnd(9)} ${JSON.stringify(m.content)}`);
        return;
      case 'turn_failed':
        line(`── ${e.data.reason === 'failed' ? 'failed; it will be retried' : e.data.reason.replace('_', ' ')}`);
        return;
      case 'reset':
        line(`── reset: attempt ${e.data.attempt} starts over`);
        return;
      case 'error':
        return;
    }
  };
}
