/**
 * corral worker protocol, version 1: the zod schemas of every message between the daemon's
 * ROUTER and a worker's DEALER, and the codec. The prose specification is docs/protocol.md;
 * keep the two in step.
 *
 * Compatibility rules, decided here once:
 * 1. Every message is one ZeroMQ frame holding one UTF-8 JSON object with `v` and `type`.
 * 2. `v` must be 1. A message with another version is refused as `unsupported_version`, never
 *    half-understood.
 * 3. Unknown extra fields are ignored (stripped), so a newer peer can add optional fields
 *    without breaking an older one.
 * 4. `turn_ref` is the exception to 3: it keeps unknown fields, because the worker must echo it
 *    verbatim and a newer daemon may put more into its fence than this version knows about.
 * 5. An unknown `type` is refused (`invalid_message`) by the daemon. The worker SDK logs and
 *    ignores unknown daemon types (a newer daemon may announce things an old worker can skip).
 */
import { MAX_TRACESTATE_LENGTH, TRACESTATE_PATTERN, traceparentProblem } from '../base/trace-context.ts';
import { z } from 'zod';
import { FENCE_REASONS } from '../base/errors.ts';
import { MAX_JSON_DEPTH, pruneDeepJson } from '../base/json-safety.ts';
import { MAX_BATCH_EVENTS } from '../base/defaults.ts';
import { isJsonValue, jsonValueSchema } from '../base/json-value.ts';

export { isJsonValue, type JsonValue } from '../base/json-value.ts';
export {
  MAX_EMITS,
  MAX_EMIT_DELAY_MS,
  MAX_DELIVERIES,
  DELIVER_KEY_PATTERN,
  emitSchema,
  deliverSchema,
  resultValuesProblem,
  type Emit,
  type Deliver,
} from '../effects/limits.ts';

export const PROTOCOL_VERSION = 1;
export {
  DEFAULT_HEARTBEAT_INTERVAL_MS,
  DEFAULT_MAX_MESSAGE_BYTES,
  DEFAULT_PROGRESS_INTERVAL_MS,
  DEFAULT_RECEIVE_HWM,
} from '../base/defaults.ts';
export const MAX_RESULT_MESSAGES = 1000;
export const MAX_CAPACITY = 1024;
/** Longest `turn_ref` (as JSON) accepted from a worker. */
export const MAX_TURN_REF_CHARS = 2048;
/**
 * The deepest nesting a worker's frame keeps: the value of the deepest field that takes JSON
 * (`messages[].content`, `emit[].data`: three levels down) may be MAX_JSON_DEPTH deep. Whatever
 * opens deeper is cut before the frame is parsed (see `parseWorkerMessage`).
 */
export const MAX_FRAME_DEPTH = MAX_JSON_DEPTH + 3;
/**
 * The messages whose JSON values are judged after parsing: a value too deep in them is refused for
 * its turn (`turn_rejected{unstorable}`, `emit_limit`) or its request (`invalid_params`). Any
 * other message nested deeper than MAX_FRAME_DEPTH is `invalid_message`.
 */
const JUDGED_AFTER_PARSING: ReadonlySet<string> = new Set(['turn_result', 'rpc_request']);

/** A challenge nonce or a key proof (src/fabric/proof.ts): 32 bytes as base64url without padding. */
export const PROOF_TEXT_PATTERN = /^[A-Za-z0-9_-]{43}$/;

/** A worker id appears in logs, metrics and the database: short, printable ASCII. */
export const WORKER_ID_PATTERN = /^[A-Za-z0-9._:-]{1,64}$/;

export function isValidWorkerId(id: string): boolean {
  return WORKER_ID_PATTERN.test(id);
}

/**
 * Reasons the daemon gives in `turn_rejected`: every fence reason, `unstorable` (a result
 * PostgreSQL cannot store, or nested deeper than MAX_JSON_DEPTH), `emit_limit` (a result's `emit`
 * breaks the limits: too many entries, an entry too large, an unknown actor key or delay),
 * `emit_denied` (an emit to an agent outside the worker key's scope), `deliver_limit` (a result's
 * `deliver` breaks the limits: too many entries, a body too large, a bad key, an unknown sink),
 * `deliver_forbidden` (a deliver to a sink whose agents exclude the turn's agent) and `commit_failed` (the
 * daemon could not write the final message; the attempt is failed). The list may grow; receivers
 * must accept others.
 */
