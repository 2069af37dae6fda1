/**
 * Which actors a credential may touch: the `actors` of an API token (`corral tokens create NAME
 * --actors PATTERN…`, `corral.tokens.create({ actors })`). Every route of the HTTP API checks the
 * actor it names against the token, and one outside answers as an actor that does not exist.
 *
 * A pattern is `<agent part>/<session part>`. Each part is exact (`tenant-a`), a prefix ending in
 * `*` (`tenant-*`, `user-42-*`), or `*` alone (any); so `tenant-a/*` is every session of agent
 * `tenant-a`, and `tenant-a/user-42` one actor. The parts have the actor key's characters (1-128
 * of `A-Z a-z 0-9 . _ : @ -`, the `*` aside). The same prefix rule as a worker key's `--agents`
 * (src/base/agent-scope.ts), extended to sessions. No scope (undefined) means every actor.
 */
import type { ActorKey } from './actor-key.ts';
import { patternMatches } from './agent-scope.ts';
import { CorralError } from './errors.ts';

/** Most patterns of one scope. */
export const MAX_ACTOR_PATTERNS = 64;

const PART = /^[A-Za-z0-9._:@-]{0,128}\*?$/;

/** A scope as stored: its patterns, or undefined for every actor. */
export type ActorScope = readonly string[] | undefined;

/** Why `pattern` is not an actor pattern, or undefined when it is one. */
export function actorPatternProblem(pattern: string): string | undefined {
  const shown = JSON.stringify(String(pattern).slice(0, 300));
  if (typeof pattern !== 'string' || pattern.length > 259) return `invalid actor pattern ${shown}: too long`;
  const parts = pattern.split('/');
  if (parts.length !== 2)
    return `invalid actor pattern ${shown}: expected <agent_uid>/<session_id>, each exact or a prefix ending in * (e.g. tenant-a/*)`;
  for (const p of parts) {
    if (p.length === 0 || !PART.test(p)) {
      return `invalid actor pattern ${shown}: each part is 1-128 characters of A-Z a-z 0-9 . _ : @ -, or a prefix of them ending in *`;
    }
  }
  return undefined;
}

/** The patterns given, checked, each once in the order given; `invalid_argument` for a bad one or too many. */
export function parseActorPatterns(given: readonly string[]): string[] {
  if (!Array.isArray(given)) throw new CorralError('invalid_argument', 'actors: expected a list of patterns such as "tenant-a/*"');
  const out: string[] = [];
  for (const p of given) {
    const problem = actorPatternProblem(p);
    if (problem) throw new CorralError('invalid_argument', problem);
    if (!out.includes(p)) out.push(p);
  }
  if (out.length === 0) throw new CorralError('invalid_argument', 'actors: at least one pattern (or none at all, for every actor)');
  if (out.length > MAX_ACTOR_PATTERNS) throw new CorralError('invalid_argument', `actors: at most ${MAX_ACTOR_PATTERNS} patterns`);
  return out;
}

/** Whether `key` is among the actors of `scope`. */
export function actorInScope(scope: ActorScope, key: ActorKey): boolean {
  if (scope === undefined) return true;
  for (const p of scope) {
    const slash = p.indexOf('/');
    if (patternMatches(p.slice(0, slash), key.agentUid) && patternMatches(p.slice(slash + 1), key.sessionId)) return true;
  }
  return false;
}

/** How a scope reads in a listing: its patterns, or `every actor`. */
export function describeActorScope(scope: ActorScope): string {
  return scope === undefined ? 'every actor' : scope.join(' ');
}
