/**
 * Input policies for operators and applications (`corral policy set | list | clear`, the
 * client's `setInputPolicy`): what an event sent to a busy actor does, for an agent (every
 * session of it) or one actor (src/db/enqueue/input-policies.ts says exactly when a send is refused).
 *
 * The input is checked before anything touches the database: a malformed target is
 * `invalid_actor_key`, a policy that does not exist or options it does not take `invalid_argument`.
 */
import { isValidActorPart, parseActorKey } from '../base/actor-key.ts';
import type { DbOrTx } from '../db/client.ts';
import {
  clearInputPolicy,
  defaultInputPolicy,
  listInputPolicies,
  setInputPolicy,
  type InputPolicyRow,
} from '../db/enqueue/input-policies.ts';
import {
  AVAILABLE_INPUT_POLICIES,
  BATCHING_POLICIES,
  INPUT_POLICIES,
  MAX_BATCH_EVENTS,
  MAX_DEBOUNCE_MS,
  type InputPolicy,
  type InputPolicyOptions,
} from '../db/views.ts';
import { CorralError } from '../base/errors.ts';
import { parseDurationMs } from '../base/duration.ts';

export { AVAILABLE_INPUT_POLICIES, INPUT_POLICIES, type InputPolicy, type InputPolicyOptions };

/** An agent (every session of it, `sessionId` null) or one actor. */
export interface PolicyTarget {
  agentUid: string;
  sessionId: string | null;
}

/** `support-bot` (the agent) or `support-bot/s-42` (one actor); `invalid_actor_key` otherwise. */
export function parsePolicyTarget(text: string): PolicyTarget {
  if (!text.includes('/')) {
    if (isValidActorPart(text)) return { agentUid: text, sessionId: null };
    throw new CorralError(
      'invalid_actor_key',
      `invalid agent_uid ${JSON.stringify(text)}: expected 1-128 characters of A-Z a-z 0-9 . _ : @ - (or <agent_uid>/<session_id> for one actor)`,
    );
  }
  const key = parseActorKey(text);
  return { agentUid: key.agentUid, sessionId: key.sessionId };
}

/** A policy's name; `invalid_argument` for another word. */
export function parsePolicy(text: string): InputPolicy {
  if ((AVAILABLE_INPUT_POLICIES as readonly string[]).includes(text)) return text as InputPolicy;
  throw new CorralError(
    'invalid_argument',
    `unknown input policy ${JSON.stringify(text)}: choose one of ${AVAILABLE_INPUT_POLICIES.join(', ')}`,
  );
}

/** A batching policy's options as the CLI writes them (durations like `300ms`, `5s`). */
export interface BatchOptionsText {
  debounce?: string;
  maxWait?: string;
  maxEvents?: string;
  maxBytes?: string;
}

const invalid = (message: string) => new CorralError('invalid_argument', message);

/** The CLI's options, parsed; `invalid_argument` for a bad value (then `checkBatchOptions`). */
export function parseBatchOptions(policy: InputPolicy, text: BatchOptionsText): InputPolicyOptions {
  const count = (v: string, flag: string) => {
    if (!/^\d+$/.test(v.trim())) throw invalid(`invalid ${flag} ${JSON.stringify(v)}: expected a whole number`);
    return Number(v.trim());
  };
  const options: InputPolicyOptions = {
    ...(text.debounce === undefined ? {} : { debounceMs: Math.round(parseDurationMs(text.debounce, '--debounce duration')) }),
    ...(text.maxWait === undefined ? {} : { maxWaitMs: Math.round(parseDurationMs(text.maxWait, '--max-wait duration')) }),
    ...(text.maxEvents === undefined ? {} : { maxEvents: count(text.maxEvents, '--max-events') }),
    ...(text.maxBytes === undefined ? {} : { maxBytes: count(text.maxBytes, '--max-bytes') }),
  };
  return checkBatchOptions(policy, options);
}

const OPTION_KEYS = ['debounceMs', 'maxWaitMs', 'maxEvents', 'maxBytes'] as const;

/** An application's options object, checked for its shape (then `checkBatchOptions`); `invalid_argument` otherwise. */
export function batchOptionsFrom(value: unknown): InputPolicyOptions {
  if (value === undefined || value === null) return {};
  if (typeof value !== 'object' || Array.isArray(value)) throw invalid('input policy options are an object');
  const out: InputPolicyOptions = {};
  for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
    if (!(OPTION_KEYS as readonly string[]).includes(k)) {
      throw invalid(`unknown input policy option ${JSON.stringify(k)}: expected ${OPTION_KEYS.join(', ')}`);
    }
    if (v === undefined) continue;
    if (typeof v !== 'number' || !Number.isInteger(v))
      throw invalid(`input policy option ${k} is a whole number, not ${JSON.stringify(v)}`);
    out[k as (typeof OPTION_KEYS)[number]] = v;
  }
  return out;
}