export const TURN_REJECTED_REASONS = [
  ...FENCE_REASONS,
  'unstorable',
  'emit_limit',
  'emit_denied',
  'deliver_limit',
  'deliver_forbidden',
  'commit_failed',
] as const;

/** Codes of the protocol-level `error` message. */
export const PROTOCOL_ERROR_CODES = [
  'invalid_message',
  'not_registered',
  'identity_mismatch',
  'unauthorized',
  'unsupported_version',
  'rate_limited',
] as const;
export type ProtocolErrorCode = (typeof PROTOCOL_ERROR_CODES)[number];

const v = z.literal(PROTOCOL_VERSION);
const workerId = z.string().regex(WORKER_ID_PATTERN, 'worker id must be 1..64 chars of [A-Za-z0-9._:-]');
const isoTime = z.iso.datetime({ offset: true });
const json = jsonValueSchema;
/** Same alphabet and length as src/base/actor-key.ts: a longer or stranger part can match no actor. */
const actorPart = z.string().regex(/^[A-Za-z0-9._:@-]{1,128}$/, 'expected 1-128 characters of A-Z a-z 0-9 . _ : @ -');

/**
 * The fence of one delivery. The daemon mints it; the worker echoes it verbatim on every
 * message about that turn; a message counts only if its `turn_ref` matches the daemon's.
 */
export const turnRefSchema = z
  .looseObject({
    agent_uid: actorPart,
    session_id: actorPart,
    activation_uid: z.uuid(),
    actor_epoch: z.int().min(1).max(Number.MAX_SAFE_INTEGER),
    event_id: z.uuid(),
    revision: z.int().min(0).max(Number.MAX_SAFE_INTEGER),
    delivery_id: z.uuid(),
  })
  // Unknown fields are kept (rule 4), so the whole ref is bounded instead: a peer must not be
  // able to make the daemon hold, log or echo megabytes per message.
  .refine((r) => JSON.stringify(r).length <= MAX_TURN_REF_CHARS, `turn_ref longer than ${MAX_TURN_REF_CHARS} characters`);
export type TurnRef = z.infer<typeof turnRefSchema>;

// ---- worker → daemon -------------------------------------------------------------------

export const workerReadySchema = z.object({
  v,
  type: z.literal('worker_ready'),
  worker_id: workerId,
  capacity: z.int().min(1).max(MAX_CAPACITY),
  sdk: z.string().max(256).optional(),
  /**
   * Identifies one run of the worker process (random per start). A re-registration with the
   * same instance is a reconnect; with a new one, the process restarted and lost its turns.
   */
  instance: z.string().min(1).max(64).optional(),
  /**
   * The registration credentials (see src/fabric/auth.ts): with CURVE `{ scheme: 'key', credential:
   * <token from the key file> }`, answered by a `worker_challenge`, then the same with the
   * challenge's `nonce` and the key `proof` (src/fabric/proof.ts).
   */
  auth: z
    .object({
      scheme: z.string().min(1).max(64),
      credential: z.string().max(1024),
      nonce: z.string().regex(PROOF_TEXT_PATTERN, 'expected 43 characters of base64url').optional(),
      proof: z.string().regex(PROOF_TEXT_PATTERN, 'expected 43 characters of base64url').optional(),
    })
    .optional(),
});

export const workerHeartbeatSchema = z.object({
  v,
  type: z.literal('worker_heartbeat'),
  worker_id: workerId,
  in_flight: z.int().min(0).max(1_000_000),
});

export const turnAcceptedSchema = z.object({ v, type: z.literal('turn_accepted'), turn_ref: turnRefSchema });

export const turnProgressSchema = z.object({
  v,
  type: z.literal('turn_progress'),
  turn_ref: turnRefSchema,
  note: z.string().max(4096).optional(),
});

export const MAX_CHUNK_SEQ = 2_147_483_647;

/** Something a running turn streams to the people watching it (docs/protocol.md §5.2): relayed while the turn is live, never stored past it. */
export const turnChunkSchema = z.object({
  v,
  type: z.literal('turn_chunk'),
  turn_ref: turnRefSchema,
  seq: z.int().min(1).max(MAX_CHUNK_SEQ),
  data: json,
});

export const resultMessageSchema = z.object({ role: z.enum(['assistant', 'tool']), content: json });
export type ResultMessage = z.infer<typeof resultMessageSchema>;

