/**
 * Which agents a worker key may serve: the `agents` scope of an allow-list entry (`corral keys
 * add-worker ID --agents PATTERN…`). A worker is given turns only of actors whose `agent_uid`
 * its scope matches, and a result of it may emit only to such actors. The same patterns say which
 * agents' turns may deliver to a webhook sink (`corral sinks add NAME --agents PATTERN…`).
 *
 * A pattern is an exact `agent_uid` (`support-bot`) or a prefix ending in `*` (`support-*`);
 * `*` alone matches every agent. No scope (undefined) means every agent: keys issued before
 * scopes existed keep serving all of them.
 */

import { CorralError } from './errors.ts';

/** Most patterns in one scope, and the longest pattern (an agent_uid is at most 128 characters). */
export const MAX_SCOPE_PATTERNS = 64;
export const MAX_PATTERN_CHARS = 129;

const PATTERN = /^[A-Za-z0-9._:@-]{0,128}\*?$/;

/** Why `pattern` is not a valid agent pattern, or undefined when it is. */
export function agentPatternProblem(pattern: string): string | undefined {
  if (pattern.length === 0) return 'an agent pattern may not be empty';
  if (pattern.length > MAX_PATTERN_CHARS || !PATTERN.test(pattern)) {
    return `invalid agent pattern ${JSON.stringify(pattern.slice(0, 140))}: expected an agent_uid (1-128 characters of A-Z a-z 0-9 . _ : @ -), optionally ending in *`;
  }
  return undefined;
}

/** A scope as stored and sent: its patterns, or undefined for every agent. */
export type AgentScope = readonly string[] | undefined;

/** The prefix rule of every scope pattern: `value` is `pattern`, or starts with it when it ends in `*`. */
export const patternMatches = (pattern: string, value: string): boolean =>
  pattern.endsWith('*') ? value.startsWith(pattern.slice(0, -1)) : value === pattern;

/** Whether a worker with `scope` may serve (and emit to) `agentUid`. */
export function agentInScope(scope: AgentScope, agentUid: string): boolean {
  return scope === undefined || scope.some((p) => patternMatches(p, agentUid));
}

/**
 * A scope as given (`--agents` of `corral keys add-worker` and of `corral sinks add`): each
 * pattern valid, at least one, at most MAX_SCOPE_PATTERNS distinct ones. Throws
 * `invalid_argument` naming the problem.
 */
export function checkedScope(patterns: readonly string[]): string[] {
  const distinct = [...new Set(patterns)];
  if (distinct.length === 0) throw new CorralError('invalid_argument', 'an agent scope needs at least one pattern');
  if (distinct.length > MAX_SCOPE_PATTERNS) {
    throw new CorralError('invalid_argument', `an agent scope holds at most ${MAX_SCOPE_PATTERNS} patterns (got ${distinct.length})`);
  }
  for (const p of distinct) {
    const problem = agentPatternProblem(p);
    if (problem) throw new CorralError('invalid_argument', problem);
  }
  return distinct;
}
