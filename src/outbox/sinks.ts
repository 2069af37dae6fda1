/**
 * Webhook sinks, the operator's use-cases (`corral sinks add | list | show | remove | enable |
 * rotate-secret`): a sink is a name, an http(s) URL, a Standard Webhooks secret
 * (src/outbox/signature.ts; made when not given), a timeout, how many messages it takes at once,
 * the agents whose turns may deliver to it, and whether its URL may point inside.
 *
 *  K1 Secrets are shown only where the receiver needs them: once by `add` and by `rotate-secret`
 *     (the new one), and by `show --secret` (the current one, and the previous one while it still
 *     signs). A list or a plain `show` never holds one.
 *  K2 A URL pointing inside (src/outbox/address-guard.ts) is refused at `add` unless
 *     `allowPrivate`; the delivery loop judges it again at every connect.
 *  K3 `agents` uses the patterns of worker keys' scopes (src/base/agent-scope.ts); absent, every
 *     agent's turns may deliver to the sink, as before scopes existed.
 */
import { z } from 'zod';
import type { Db, DbOrTx } from '../db/client.ts';
import { outboxCountsBySink } from '../db/outbox/messages.ts';
import {
  deleteSinkUnlessPending,
  insertSink,
  listSinks,
  rotateSinkSecret,
  setSinkDisabled,
  sinkByName,
  type SinkRow,
} from '../db/outbox/sinks.ts';
import type { SinkRemoval, SinkSummary, SinkView } from '../db/views.ts';
import { CorralError } from '../base/errors.ts';
import { parseDurationMs } from '../base/duration.ts';
import { checkedScope } from '../base/agent-scope.ts';
import { generateSecret, secretKey } from './signature.ts';
import { checkSinkHost, type Resolver } from './address-guard.ts';

export const SINK_NAME = /^[A-Za-z0-9._-]{1,64}$/;
export const DEFAULT_SINK_TIMEOUT_MS = 10_000;
export const DEFAULT_SINK_CONCURRENCY = 4;

export type { SinkRemoval, SinkSummary, SinkView } from '../db/views.ts';

const view = (r: SinkRow): SinkView => ({
  name: r.name,
  url: r.url,
  timeoutMs: r.timeoutMs,
  concurrency: r.concurrency,
  agents: r.agents,
  allowPrivate: r.allowPrivate,
  previousSecretUntil: r.previousInUse ? (r.previousSecretUntil?.toISOString() ?? null) : null,
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
  /** The agents whose turns may deliver to it (K3); absent: every agent. */
  agents?: readonly string[] | undefined;
  /** Let the URL point inside (K2). */
  allowPrivate?: boolean | undefined;
}

/** The shape of an `AddSinkInput` (the client's callers are not type-checked); values are checked after. */
const addSinkShape = z.object({
  name: z.string({ error: 'name must be a string' }),
  url: z.string({ error: 'url must be a string' }),
  secret: z.string({ error: 'secret must be a string' }).optional(),
  timeout: z.union([z.string(), z.number()], { error: 'timeout must be a duration or milliseconds' }).optional(),
  concurrency: z.number({ error: 'concurrency must be a number' }).optional(),
  agents: z.array(z.string(), { error: 'agents must be an array of agent patterns' }).optional(),
  allowPrivate: z.boolean({ error: 'allowPrivate must be a boolean' }).optional(),
});

/** Parses `input` against a zod shape, as `invalid_argument` naming the first problem. */
function shaped<T>(schema: z.ZodType<T>, input: unknown, what: string): T {
  const parsed = schema.safeParse(input);
  if (parsed.success) return parsed.data;
  const issue = parsed.error.issues[0];
  throw new CorralError('invalid_argument', `${what}: ${issue?.path.join('.') || 'input'}: ${issue?.message ?? 'invalid'}`);
}

/** Options of `addSink` that are not the sink: where DNS answers come from (tests give their own). */
export interface SinkCheckOptions {
  resolve?: Resolver;
}

/** Adds a sink; returns it with its secret (to hand to the receiver). `already_exists` for a taken name. */
export async function addSink(db: DbOrTx, input: AddSinkInput, opts: SinkCheckOptions = {}): Promise<SinkView & { secret: string }> {
  const given = shaped(addSinkShape, input, 'a sink');
  const name = parseSinkName(given.name);
  const url = parseSinkUrl(given.url);
  const secret = given.secret?.trim() ?? generateSecret();
  secretKey(secret);
  const timeoutMs =
    given.timeout === undefined
      ? DEFAULT_SINK_TIMEOUT_MS
      : typeof given.timeout === 'number'
        ? given.timeout
        : parseDurationMs(String(given.timeout), '--timeout');
  if (!Number.isInteger(timeoutMs) || timeoutMs < 100 || timeoutMs > 600_000)
    throw new CorralError('invalid_argument', '--timeout is 100ms to 10m');
  const concurrency = given.concurrency ?? DEFAULT_SINK_CONCURRENCY;
  if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 64)
    throw new CorralError('invalid_argument', '--concurrency is 1 to 64');
  const agents = given.agents === undefined ? null : checkedScope(given.agents);
  const allowPrivate = given.allowPrivate ?? false;
  // K2: last, since it may wait for DNS; nothing is stored for a URL it refuses
  await checkSinkHost(new URL(url), { allowPrivate, given: given.url, ...(opts.resolve ? { resolve: opts.resolve } : {}) });
  const row = await insertSink(db, { name, url, secret, timeoutMs, concurrency, agents, allowPrivate });
  if (!row) throw new CorralError('already_exists', `a sink named ${name} exists: remove it first, or pick another name`);
  return { ...view(row), secret };
}