export const turnResultSchema = z.object({
  v,
  type: z.literal('turn_result'),
  turn_ref: turnRefSchema,
  messages: z.array(resultMessageSchema).max(MAX_RESULT_MESSAGES),
  output: json.optional(),
  /** Events to enqueue exactly once with the commit (at most MAX_EMITS; more is `emit_limit`). */
  emit: z.array(z.unknown()).optional(),
  /** Messages to send to sinks once the turn commits (at most MAX_DELIVERIES; more is `deliver_limit`). */
  deliver: z.array(z.unknown()).optional(),
});

/** What a handler contributes to a `turn_result`: its `turn_ref` is the worker's own copy of the daemon's, checked on arrival. */
export const turnResultBodySchema = turnResultSchema.pick({ messages: true, output: true, emit: true, deliver: true });

export const turnErrorBodySchema = z.object({
  code: z.string().min(1).max(128),
  message: z.string().max(65536),
  retryable: z.boolean(),
});
export type TurnErrorBody = z.infer<typeof turnErrorBodySchema>;

export const turnErrorSchema = z.object({
  v,
  type: z.literal('turn_error'),
  turn_ref: turnRefSchema,
  error: turnErrorBodySchema,
});

/** RPC methods a worker may call; each is fenced by the `turn_ref` it carries. */
export const RPC_METHODS = ['history.read', 'actor.status'] as const;
export type RpcMethod = (typeof RPC_METHODS)[number];

/** Codes of `rpc_response.error`. */
export const RPC_ERROR_CODES = ['not_live', 'unknown_method', 'invalid_params', 'busy', 'timeout', 'internal'] as const;
export type RpcErrorCode = (typeof RPC_ERROR_CODES)[number];

/** A request from a worker, answered by one `rpc_response` with the same `id` on the same socket. */
export const rpcRequestSchema = z.object({
  v,
  type: z.literal('rpc_request'),
  /** Chosen by the worker, echoed in the response (unique among its open requests). */
  id: z.string().min(1).max(128),
  method: z.string().min(1).max(64),
  params: json.optional(),
  /** The live turn the request is made for: it fences every read. */
  turn_ref: turnRefSchema,
});
export type RpcRequest = z.infer<typeof rpcRequestSchema>;

export const workerMessageSchema = z.discriminatedUnion('type', [
  workerReadySchema,
  workerHeartbeatSchema,
  turnAcceptedSchema,
  turnProgressSchema,
  turnChunkSchema,
  turnResultSchema,
  turnErrorSchema,
  rpcRequestSchema,
]);
export type WorkerMessage = z.infer<typeof workerMessageSchema>;
export type WorkerReady = z.infer<typeof workerReadySchema>;
export type WorkerHeartbeat = z.infer<typeof workerHeartbeatSchema>;
export type TurnAccepted = z.infer<typeof turnAcceptedSchema>;
export type TurnProgress = z.infer<typeof turnProgressSchema>;
export type TurnChunk = z.infer<typeof turnChunkSchema>;
export type TurnResult = z.infer<typeof turnResultSchema>;
export type TurnError = z.infer<typeof turnErrorSchema>;

/** Retry policy of actor events, as told in `worker_welcome`. */
export const retryPolicySchema = z.object({
  /** Attempts after the first (so at most `limit + 1` attempts). */
  limit: z.int().min(0),
  delay_s: z.int().min(0),
  delay_max_s: z.int().min(0),
  backoff: z.boolean(),
});
export type RetryPolicy = z.infer<typeof retryPolicySchema>;

// ---- daemon → worker -------------------------------------------------------------------

export const workerWelcomeSchema = z.object({
  v,
  type: z.literal('worker_welcome'),
  worker_id: workerId,
  heartbeat_interval_ms: z.int().min(1),
  progress_interval_ms: z.int().min(1),
  /**
   * The capacity the daemon registered: the worker's own, or lower when its allow-list entry
   * caps it. The daemon sends at most this many turns at once. Absent from older daemons.
   */
  capacity: z.int().min(1).max(MAX_CAPACITY).optional(),
  /** Lease per dispatch / progress: a turn with no progress for this long fails its attempt. */
  lease_ms: z.int().min(1).optional(),
  /** A worker silent (no message) for this long is declared stale and must register again. */
  stale_ms: z.int().min(1).optional(),
  retry: retryPolicySchema.optional(),
  /** The largest `turn_chunk` frame the daemon relays (CORRAL_STREAM_CHUNK_BYTES); absent from older daemons. */
  stream_chunk_bytes: z.int().min(1).optional(),
  /** The most `turn_chunk` frame bytes relayed per attempt (CORRAL_STREAM_TURN_BYTES); absent from older daemons. */
  stream_turn_bytes: z.int().min(1).optional(),
});