/** `options` if `policy` takes them and they are in range; `invalid_argument` otherwise. */
export function checkBatchOptions(policy: InputPolicy, options: InputPolicyOptions): InputPolicyOptions {
  const given = Object.entries(options).filter(([, v]) => v !== undefined);
  if (given.length === 0) return {};
  if (!(BATCHING_POLICIES as readonly string[]).includes(policy)) {
    throw invalid(`input policy ${policy} takes no options (debounce, max-wait, max-events and max-bytes are coalesce's)`);
  }
  const { debounceMs, maxWaitMs, maxEvents, maxBytes } = options;
  const within = (v: number | undefined, lo: number, hi: number) => v === undefined || (Number.isInteger(v) && v >= lo && v <= hi);
  if (!within(debounceMs, 1, MAX_DEBOUNCE_MS)) throw invalid(`a debounce is 1 ms to 1 h, not ${debounceMs} ms`);
  if (!within(maxWaitMs, 1, MAX_DEBOUNCE_MS)) throw invalid(`a max-wait is 1 ms to 1 h, not ${maxWaitMs} ms`);
  if (maxWaitMs !== undefined && debounceMs === undefined) throw invalid('a max-wait bounds a debounce: set a debounce too');
  if (maxWaitMs !== undefined && debounceMs !== undefined && maxWaitMs < debounceMs) {
    throw invalid(`the max-wait (${maxWaitMs} ms) is shorter than the debounce (${debounceMs} ms)`);
  }
  if (!within(maxEvents, 1, MAX_BATCH_EVENTS)) throw invalid(`max-events is 1 to ${MAX_BATCH_EVENTS}, not ${maxEvents}`);
  if (!within(maxBytes, 1, 2 ** 31 - 1)) throw invalid(`max-bytes is a positive number of bytes, not ${maxBytes}`);
  return Object.fromEntries(given) as InputPolicyOptions;
}

/** The options as one line: `debounce 300ms, max-wait 5000ms, max-events 20` ('' for none). */
export function optionsText(o: InputPolicyOptions): string {
  return [
    o.debounceMs === undefined ? '' : `debounce ${o.debounceMs}ms`,
    o.maxWaitMs === undefined ? '' : `max-wait ${o.maxWaitMs}ms`,
    o.maxEvents === undefined ? '' : `max-events ${o.maxEvents}`,
    o.maxBytes === undefined ? '' : `max-bytes ${o.maxBytes}`,
  ]
    .filter(Boolean)
    .join(', ');
}

export interface PolicyView {
  /** `agent` or `agent/session`. */
  target: string;
  agentUid: string;
  sessionId: string | null;
  policy: InputPolicy;
  /** A batching policy's options (absent ones take the default). */
  options: InputPolicyOptions;
  updatedAt: string;
}

/** `agent` or `agent/session`. */
export const targetText = (t: PolicyTarget): string => (t.sessionId === null ? t.agentUid : `${t.agentUid}/${t.sessionId}`);

const viewOf = (r: InputPolicyRow): PolicyView => ({
  target: targetText(r),
  agentUid: r.agentUid,
  sessionId: r.sessionId,
  policy: r.policy,
  options: r.options,
  updatedAt: r.updatedAt.toISOString(),
});

/** Sets the policy of `target` (checked input: `parsePolicyTarget`, `parsePolicy`). Returns it, and the policy it replaced (null: none of its own). */
export async function setPolicy(
  db: DbOrTx,
  target: PolicyTarget,
  policy: InputPolicy,
  options: InputPolicyOptions = {},
): Promise<PolicyView & { previous: InputPolicy | null }> {
  const r = await setInputPolicy(db, target.agentUid, target.sessionId, policy, checkBatchOptions(policy, options));
  return { ...viewOf(r), previous: r.previous };
}

/** Every policy set, by agent (the agent's own before its actors'), and the default of the others. */
export async function listPolicies(db: DbOrTx): Promise<{ policies: PolicyView[]; default: InputPolicy }> {
  const [rows, fallback] = await Promise.all([listInputPolicies(db), defaultInputPolicy(db)]);
  return { policies: rows.map(viewOf), default: fallback };
}

/** Removes the policy of `target`: the agent's or the default applies again. Returns the one it had; `nothing_matched` when it had none. */
export async function clearPolicy(db: DbOrTx, target: PolicyTarget): Promise<InputPolicy> {
  const had = await clearInputPolicy(db, target.agentUid, target.sessionId);
  if (had === null) throw new CorralError('nothing_matched', `${targetText(target)} has no input policy of its own`);
  return had;
}
