/**
 * `corral`: the package's main entry point, the only module of it an application imports (with
 * `corral/worker` for workers and `corral/testing` for tests). Everything it does not export is
 * internal and may change in any release.
 */
export { CorralError, FenceRejected, FENCE_REASONS, type ErrorCode, type FenceReason } from './errors.ts';
export { actorKey, parseActorKey, formatActorKey, isValidActorPart, type ActorKey } from './actor-key.ts';
export type { JsonValue } from './fabric/protocol.ts';