/**
 * The answer to a `worker_ready` that has no key proof yet: prove the key for `worker_id` over
 * `nonce` (docs/protocol.md §13). Good for one attempt on this connection, for a few seconds.
 */
export const workerChallengeSchema = z.object({
  v,
  type: z.literal('worker_challenge'),
  worker_id: workerId,
  nonce: z.string().regex(PROOF_TEXT_PATTERN),
});

/** One transcript message as the daemon shows it to a worker (context, history.read). */
export const transcriptMessageSchema = z.object({
  seq: z.int().min(1),
  role: z.enum(['user', 'assistant', 'tool']),
  content: json,
});
export type TranscriptMessage = z.infer<typeof transcriptMessageSchema>;

/**
 * The conversation a turn continues: its latest committed messages (oldest first), bounded by
 * count and bytes. The event's own `user` message is not among them (it is written on commit,
 * as message `current_seq`, with `event.data` as content).
 */
const MESSAGE_ROLES: ReadonlySet<string> = new Set(transcriptMessageSchema.shape.role.options);

/**
 * `transcriptMessageSchema` for a whole list, as one plain loop: a context carries up to 50
 * messages on every turn_start, where a zod object per message cost more than the JSON parse.
 */
function isTranscriptMessageList(value: unknown): value is TranscriptMessage[] {
  if (!Array.isArray(value)) return false;
  for (const m of value as unknown[]) {
    if (m === null || typeof m !== 'object' || Array.isArray(m)) return false;
    const { seq, role, content } = m as Record<string, unknown>;
    if (!Number.isSafeInteger(seq) || (seq as number) < 1) return false;
    if (typeof role !== 'string' || !MESSAGE_ROLES.has(role)) return false;
    if (!isJsonValue(content)) return false;
  }
  return true;
}

export const turnContextSchema = z.object({
  conversation_id: z.uuid(),
  messages: z.custom<TranscriptMessage[]>(isTranscriptMessageList, {
    message: 'expected a list of { seq: integer >= 1, role: user | assistant | tool, content: JSON }',
  }),
  /** seq of `messages[0]`; absent when `messages` is empty. */
  first_seq: z.int().min(1).optional(),
  /** True when older messages exist than those sent (page back with `history.read`). */
  has_more: z.boolean(),
  /** The seq the event's own `user` message will get when this turn commits. */
  current_seq: z.int().min(1),
});
export type TurnContextWire = z.infer<typeof turnContextSchema>;

export const traceCarrierSchema = z.object({
  traceparent: z
    .string()
    .max(256)
    .refine((t) => traceparentProblem(t) === undefined, 'expected a W3C traceparent'),
  tracestate: z.string().max(MAX_TRACESTATE_LENGTH).regex(TRACESTATE_PATTERN, 'expected printable ASCII').optional(),
});

const turnEventSchema = z.object({ id: z.string().min(1), data: json, enqueued_at: isoTime });

export const turnStartSchema = z.object({
  v,
  type: z.literal('turn_start'),
  turn_ref: turnRefSchema,
  event: turnEventSchema,
  /**
   * A turn that takes a batch (input policy `coalesce`): every event of it, in enqueue order,
   * `event` first; absent when the turn takes one event.
   */
  events: z.array(turnEventSchema).min(2).max(MAX_BATCH_EVENTS).optional(),
  attempt: z.int().min(1),
  lease_expires_at: isoTime,
  context: turnContextSchema.optional(),
  /**
   * The W3C trace context the turn continues (the sender's, stored with the event): a worker's
   * spans for the turn are its children. Absent when the event came with none.
   */
  trace: traceCarrierSchema.optional(),
});

export const turnSteerSchema = z.object({ v, type: z.literal('turn_steer'), turn_ref: turnRefSchema, input: json });

export const turnCancelSchema = z.object({
  v,
  type: z.literal('turn_cancel'),
  turn_ref: turnRefSchema,
  reason: z.string(),
});

/** Why a turn's stream was closed (`turn_stream_closed.reason`); receivers must tolerate new reasons. */
export const STREAM_CLOSED_REASONS = ['turn_limit'] as const;

/**
 * The daemon relays no more chunks of this attempt (its stream budget, `limit_bytes`, is spent):
 * sent once per attempt, when the first chunk over it is dropped. The turn itself runs on.
 */
export const turnStreamClosedSchema = z.object({
  v,
  type: z.literal('turn_stream_closed'),
  turn_ref: turnRefSchema,
  reason: z.string().min(1).max(64),
  limit_bytes: z.int().min(1),
});

