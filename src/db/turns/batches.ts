/**
 * Batches: the events one turn takes under a batching input policy (`coalesce`, `interrupt`). The
 * claim (src/db/boss/fetch.ts) claims a key's head as always; for each head it claims,
 * `corral.actor_batch` names the events that go with it, and the begin step records them on the
 * turn and its delivery. One turn, many events, one fence:
 *
 *  B1 A batch is the head and the key's next queued, due events in the head order, contiguous:
 *     at most `max_events` in all, and their payloads (as JSON text) at most the byte budget, the
 *     smaller of the policy's `max_bytes` and what a turn_start may carry (half of
 *     CORRAL_MAX_MESSAGE_BYTES, the share one event has). The head is always taken. An event not
 *     due yet (a reminder) is left out, as the claim leaves it out.
 *  B2 The members stay `created` while the turn runs: `key_strict_fifo` holds the key for the head
 *     (`job_i8`), and the claim takes only a key's first queued job, so no other fetch can take
 *     one. The commit writes one `user` message per event, in order, and completes the head (its
 *     attempt fence) and every member (pg-boss's `complete` with `includeQueued`) in the fenced
 *     transaction that writes them.
 *  B3 A retry takes the batch its event's last attempt took (its turn's `coalesced`), less any
 *     member no longer queued, whatever the policy says now: an attempt is retried as it was.
 *     Only the first attempt of a head forms a batch, and an attempt after an interrupted one
 *     (B6): its batch is formed again, so the events that interrupted it join.
 *  B4 A batch whose head is dead-lettered sends every member to the dead-letter queue with it
 *     (src/runtime/attempt-failure.ts), in order, so a replay brings them back in order.
 *  B5 A debounce (`debounce_ms`, P4 of src/db/enqueue/input-policies.ts) holds an idle actor's events:
 *     a send to an actor with no turn running gives its event, and every event of the actor a
 *     debounce holds already, the start time `now + debounce` (at most `max_wait_ms` after the
 *     oldest held one), so the batch begins once they are all due together. The send notifies
 *     `DUE_CHANNEL` with the milliseconds to wait, so a daemon fetches then rather than at its
 *     next poll. A send to an actor whose turn runs is not held (it waits for the next turn), and
 *     releases what was held (due now), so no held event falls behind a later one. A change of
 *     an agent's or actor's policy releases its held events too (`corral.release_held`).
 *  B6 `interrupt` is `coalesce` whose batch also ends when an event comes: the daemon running the
 *     turn ends its attempt unspent (src/runtime/attempt-failure.ts `interrupt`: turn `interrupted`,
 *     job back to `created`), tells the worker `turn_cancel`, and the next turn takes the
 *     interrupted events and the new ones, in order. A turn already past its commit is not
 *     interrupted (the fence decides); with no daemon listening, the events wait as under coalesce.
 *
 * When neither the default nor any stored policy batches and the head is a first attempt, the
 * claim does not call the function: the turn path of `queue` pays one read of an empty table.
 */
import { BATCHING_POLICIES, DEFAULT_BATCH_EVENTS } from '../views.ts';
import { batchMembersStatement, debounceStatements, jobQueuedStatement } from '../boss/internals.ts';

export const ACTOR_BATCH_FUNCTION = 'corral.actor_batch';

/** One event of a batch after its head, as the turn records it and turn_start carries it. */
export interface BatchMember {
  event_id: string;
  data: unknown;
  enqueued_at: string;
}

const list = (values: readonly string[]) => `(${values.map((v) => `'${v}'`).join(', ')})`;

/** Whether a batching policy may apply (the claim's guard, as an SQL expression). */
export const BATCHING_POSSIBLE = `(corral.default_input_policy() in ${list(BATCHING_POLICIES)}
    or exists (select 1 from corral.input_policies p where p.policy in ${list(BATCHING_POLICIES)}))`;

/**
 * `CREATE OR REPLACE FUNCTION corral.actor_batch(queue, head, attempts, head_data, batching, cap)`:
 * the members that go with head job `head` (its `retry_count` `attempts`, its `data`) as a JSON
 * array of `BatchMember`, or null for a turn of one event. `batching`: whether a batching policy
 * may apply (else only B3 is looked at); `cap`: the byte budget of a turn_start's events.
 */
