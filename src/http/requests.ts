/**
 * What a request may carry, as zod schemas, and the one way each is read: a failure becomes the
 * `CorralError` docs/http.md names for it (`invalid_actor_key`, `invalid_argument`), with a
 * message that says which part is wrong and what it should be.
 */
import { z } from 'zod';
import { ACTOR_PART, type ActorKey } from '../base/actor-key.ts';
import { MAX_IDEMPOTENCY_KEY_LENGTH } from '../db/views.ts';
import { CorralError, type ErrorCode } from '../base/errors.ts';
import { isUuid } from '../base/uuid.ts';

const ACTOR_PART_RULE = 'expected 1-128 characters of A-Z a-z 0-9 . _ : @ -';

export const ActorParams = z.object({
  agent_uid: z.string().regex(ACTOR_PART, ACTOR_PART_RULE),
  session_id: z.string().regex(ACTOR_PART, ACTOR_PART_RULE),
});

export const EventParams = z.object({
  id: z.string().refine(isUuid, 'expected a UUID (an event id, as a send returned it)'),
});

/** The longest `Last-Event-ID` taken: an id the stream gave is far shorter. */
export const MAX_LAST_EVENT_ID = 200;

/** The headers a route reads, each optional (Node has joined repeated ones with `, `). */
export const SendHeaders = z.object({
  'idempotency-key': z
    .string()
    .refine((s) => {
      const length = [...s].length;
      return length >= 1 && length <= MAX_IDEMPOTENCY_KEY_LENGTH;
    }, `expected 1-${MAX_IDEMPOTENCY_KEY_LENGTH} characters`)
    .optional(),
});

export const StreamHeaders = z.object({
  'last-event-id': z
    .string()
    .max(MAX_LAST_EVENT_ID, `expected at most ${MAX_LAST_EVENT_ID} characters`)
    .regex(/^[\x20-\x7e]*$/, 'expected printable ASCII')
    .optional(),
});

/** The event: any JSON value the parser produced. Its size and shape are the send's checks (the client's `toJsonPayload`). */
export const EventBody = z.unknown().refine((v) => v !== undefined, 'the request body is the event, as JSON');

/** `schema` applied to `input`; a failure is a `CorralError` of `code`, naming `what` and the field. */
export function parsed<T>(schema: z.ZodType<T>, input: unknown, code: ErrorCode, what: string): T {
  const r = schema.safeParse(input);
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  const field = issue.path.map(String).join('.');
  const value = field ? (input as Record<string, unknown> | null)?.[field] : undefined;
  const shown = typeof value === 'string' ? ` ${JSON.stringify(value.length > 80 ? `${value.slice(0, 80)}…` : value)}` : '';
  throw new CorralError(code, `invalid ${what}${field ? ` ${field}` : ''}${shown}: ${issue.message}`, {
    details: field ? { field } : {},
  });
}

export function actorOf(params: unknown): ActorKey {
  const p = parsed(ActorParams, params, 'invalid_actor_key', 'actor key part');
  return { agentUid: p.agent_uid, sessionId: p.session_id };
}
