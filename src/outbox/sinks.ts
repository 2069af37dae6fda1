/**
 * Webhook sinks, the operator's use-cases (`corral sinks add | list | remove | enable`): a sink is
 * a name, an http(s) URL, a Standard Webhooks secret (src/outbox/signature.ts; made when not
 * given), a timeout and how many messages it takes at once. A secret is shown when the sink is
 * added (the receiver needs it to check signatures) and by `corral sinks show --secret`; a list
 * never shows it.
 */
import type { Db, DbOrTx } from '../db/client.ts';
import { outboxCountsBySink } from '../db/outbox/messages.ts';
import { deleteSinkUnlessPending, insertSink, listSinks, setSinkDisabled, sinkByName, type SinkRow } from '../db/outbox/sinks.ts';
import type { SinkRemoval, SinkSummary, SinkView } from '../db/views.ts';
import { CorralError } from '../base/errors.ts';
import { parseDurationMs } from '../base/duration.ts';
import { generateSecret, secretKey } from './signature.ts';

export const SINK_NAME = /^[A-Za-z0-9._-]{1,64}$/;
export const DEFAULT_SINK_TIMEOUT_MS = 10_000;
export const DEFAULT_SINK_CONCURRENCY = 4;

export type { SinkRemoval, SinkSummary, SinkView } from '../db/views.ts';

const view = (r: SinkRow): SinkView => ({
  name: r.name,
  url: r.url,
  timeoutMs: r.timeoutMs,
  concurrency: r.concurrency,
  disabledAt: r.disabledAt?.toISOString() ?? null,
  disabledReason: r.disabledReason,
  createdAt: r.createdAt.toISOString(),
});

export function parseSinkName(text: string): string {
  if (!SINK_NAME.test(text))
    throw new CorralError(
      'invalid_argument',
      `a sink name is 1-64 characters of A-Z a-z 0-9 . _ -, not ${JSON.stringify(text.slice(0, 80))}`,
    );
  return text;
}

/** An http(s) URL without credentials in it (a secret there would show in every log and list). */
export function parseSinkUrl(text: string): string {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new CorralError('invalid_argument', `--url is not a URL: ${JSON.stringify(text.slice(0, 200))}`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:')
    throw new CorralError('invalid_argument', `--url must be http or https, not ${url.protocol}`);
  if (url.username || url.password)
    throw new CorralError('invalid_argument', '--url may not carry a user or password: the signature authenticates the sender');
  if (url.href.length > 2048) throw new CorralError('invalid_argument', '--url is longer than 2048 characters');
  return url.href;
}

export interface AddSinkInput {
  name: string;
  url: string;
  /** A Standard Webhooks secret; one is made when absent. */
  secret?: string | undefined;
  /** A duration (`10s`, `500ms`) or milliseconds; default 10 s. */
  timeout?: string | number | undefined;
  concurrency?: number | undefined;
}

/** Adds a sink; returns it with its secret (to hand to the receiver). `already_exists` for a taken name. */
export async function addSink(db: DbOrTx, input: AddSinkInput): Promise<SinkView & { secret: string }> {
  const name = parseSinkName(input.name);
  const url = parseSinkUrl(input.url);
  const secret = input.secret?.trim() ?? generateSecret();
  secretKey(secret);
  const timeoutMs =
    input.timeout === undefined
      ? DEFAULT_SINK_TIMEOUT_MS
      : typeof input.timeout === 'number'
        ? input.timeout
        : parseDurationMs(String(input.timeout), '--timeout');
  if (!Number.isInteger(timeoutMs) || timeoutMs < 100 || timeoutMs > 600_000)
    throw new CorralError('invalid_argument', '--timeout is 100ms to 10m');
  const concurrency = input.concurrency ?? DEFAULT_SINK_CONCURRENCY;
  if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 64)
    throw new CorralError('invalid_argument', '--concurrency is 1 to 64');
  const row = await insertSink(db, { name, url, secret, timeoutMs, concurrency });
  if (!row) throw new CorralError('already_exists', `a sink named ${name} exists: remove it first, or pick another name`);
  return { ...view(row), secret };
}

/** Every sink, by name, with its pending and dead messages counted (two statements, whatever the number of sinks). */
export async function listSinkViews(db: DbOrTx): Promise<SinkSummary[]> {
  const [rows, counts] = await Promise.all([listSinks(db), outboxCountsBySink(db)]);
  return rows.map((r) => ({ ...view(r), pending: counts.get(r.name)?.pending ?? 0, dead: counts.get(r.name)?.dead ?? 0 }));
}

/** One sink, with its secret only when asked for. `not_found` when there is none. */
export async function showSink(db: DbOrTx, name: string, opts: { secret?: boolean } = {}): Promise<SinkView & { secret?: string }> {
  const row = await sinkByName(db, parseSinkName(name));
  if (!row) throw new CorralError('not_found', `no sink named ${name}`);
  return opts.secret ? { ...view(row), secret: row.secret } : view(row);
}

/**
 * Removes a sink and every message of it. Refused (`invalid_argument`, as a bulk action without
 * its confirmation is) while messages of it are pending, unless `force`: those would never be sent.
 */
export async function removeSink(db: Db, name: string, opts: { force?: boolean } = {}): Promise<SinkRemoval> {
  const done = await deleteSinkUnlessPending(db, parseSinkName(name), opts.force === true);
  if (!done) throw new CorralError('not_found', `no sink named ${name}`);
  if (!done.deleted) {
    throw new CorralError(
      'invalid_argument',
      `sink ${name} has ${done.pending} pending message${done.pending === 1 ? '' : 's'}: removing it would drop them unsent; ` +
        `wait for them, discard them (corral outbox discard --sink ${name} --all), or remove it with --force`,
      { details: { pending: done.pending } },
    );
  }
  return { name, pendingDropped: done.pending, messagesRemoved: done.messages };
}

/** Enables a sink again (after its receiver said 410 Gone); returns it. */
export async function enableSink(db: DbOrTx, name: string): Promise<SinkView> {
  const row = await setSinkDisabled(db, parseSinkName(name), null);
  if (!row) throw new CorralError('not_found', `no sink named ${name}`);
  return view(row);
}