export const turnCommittedSchema = z.object({ v, type: z.literal('turn_committed'), turn_ref: turnRefSchema });

export const turnRejectedSchema = z.object({
  v,
  type: z.literal('turn_rejected'),
  turn_ref: turnRefSchema,
  /** One of TURN_REJECTED_REASONS today; receivers must tolerate new reasons. */
  reason: z.string().min(1),
  detail: z.string().optional(),
});

/**
 * The answer to a `turn_error` the daemon acted on: the attempt is failed (or, for the hand-back
 * codes `over_capacity`/`worker_stopping`, returned without spending it). `retry`: the event will
 * be tried again; `dead_lettered`: it will not. The worker may forget the turn.
 */
export const turnFailedSchema = z.object({
  v,
  type: z.literal('turn_failed'),
  turn_ref: turnRefSchema,
  retry: z.boolean(),
  dead_lettered: z.boolean(),
  /** True when the turn was handed back (no attempt spent). */
  handed_back: z.boolean().optional(),
});

export const rpcResponseSchema = z.object({
  v,
  type: z.literal('rpc_response'),
  id: z.string().min(1).max(128),
  result: json.optional(),
  error: z.object({ code: z.string().min(1), message: z.string() }).optional(),
});
export type RpcResponse = z.infer<typeof rpcResponseSchema>;

export const protocolErrorSchema = z.object({
  v,
  type: z.literal('error'),
  /** One of PROTOCOL_ERROR_CODES today; receivers must tolerate new codes. */
  code: z.string().min(1),
  message: z.string(),
});

export const daemonMessageSchema = z.discriminatedUnion('type', [
  workerWelcomeSchema,
  workerChallengeSchema,
  turnStartSchema,
  turnSteerSchema,
  turnCancelSchema,
  turnStreamClosedSchema,
  turnCommittedSchema,
  turnRejectedSchema,
  turnFailedSchema,
  rpcResponseSchema,
  protocolErrorSchema,
]);
export type DaemonMessage = z.infer<typeof daemonMessageSchema>;
export type WorkerWelcome = z.infer<typeof workerWelcomeSchema>;
export type WorkerChallenge = z.infer<typeof workerChallengeSchema>;
export type TurnStart = z.infer<typeof turnStartSchema>;
export type TurnSteer = z.infer<typeof turnSteerSchema>;
export type TurnCancel = z.infer<typeof turnCancelSchema>;
export type TurnStreamClosed = z.infer<typeof turnStreamClosedSchema>;
export type TurnCommitted = z.infer<typeof turnCommittedSchema>;
export type TurnRejected = z.infer<typeof turnRejectedSchema>;
export type TurnFailed = z.infer<typeof turnFailedSchema>;
export type ProtocolError = z.infer<typeof protocolErrorSchema>;

export const WORKER_MESSAGE_TYPES = workerMessageSchema.options.map((o) => o.shape.type.value);
export const DAEMON_MESSAGE_TYPES = daemonMessageSchema.options.map((o) => o.shape.type.value);

// ---- codec -----------------------------------------------------------------------------

/**
 * Why a frame was refused: `unsupported_version` when `v` is present but not 1, `unknown_type`
 * when the envelope is fine but the type is not one this side accepts, else `invalid_message`.
 */
export type ParseFailureCode = 'invalid_message' | 'unsupported_version' | 'unknown_type';
export type ParseResult<T> = { ok: true; msg: T } | { ok: false; error: string; code: ParseFailureCode };

// fatal: a frame of arbitrary bytes must be refused, not silently decoded to U+FFFD.
const utf8 = new TextDecoder('utf-8', { fatal: true });

