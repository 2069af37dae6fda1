/**
 * Transcript retention for operators (`corral retention set | list | clear`): how long an agent's
 * transcript is kept. Without a policy an agent's transcript is kept forever; with one, the
 * daemon's retention sweep deletes its turns that finished longer ago than the window, with their
 * messages (src/db/operations/transcript-retention.ts says exactly what goes).
 *
 * The input is checked before anything touches the database: a malformed agent uid is
 * `invalid_actor_key`, a malformed or out-of-range window `invalid_argument` (exit 2).
 */
import { isValidActorPart } from '../base/actor-key.ts';
import type { DbOrTx } from '../db/client.ts';
import {
  clearTranscriptRetention,
  listTranscriptRetention,
  MAX_KEEP_SECONDS,
  setTranscriptRetention,
  type TranscriptRetention,
} from '../db/operations/transcript-retention.ts';
import { CorralError } from '../base/errors.ts';
import { parseDurationMs } from '../base/duration.ts';

export { MAX_KEEP_SECONDS, type TranscriptRetention } from '../db/operations/transcript-retention.ts';

/** An agent uid as an actor key's first part; `invalid_actor_key` otherwise (a whole actor key is pointed out). */
export function parseAgentUid(text: string): string {
  if (isValidActorPart(text)) return text;
  const hint = text.includes('/') ? ' (an agent, not an actor key: retention applies to every session of the agent)' : '';
  throw new CorralError(
    'invalid_actor_key',
    `invalid agent_uid ${JSON.stringify(text)}: expected 1-128 characters of A-Z a-z 0-9 . _ : @ -${hint}`,
  );
}

/** A window such as `90d`, `12h`, `30m` (or ISO 8601, `P90D`) in whole seconds; `invalid_argument` otherwise. */
export function parseKeepSeconds(text: string): number {
  const ms = parseDurationMs(text, 'retention');
  if (ms % 1000 !== 0) {
    throw new CorralError('invalid_argument', `invalid retention ${JSON.stringify(text)}: a whole number of seconds, e.g. 90d, 12h, 30m`);
  }
  const seconds = ms / 1000;
  if (seconds > MAX_KEEP_SECONDS) {
    throw new CorralError(
      'invalid_argument',
      `invalid retention ${JSON.stringify(text)}: at most ${MAX_KEEP_SECONDS} seconds (about 68 years)`,
    );
  }
  return seconds;
}

const UNITS: [string, number][] = [
  ['d', 86_400],
  ['h', 3_600],
  ['m', 60],
  ['s', 1],
];

/** `90d`, `1d12h`, `30m`, `1h1m5s`: seconds in the compact form `parseKeepSeconds` reads back. */
export function formatKeep(seconds: number): string {
  let rest = seconds;
  let out = '';
  for (const [unit, size] of UNITS) {
    const n = Math.floor(rest / size);
    if (n > 0) out += `${n}${unit}`;
    rest -= n * size;
  }
  return out || '0s';
}

export interface RetentionView {
  agentUid: string;
  keepSeconds: number;
  /** `keepSeconds` in the compact form (`90d`). */
  keep: string;
  updatedAt: string;
}

const viewOf = (r: TranscriptRetention): RetentionView => ({
  agentUid: r.agentUid,
  keepSeconds: r.keepSeconds,
  keep: formatKeep(r.keepSeconds),
  updatedAt: r.updatedAt.toISOString(),
});

/** Sets `agentUid`'s window (checked input: `parseAgentUid`, `parseKeepSeconds`). Returns it, and the window it replaced. */
export async function setRetention(
  db: DbOrTx,
  agentUid: string,
  keepSeconds: number,
): Promise<RetentionView & { previousKeepSeconds: number | null }> {
  const r = await setTranscriptRetention(db, agentUid, keepSeconds);
  return { ...viewOf(r), previousKeepSeconds: r.previousKeepSeconds };
}

/** Every policy, by agent. */
export async function listRetention(db: DbOrTx): Promise<RetentionView[]> {
  return (await listTranscriptRetention(db)).map(viewOf);
}

/** Removes `agentUid`'s policy: its transcript is kept forever again. Returns the window it had; `nothing_matched` when it had none. */
export async function clearRetention(db: DbOrTx, agentUid: string): Promise<number> {
  const had = await clearTranscriptRetention(db, agentUid);
  if (had === null) throw new CorralError('nothing_matched', `agent ${agentUid} has no transcript retention: its transcript is kept`);
  return had;
}