/** Every sink, by name, with its pending and dead messages counted (two statements, whatever the number of sinks). */
export async function listSinkViews(db: DbOrTx): Promise<SinkSummary[]> {
  const [rows, counts] = await Promise.all([listSinks(db), outboxCountsBySink(db)]);
  return rows.map((r) => ({ ...view(r), pending: counts.get(r.name)?.pending ?? 0, dead: counts.get(r.name)?.dead ?? 0 }));
}

/** A sink's secrets as `show --secret` gives them: the current one, and the previous one while it still signs (K1). */
export interface SinkSecrets {
  secret: string;
  previousSecret?: string;
}

/** One sink, with its secrets only when asked for (K1). `not_found` when there is none. */
export async function showSink(db: DbOrTx, name: string, opts: { secret?: boolean } = {}): Promise<SinkView & Partial<SinkSecrets>> {
  const row = await sinkByName(db, parseSinkName(name));
  if (!row) throw new CorralError('not_found', `no sink named ${name}`);
  if (!opts.secret) return view(row);
  return { ...view(row), secret: row.secret, ...(row.previousInUse && row.previousSecret ? { previousSecret: row.previousSecret } : {}) };
}

/** Longest overlap of a rotation: a receiver that has not taken the new secret in a month has other problems. */
const MAX_OVERLAP_MS = 30 * 24 * 3600_000;
export const DEFAULT_OVERLAP_MS = 24 * 3600_000;

export interface RotateSecretInput {
  /** The new secret; one is made when absent. */
  secret?: string | undefined;
  /** How long the old secret signs too: a duration (`24h`), milliseconds, or 0 (it stops at once); default 24 h. */
  overlap?: string | number | undefined;
}

const rotateShape = z.object({
  secret: z.string({ error: 'secret must be a string' }).optional(),
  overlap: z.union([z.string(), z.number()], { error: 'overlap must be a duration or milliseconds' }).optional(),
});

/**
 * A new signing secret for sink `name` (`corral sinks rotate-secret`): every request from now on
 * is signed with it, and, during the overlap, with the old one too (after the new one), so a
 * receiver can switch to the new secret at any moment of the overlap. Pending messages are kept;
 * their next attempts are signed so. Returns the sink with the new secret (K1).
 */
export async function rotateSecret(db: DbOrTx, name: string, input: RotateSecretInput = {}): Promise<SinkView & { secret: string }> {
  const sinkName = parseSinkName(name);
  const given = shaped(rotateShape, input ?? {}, 'a rotation');
  const overlapMs =
    given.overlap === undefined
      ? DEFAULT_OVERLAP_MS
      : typeof given.overlap === 'number'
        ? given.overlap
        : /^\s*0+\s*$/.test(given.overlap)
          ? 0
          : parseDurationMs(given.overlap, '--overlap');
  if (!Number.isInteger(overlapMs) || overlapMs < 0 || overlapMs > MAX_OVERLAP_MS)
    throw new CorralError('invalid_argument', '--overlap is 0 (the old secret stops at once) to 30d');
  const secret = given.secret?.trim() ?? generateSecret();
  secretKey(secret);
  const current = await sinkByName(db, sinkName);
  if (!current) throw new CorralError('not_found', `no sink named ${sinkName}`);
  if (current.secret === secret) throw new CorralError('invalid_argument', "the new secret is the sink's current one: give another");
  const row = await rotateSinkSecret(db, sinkName, secret, overlapMs);
  if (!row) throw new CorralError('not_found', `no sink named ${sinkName}`);
  return { ...view(row), secret };
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

/** Disables a sink by hand (the operator console): its messages wait, as for a receiver's 410, until enabled again; returns it. */
export async function disableSink(db: DbOrTx, name: string, reason: string): Promise<SinkView> {
  const row = await setSinkDisabled(db, parseSinkName(name), reason.slice(0, 200) || 'disabled by an operator');
  if (!row) throw new CorralError('not_found', `no sink named ${name}`);
  return view(row);
}