function parseWith<T>(buf: Uint8Array, schema: z.ZodType<T>, knownTypes: readonly string[], maxDepth?: number): ParseResult<T> {
  try {
    let text: string;
    try {
      text = utf8.decode(buf);
    } catch {
      return { ok: false, code: 'invalid_message', error: 'payload is not valid UTF-8' };
    }
    // a subtree opened too deep is cut before parsing: parsing it would build one object per level
    let pruned = false;
    if (maxDepth !== undefined) {
      const kept = pruneDeepJson(text, maxDepth);
      pruned = kept !== text;
      text = kept;
    }
    let raw: unknown;
    try {
      raw = JSON.parse(text);
    } catch (e) {
      return { ok: false, code: 'invalid_message', error: `payload is not JSON: ${(e as Error).message}` };
    }
    if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) {
      return { ok: false, code: 'invalid_message', error: 'payload is not a JSON object' };
    }
    const envelope = raw as { v?: unknown; type?: unknown };
    if (envelope.v !== PROTOCOL_VERSION) {
      if (typeof envelope.v === 'number') {
        return { ok: false, code: 'unsupported_version', error: `unsupported protocol version ${envelope.v}` };
      }
      return { ok: false, code: 'invalid_message', error: 'missing or invalid "v"' };
    }
    if (typeof envelope.type !== 'string') {
      return { ok: false, code: 'invalid_message', error: 'missing or invalid "type"' };
    }
    if (!knownTypes.includes(envelope.type)) {
      return { ok: false, code: 'unknown_type', error: `unknown message type ${JSON.stringify(envelope.type).slice(0, 80)}` };
    }
    if (pruned && !JUDGED_AFTER_PARSING.has(envelope.type)) {
      return { ok: false, code: 'invalid_message', error: `${envelope.type}: nested deeper than ${maxDepth} levels` };
    }
    const parsed = schema.safeParse(raw);
    if (!parsed.success) {
      return { ok: false, code: 'invalid_message', error: `${envelope.type}: ${summarise(parsed.error)}` };
    }
    return { ok: true, msg: parsed.data };
  } catch (e) {
    // Belt and braces: parsing runs inside the broker's receive loop, which must never die.
    return { ok: false, code: 'invalid_message', error: `unparseable message: ${String(e)}` };
  }
}

function summarise(err: z.ZodError): string {
  return err.issues
    .slice(0, 5)
    .map((i) => `${i.path.length ? i.path.join('.') : '(root)'}: ${i.message}`)
    .join('; ');
}

/**
 * Decode and validate one frame sent by a worker. Never throws. Arrays and objects nested deeper
 * than MAX_FRAME_DEPTH are cut: in a `turn_result` or `rpc_request` each becomes the string
 * TOO_DEEP (src/base/json-safety.ts), which no stored value may hold, so the daemon refuses it where
 * it judges that field; any other message so deep is refused `invalid_message`.
 */
export function parseWorkerMessage(buf: Uint8Array): ParseResult<WorkerMessage> {
  return parseWith(buf, workerMessageSchema, WORKER_MESSAGE_TYPES, MAX_FRAME_DEPTH);
}

/** Decode and validate one frame sent by the daemon. Never throws. */
export function parseDaemonMessage(buf: Uint8Array): ParseResult<DaemonMessage> {
  return parseWith(buf, daemonMessageSchema, DAEMON_MESSAGE_TYPES);
}

/** A field whose value is JSON text made elsewhere (see `withRawField`); JSON.stringify skips symbols. */
const RAW_FIELD = Symbol('corral.rawField');

/**
 * `msg` with one more field, `name`, whose value is the JSON text `json`, copied into the frame as
 * is by `encodeFrame` (not parsed and encoded again). The text must be a valid JSON value of the
 * field's schema: it comes from a trusted producer (the database builds a turn's context), never
 * from a peer.
 */
export function withRawField<M extends WorkerMessage | DaemonMessage>(msg: M, name: string, json: string): M {
  if (name in msg) throw new Error(`the message already has a field ${name}`);
  return Object.assign(msg, { [RAW_FIELD]: { name, json } });
}

/**
 * A message as the JSON text of the one UTF-8 frame the protocol carries. Sockets take the text as is: zeromq.js encodes a
 * string to UTF-8 once and frees it on its own I/O thread, where a Buffer above 128 bytes is sent
 * zero-copy and handed back to the main thread to be released, one more event-loop wake-up per
 * message.
 */
export function encodeFrame(msg: WorkerMessage | DaemonMessage): string {
  const text = JSON.stringify(msg);
  const raw = (msg as { [RAW_FIELD]?: { name: string; json: string } })[RAW_FIELD];
  if (raw === undefined) return text;
  // an object's JSON always ends with its closing brace
  return `${text.slice(0, -1)},${JSON.stringify(raw.name)}:${raw.json}}`;
}

/** The UTF-8 size of a frame's text; measured only when it could pass `limit`. */
export function frameBytesAbove(text: string, limit: number): number | undefined {
  // UTF-8 takes at most 3 bytes per UTF-16 code unit
  if (text.length * 3 <= limit) return undefined;
  const bytes = Buffer.byteLength(text, 'utf8');
  return bytes > limit ? bytes : undefined;
}