export function actorBatchFunctionSql(schema: string, table: string): string {
  const quote = '$corral_batch$';
  const members = batchMembersStatement(schema, table);
  const queued = jobQueuedStatement(schema, table, `(m.value->>'event_id')::uuid`);
  const text = `CREATE OR REPLACE FUNCTION ${ACTOR_BATCH_FUNCTION}(queue text, head uuid, attempts integer, head_data jsonb,
  batching boolean, cap integer)
RETURNS jsonb
LANGUAGE plpgsql STABLE SET enable_sort = off SET enable_seqscan = off SET enable_bitmapscan = off
AS ${quote}
DECLARE
  agent text := head_data->>'agentUid';
  session text := head_data->>'sessionId';
  key text := agent || '/' || session;
  recorded jsonb;
  last_status text;
  policy text;
  set_events integer;
  set_bytes integer;
  lim integer := ${DEFAULT_BATCH_EVENTS};
  budget bigint := cap;
  used bigint;
  taken jsonb := '[]';
  r record;
BEGIN
  IF attempts > 0 THEN
    -- B3: the batch of the event's last attempt (its latest turn), members still queued
    SELECT t.coalesced, t.status INTO recorded, last_status
      FROM corral.conversations cv JOIN corral.turns t ON t.conversation_id = cv.id
     WHERE cv.agent_uid = agent AND cv.session_id = session AND t.event_id = head
     ORDER BY t.started_at DESC
     LIMIT 1;
    -- an interrupted attempt is not retried as it was: its events go with the ones that came
    IF FOUND AND last_status <> 'interrupted' THEN
      IF recorded IS NULL THEN
        RETURN NULL;
      END IF;
      RETURN (SELECT jsonb_agg(m.value ORDER BY m.n) FROM jsonb_array_elements(recorded) WITH ORDINALITY AS m(value, n)
               WHERE EXISTS (${queued}));
    END IF;
  END IF;
  IF NOT batching THEN
    RETURN NULL;
  END IF;
  -- the actor's policy, else its agent's, else the deployment's
  SELECT p.policy, p.max_events, p.max_bytes INTO policy, set_events, set_bytes
    FROM corral.input_policies p
   WHERE p.agent_uid = agent AND p.session_id IN (session, '')
   ORDER BY p.session_id DESC
   LIMIT 1;
  IF NOT FOUND THEN
    policy := corral.default_input_policy();
  END IF;
  lim := coalesce(set_events, lim);
  budget := least(budget, coalesce(set_bytes, budget));
  IF policy NOT IN ${list(BATCHING_POLICIES)} OR lim <= 1 THEN
    RETURN NULL;
  END IF;
  -- B1: contiguous, in order, within the count and the byte budget
  used := octet_length((head_data->'payload')::text);
  lim := lim - 1;
  FOR r IN ${members} LOOP
    used := used + octet_length((r.data->'payload')::text);
    EXIT WHEN used > budget;
    taken := taken || jsonb_build_array(jsonb_build_object(
      'event_id', r.id, 'data', r.data->'payload', 'enqueued_at', r.data->>'enqueuedAt'));
  END LOOP;
  RETURN CASE WHEN jsonb_array_length(taken) = 0 THEN NULL ELSE taken END;
END
${quote};`;
  if (members.includes(quote) || queued.includes(quote)) throw new Error(`the batch statement holds ${quote}`);
  return text;
}

/** B5: where a debounced send says when its batch is due (payload: milliseconds from the send). */
export const DUE_CHANNEL = 'corral_due';

export const DEBOUNCE_FUNCTION = 'corral.debounce_due';
export const RELEASE_HELD_FUNCTION = 'corral.release_held';

/**
 * B5's two functions. `corral.debounce_due(queue, key, debounce_ms, max_wait_ms)`, for a send to
 * actor `key` (the caller holds the actor's advisory lock): null when its turn runs (the event is
 * not held, and what was held is due now), else the start time of the held events, those held
 * already moved to it. `corral.release_held(agent, session)`: the held events of `queue`'s agent
 * (`session` null) or actor made due now, for a change of policy; returns how many.
 */
export function debounceFunctionSql(schema: string, table: string, queue: string): string {
  const quote = '$corral_debounce$';
  const st = debounceStatements(schema, table);
  const now = st.now;
  return `CREATE OR REPLACE FUNCTION ${DEBOUNCE_FUNCTION}(queue text, key text, debounce_ms integer, max_wait_ms integer)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SET enable_sort = off SET enable_seqscan = off SET enable_bitmapscan = off
AS ${quote}
DECLARE
  first timestamptz;
  due timestamptz;
BEGIN
  PERFORM 1 FROM (${st.running}) r;
  IF FOUND THEN
    -- a turn runs: nothing is held, and what was held is due now, so it stays ahead of this event
    due := ${now};
    ${st.move};
    RETURN NULL;
  END IF;
  due := ${now} + debounce_ms * interval '1 millisecond';
  IF max_wait_ms IS NOT NULL THEN
    first := (${st.first});
    due := least(due, coalesce(first, ${now}) + max_wait_ms * interval '1 millisecond');
  END IF;
  ${st.move};
  RETURN due;
END
${quote};

CREATE OR REPLACE FUNCTION ${RELEASE_HELD_FUNCTION}(agent text, session text)
RETURNS integer
LANGUAGE plpgsql VOLATILE SET enable_sort = off SET enable_seqscan = off SET enable_bitmapscan = off
AS ${quote}
DECLARE
  queue text := '${queue.replaceAll("'", "''")}';
  due timestamptz := ${now};
  released integer;
BEGIN
  ${st.releaseOf}
  GET DIAGNOSTICS released = ROW_COUNT;
  RETURN released;
END
${quote};`;
}
