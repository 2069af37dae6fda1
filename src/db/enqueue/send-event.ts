/**
 * Enqueueing from SQL, for any language: `corral.send_event(agent_uid, session_id, data [,
 * idempotency_key [, traceparent [, tracestate]]])` returns the event id, `corral.send_events(events jsonb)` enqueues a batch
 * in one statement. The client's `send` and `sendMany` (src/client/) run them too, so there is
 * one enqueue: the same checks, ids, idempotency and job row whoever calls.
 *
 * What they guarantee, inside whatever transaction calls them:
 *  E1 the job is the one pg-boss's `send` writes (S11 of src/db/boss/internals.ts: pg-boss's own
 *     insert, NOTIFY included, so a daemon wakes at the commit), in the actor queue with the
 *     actor key as its singleton key and corral's event data `{ agentUid, sessionId, payload,
 *     enqueuedAt }`;
 *  E2 event ids are UUIDv7 made by `corral.next_event_id()` from PostgreSQL's clock, increasing
 *     within a transaction (a counter in the 12 bits after the millisecond), so events sent in one
 *     transaction keep their order (pg-boss breaks ties of one transaction by id, I4);
 *  E3 the event's checks are the client's: an actor key part of 1–128 of `A-Z a-z 0-9 . _ : @ -`,
 *     the payload at most CORRAL_MAX_EVENT_BYTES of JSON (as PostgreSQL prints it, without
 *     whitespace), nested at most MAX_JSON_DEPTH levels, no number JSON cannot keep (jsonb holds
 *     no NUL or lone surrogate at all);
 *  E4 an idempotency key (1–200 characters) is kept per actor and per caller with the event it
 *     enqueued and the SHA-256 of the data's jsonb text: sending again with it enqueues nothing
 *     and returns that event (`duplicate`), with other data it is refused (`idempotency_conflict`).
 *     The caller is the SQL role the sender logged in as, or the `idempotency_scope` corral's own
 *     role names for it (the HTTP API: `token:<name>`), so two callers never see each other's
 *     events through a key. Concurrent sends of one key wait for each other (the key's unique
 *     index); rolled back with the caller's transaction like the event.
 *  E5 an actor whose input policy is `reject` (src/db/enqueue/input-policies.ts, P1–P3) takes its event
 *     only when it is idle: the send locks the actor's key for the transaction and refuses
 *     (`actor_busy`) while a job of it is unfinished (`corral.actor_busy`) or an earlier event of
 *     the same call went to it. A repeated idempotency key still answers `duplicate` (E4 first).
 *  E6 an actor whose policy has a debounce (`coalesce`) holds its event while no turn of it runs
 *     (B5 of src/db/turns/batches.ts: the event and those held already start together, later).
 *  E7 an event to an actor whose policy is `interrupt` commits a control notification naming it:
 *     the daemon running the actor's turn, if any, interrupts that turn, and the next one takes
 *     the interrupted events with this one.
 *
 *  E8 least privilege: the two entry points run as their owner, and only the role
 *     `corral_producer` may call them (`PRODUCER_GRANTS`): a producer needs no right on any table.
 *
 *  E9 an event may carry its sender's W3C trace context (`traceparent`, optionally `tracestate`;
 *     src/base/trace-context.ts has the same rules): a malformed one is refused, a valid one is
 *     kept in the job's data as `trace` (version 00) and travels in the turn's `turn_start`.
 *  E10 on a shard of a deployment of N > 1 shards (src/base/shard-map.ts), an event to an actor of
 *     another shard is refused `wrong_shard`, naming the actor's shard: nothing is written. With one
 *     shard the check is not in the function at all.
 *
 * Errors carry SQLSTATEs of their own (`SEND_ERRORS`), mapped to corral's error codes by
 * `sendError`. The functions are generated (`sendEventFunctionsSql`) and installed when the
 * queues are set up (`installSendEvent`: daemon start, `corral db migrate`), since they embed
 * pg-boss's insert for the queue's table and the configured limit.
 */
import { createHash } from 'node:crypto';
import { readShardIdentity } from '../shards/catalog.ts';
import { ACTOR_PART } from '../../base/actor-key.ts';
import { MAX_TRACESTATE_LENGTH, TRACEPARENT_PATTERN, TRACESTATE_PATTERN } from '../../base/trace-context.ts';

import { MAX_JSON_DEPTH } from '../../base/json-safety.ts';
import {
  EVENT_JOBS_INSERT_FUNCTION,
  eventJobsInsertFunction,
  insertTargetOf,
  sendPayloadSql,
  type BossSqlRunner,
  type InsertTarget,
} from '../boss/internals.ts';
import { DEBOUNCE_FUNCTION, debounceFunctionSql, DUE_CHANNEL } from '../turns/batches.ts';
import { CONTROL_CHANNEL } from '../turns/control.ts';
import { AVAILABLE_INPUT_POLICIES, MAX_IDEMPOTENCY_KEY_LENGTH, MAX_SEND_BATCH, SEND_ERRORS, type InputPolicy } from '../views.ts';

export { MAX_IDEMPOTENCY_KEY_LENGTH, MAX_SEND_BATCH, SEND_ERRORS };
export { sendEvents, sendError, type EventToSend, type SentEvent } from './send.ts';

export interface SendEventSettings {
  bossSchema: string;
  queueName: string;
  /** CORRAL_MAX_EVENT_BYTES. */
  maxEventBytes: number;
  /** CORRAL_INPUT_POLICY: the policy of actors and agents without one of their own (P1 of src/db/enqueue/input-policies.ts). */
  inputPolicy: InputPolicy;
  /** E10: which shard of how many the functions' schema is (absent: shard 0 of 1). */
  shard?: { shard: number; shardCount: number } | undefined;
}

/** The largest number JSON (a double) keeps. */
const MAX_DOUBLE = '1.7976931348623157e308';
/** A payload shorter than this (as jsonb text) cannot be nested too deep: 101 levels take 202 characters. */
const DEPTH_CHECK_FROM = 2 * (MAX_JSON_DEPTH + 1);
/** Nor hold a number beyond a double: jsonb prints numbers in full, 309 digits and more. */
const NUMBER_CHECK_FROM = 309;

const DEPTH_PATH = `strict $.**{${MAX_JSON_DEPTH} to last} ? (@.type() == "object" || @.type() == "array")`;
const NUMBER_PATH = `strict $.** ? (@.type() == "number" && (@ > ${MAX_DOUBLE} || @ < -${MAX_DOUBLE}))`;

const lit = (s: string) => `'${s.replaceAll("'", "''")}'`;

/** E2: `corral.next_event_id()`. */
const NEXT_EVENT_ID = `CREATE OR REPLACE FUNCTION corral.next_event_id() RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $corral_id$
DECLARE
  now_ms bigint := floor(extract(epoch from clock_timestamp()) * 1000)::bigint;
  last text := current_setting('corral.last_event_id', true);
  last_ms bigint;
  seq integer;
  r text := replace(gen_random_uuid()::text, '-', '');
BEGIN
  IF last IS NOT NULL AND last <> '' THEN
    last_ms := split_part(last, ':', 1)::bigint;
    seq := split_part(last, ':', 2)::integer;
  END IF;
  IF last_ms IS NULL OR now_ms > last_ms THEN
    -- a new millisecond: the counter starts at random in its lower half (room to count up)
    seq := floor(random() * 2048)::integer;
  ELSE
    now_ms := last_ms;
    seq := seq + 1;
    IF seq > 4095 THEN
      now_ms := now_ms + 1;
      seq := 0;
    END IF;
  END IF;
  PERFORM set_config('corral.last_event_id', now_ms::text || ':' || seq::text, true);
  -- 48 bits of milliseconds, version 7, the 12-bit counter, then gen_random_uuid's variant and random bits
  RETURN (lpad(to_hex(now_ms), 12, '0') || '7' || lpad(to_hex(seq), 3, '0') || substr(r, 17, 16))::uuid;
END
$corral_id$;`;

/** Arbitrary, stable: "busy" in ASCII; with the key's hash, E5's lock. */
const BUSY_LOCK_CLASS = 0x62757379;

/**
 * E5: `corral.actor_busy(key)`, whether the actor queue holds an unfinished job of the key: a
 * queued one (its head, through pg-boss's `job_i10`: the order asked for is that index's, and no
 * plan may sort, so whatever the statistics say no other index serves it), or one active, waiting
 * to retry or failed (`job_i8`, which holds at most one per key).
 */
function actorBusyFunctionSql(schema: string, table: string, queue: string): string {
  const job = `${schema}.${table}`;
  return `CREATE OR REPLACE FUNCTION corral.actor_busy(key text) RETURNS boolean
LANGUAGE plpgsql STABLE SET enable_sort = off SET enable_seqscan = off SET enable_bitmapscan = off
AS $corral_busy$
BEGIN
  PERFORM 1 FROM ${job} j
   WHERE j.name = ${lit(queue)} AND j.singleton_key = key
     AND j.state < 'active' AND NOT j.blocked AND j.policy = 'key_strict_fifo'
   ORDER BY j.state DESC, j.created_on, j.id
   LIMIT 1;
  IF FOUND THEN
    RETURN true;
  END IF;
  PERFORM 1 FROM ${job} j
   WHERE j.name = ${lit(queue)} AND j.singleton_key = key
     AND j.state IN ('active', 'retry', 'failed') AND j.policy = 'key_strict_fifo';
  RETURN FOUND;
END
$corral_busy$;`;
}

/** E10: the check of the actor's shard, or nothing with one shard. */
function shardCheckSql(shard: SendEventSettings['shard']): string {
  if (!shard || shard.shardCount <= 1) return '';
  const { shard: k, shardCount: n } = shard;
  return `
    IF corral.shard_of(agent, session, ${n}) <> ${k} THEN
      RAISE EXCEPTION USING ERRCODE = 'CR421', MESSAGE = at || format('the actor %s belongs to shard %s of ${n}, not to this one (shard ${k}): send it to that shard''s database', actor, corral.shard_of(agent, session, ${n}));
    END IF;`;
}

/** The functions' text for `s`, with S11's insert for the queue's `target`. */
export async function sendEventFunctionsSql(s: SendEventSettings, target: InsertTarget): Promise<string> {
  const insert = await eventJobsInsertFunction(s.bossSchema, s.queueName, target);
  const max = s.maxEventBytes;
  const enqueuedAt = `to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`;
  const payload = sendPayloadSql(s.queueName, {
    id: 'new_id',
    data: `jsonb_build_object('agentUid', agent, 'sessionId', session, 'payload', data, 'enqueuedAt', ${enqueuedAt}) || trace_data`,
    singletonKey: 'actor',
  });
  const fail = (code: string, message: string) => `RAISE EXCEPTION USING ERRCODE = '${code}', MESSAGE = ${message};`;
  if (!(AVAILABLE_INPUT_POLICIES as readonly string[]).includes(s.inputPolicy)) throw new Error(`an input policy, not ${s.inputPolicy}`);
  const actorBusy = actorBusyFunctionSql(s.bossSchema, target.table, s.queueName);
  const sendEvents = `CREATE OR REPLACE FUNCTION corral.send_events(events jsonb)
RETURNS TABLE (ord integer, event_id uuid, duplicate boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $corral_send$
DECLARE
  e jsonb;
  i bigint;
  at text := '';
  agent text;
  session text;
  actor text;
  idem text;
  -- E4: whose key it is; E8: only corral's own role (the schema's owner) names another caller
  who text;
  trusted boolean := pg_has_role(session_user, (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'corral'), 'MEMBER');
  data jsonb;
  text_bytes bigint;
  bytes bigint;
  digest text;
  new_id uuid;
  found_id uuid;
  found_digest text;
  jobs jsonb[] := '{}';
  fresh integer := 0;
  inserted integer;
  -- E5: whether any policy is set (else every actor has the default), and the keys sent to so far
  policies boolean := EXISTS (SELECT 1 FROM corral.input_policies);
  policy text;
  debounce integer;
  max_wait integer;
  due timestamptz;
  sent text[] := '{}';
  -- E9: the caller's trace context, kept with the event's job
  tp text;
  ts text;
  trace_data jsonb;
BEGIN
  IF events IS NULL OR jsonb_typeof(events) <> 'array' THEN
    ${fail('CR400', lit('corral.send_events: events must be a JSON array'))}
  END IF;
  IF jsonb_array_length(events) > ${MAX_SEND_BATCH} THEN
    ${fail('CR400', `format('corral.send_events: %s events; at most ${MAX_SEND_BATCH} in one call', jsonb_array_length(events))`)}
  END IF;
  FOR e, i IN SELECT x.value, x.n FROM jsonb_array_elements(events) WITH ORDINALITY AS x(value, n) ORDER BY x.n LOOP
    -- which event a refusal is about, in a batch
    IF jsonb_array_length(events) > 1 THEN
      at := format('event %s: ', i);
    END IF;
    IF jsonb_typeof(e) <> 'object' OR NOT e ? 'data' THEN
      ${fail('CR400', `at || format('an event payload is required (its "data")')`)}
    END IF;
    agent := CASE WHEN jsonb_typeof(e->'agent_uid') = 'string' THEN e->>'agent_uid' END;
    session := CASE WHEN jsonb_typeof(e->'session_id') = 'string' THEN e->>'session_id' END;
    IF agent IS NULL OR agent !~ ${lit(ACTOR_PART.source)} THEN
      ${fail('CR401', `at || format('invalid agent_uid %s: expected 1-128 characters of A-Z a-z 0-9 . _ : @ -', coalesce(to_json(agent)::text, 'null'))`)}
    END IF;
    IF session IS NULL OR session !~ ${lit(ACTOR_PART.source)} THEN
      ${fail('CR401', `at || format('invalid session_id %s: expected 1-128 characters of A-Z a-z 0-9 . _ : @ -', coalesce(to_json(session)::text, 'null'))`)}
    END IF;
    actor := agent || '/' || session;${shardCheckSql(s.shard)}
    idem := NULL;
    IF e ? 'idempotency_key' AND jsonb_typeof(e->'idempotency_key') <> 'null' THEN
      IF jsonb_typeof(e->'idempotency_key') <> 'string'
         OR char_length(e->>'idempotency_key') NOT BETWEEN 1 AND ${MAX_IDEMPOTENCY_KEY_LENGTH} THEN
        ${fail('CR400', `at || format('an idempotency key is a string of 1-${MAX_IDEMPOTENCY_KEY_LENGTH} characters')`)}
      END IF;
      idem := e->>'idempotency_key';
    END IF;
    who := session_user;
    IF e ? 'idempotency_scope' AND jsonb_typeof(e->'idempotency_scope') <> 'null' THEN
      IF NOT trusted THEN
        ${fail('CR403', `at || format('only corral''s own role may set an idempotency scope (the caller %s''s keys are its own)', session_user)`)}
      END IF;
      IF jsonb_typeof(e->'idempotency_scope') <> 'string'
         OR char_length(e->>'idempotency_scope') NOT BETWEEN 1 AND ${MAX_IDEMPOTENCY_KEY_LENGTH} THEN
        ${fail('CR400', `at || format('an idempotency scope is a string of 1-${MAX_IDEMPOTENCY_KEY_LENGTH} characters')`)}
      END IF;
      who := e->>'idempotency_scope';
    END IF;
    trace_data := '{}';
    IF e ? 'traceparent' AND jsonb_typeof(e->'traceparent') <> 'null' THEN
      tp := CASE WHEN jsonb_typeof(e->'traceparent') = 'string' THEN e->>'traceparent' END;
      IF tp IS NULL OR char_length(tp) > 256 OR tp !~ ${lit(TRACEPARENT_PATTERN.source)} OR left(tp, 2) = 'ff'
         OR (left(tp, 2) = '00' AND char_length(tp) <> 55)
         OR substr(tp, 4, 32) = repeat('0', 32) OR substr(tp, 37, 16) = repeat('0', 16) THEN
        ${fail('CR400', `at || format('not a W3C traceparent (version-traceid-parentid-flags in lower-case hex): %s', coalesce(to_json(tp)::text, (e->'traceparent')::text))`)}
      END IF;
      ts := NULL;
      IF e ? 'tracestate' AND jsonb_typeof(e->'tracestate') <> 'null' THEN
        ts := CASE WHEN jsonb_typeof(e->'tracestate') = 'string' THEN e->>'tracestate' END;
        IF ts IS NULL OR char_length(ts) > ${MAX_TRACESTATE_LENGTH} OR ts !~ ${lit(TRACESTATE_PATTERN.source)} THEN
          ${fail('CR400', `at || format('a tracestate is a string of at most ${MAX_TRACESTATE_LENGTH} printable ASCII characters')`)}
        END IF;
      END IF;
      -- stored as version 00: a later version keeps its first four fields
      trace_data := jsonb_build_object('trace', jsonb_strip_nulls(jsonb_build_object(
        'traceparent', '00-' || substr(tp, 4, 52), 'tracestate', nullif(ts, ''))));
    END IF;
    data := e->'data';
    -- E3: as JSON without whitespace (jsonb prints a space after each ':' and ',' between members)
    text_bytes := octet_length(data::text);
    bytes := text_bytes;
    IF bytes > ${max} THEN
      bytes := bytes - (SELECT coalesce(sum(CASE jsonb_typeof(v)
                                   WHEN 'object' THEN greatest(2 * (SELECT count(*) FROM jsonb_object_keys(v)) - 1, 0)
                                   WHEN 'array' THEN greatest(jsonb_array_length(v) - 1, 0)
                                   ELSE 0 END), 0)
                          FROM jsonb_path_query(data, 'strict $.**') AS v);
      IF bytes > ${max} THEN
        RAISE EXCEPTION USING ERRCODE = 'CR413',
          MESSAGE = at || format('the event payload is %s bytes; the limit is ${max} (CORRAL_MAX_EVENT_BYTES)', bytes);
      END IF;
    END IF;
    IF text_bytes >= ${DEPTH_CHECK_FROM} AND jsonb_path_exists(data, ${lit(DEPTH_PATH)}) THEN
      ${fail('CR400', `at || format('the event payload cannot be stored: nested deeper than ${MAX_JSON_DEPTH} levels of arrays and objects (the limit)')`)}
    END IF;
    IF text_bytes >= ${NUMBER_CHECK_FROM} AND jsonb_path_exists(data, ${lit(NUMBER_PATH)}) THEN
      ${fail('CR400', `at || format('the event payload cannot be stored: a number out of range for JSON')`)}
    END IF;
    new_id := corral.next_event_id();
    IF idem IS NOT NULL THEN
      -- E4: a concurrent send of the key waits here for the other's transaction
      digest := encode(sha256(convert_to(data::text, 'UTF8')), 'hex');
      INSERT INTO corral.idempotency_keys (agent_uid, session_id, caller, key, event_id, data_sha256)
      VALUES (agent, session, who, idem, new_id, digest)
      ON CONFLICT DO NOTHING;
      IF NOT FOUND THEN
        SELECT k.event_id, k.data_sha256 INTO found_id, found_digest
          FROM corral.idempotency_keys k
         WHERE k.agent_uid = agent AND k.session_id = session AND k.caller = who AND k.key = idem;
        IF found_digest IS DISTINCT FROM digest THEN
          RAISE EXCEPTION USING ERRCODE = 'CR409',
            MESSAGE = at || format('idempotency key %s of %s/%s was used for event %s with other data', to_json(idem)::text, agent, session, found_id);
        END IF;
        ord := i;
        event_id := found_id;
        duplicate := true;
        RETURN NEXT;
        CONTINUE;
      END IF;
    END IF;
    policy := ${lit(s.inputPolicy)};
    debounce := NULL;
    IF policies THEN
      SELECT p.policy, p.debounce_ms, p.max_wait_ms INTO policy, debounce, max_wait
        FROM corral.input_policies p
       WHERE p.agent_uid = agent AND p.session_id IN (session, '')
       ORDER BY p.session_id DESC LIMIT 1;
      IF NOT FOUND THEN
        policy := ${lit(s.inputPolicy)};
      END IF;
    END IF;
    -- E6: a debounce holds an idle actor's events (B5 of src/db/turns/batches.ts)
    due := NULL;
    IF debounce IS NOT NULL THEN
      PERFORM pg_advisory_xact_lock(${BUSY_LOCK_CLASS}, hashtext(actor));
      due := ${DEBOUNCE_FUNCTION}(${lit(s.queueName)}, actor, debounce, max_wait);
    END IF;
    IF policy = 'reject' THEN
      PERFORM pg_advisory_xact_lock(${BUSY_LOCK_CLASS}, hashtext(actor));
      IF actor = ANY (sent) OR corral.actor_busy(actor) THEN
        RAISE EXCEPTION USING ERRCODE = 'CR423',
          MESSAGE = at || format('actor %s/%s is busy (a turn runs or events wait) and its input policy is reject: nothing was enqueued', agent, session);
      END IF;
    END IF;
    IF ${s.inputPolicy === 'reject' ? 'true' : 'policies'} THEN
      sent := array_append(sent, actor);
    END IF;
    IF policy = 'interrupt' THEN
      -- E7: the daemon running the actor's turn interrupts it (src/db/turns/control.ts)
      PERFORM pg_notify(${lit(CONTROL_CHANNEL)},
        json_build_object('kind', 'interrupt', 'agentUid', agent, 'sessionId', session, 'eventId', new_id)::text);
    END IF;
    IF due IS NULL THEN
      jobs := array_append(jobs, ${payload});
    ELSE
      jobs := array_append(jobs, jsonb_set(${payload}, '{data,debounced}', 'true')
                                 || jsonb_build_object('startAfter', to_char(due AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')));
      PERFORM pg_notify(${lit(DUE_CHANNEL)}, ceil(extract(epoch from due - clock_timestamp()) * 1000)::bigint::text);
    END IF;
    fresh := fresh + 1;
    ord := i;
    event_id := new_id;
    duplicate := false;
    RETURN NEXT;
  END LOOP;
  IF fresh > 0 THEN
    SELECT count(*) INTO inserted FROM ${EVENT_JOBS_INSERT_FUNCTION}(array_to_json(jobs)::text);
    IF inserted <> fresh THEN
      RAISE EXCEPTION 'corral.send_events: pg-boss inserted % of % jobs', inserted, fresh;
    END IF;
  END IF;
  RETURN;
END
$corral_send$;`;
  const sendEvent = `DROP FUNCTION IF EXISTS corral.send_event(text, text, jsonb, text);
CREATE OR REPLACE FUNCTION corral.send_event(agent_uid text, session_id text, data jsonb, idempotency_key text DEFAULT NULL,
                                             traceparent text DEFAULT NULL, tracestate text DEFAULT NULL)
RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $corral_send_one$
BEGIN
  IF data IS NULL THEN
    ${fail('CR400', lit("an event payload is required (data is NULL; the JSON null is 'null'::jsonb)"))}
  END IF;
  RETURN (SELECT s.event_id FROM corral.send_events(jsonb_build_array(jsonb_build_object(
    'agent_uid', agent_uid, 'session_id', session_id, 'data', data, 'idempotency_key', idempotency_key,
    'traceparent', traceparent, 'tracestate', tracestate))) s);
END
$corral_send_one$;`;
  const defaultPolicy = `CREATE OR REPLACE FUNCTION corral.default_input_policy() RETURNS text
LANGUAGE sql IMMUTABLE AS $corral_policy$ SELECT ${lit(s.inputPolicy)}::text $corral_policy$;`;
  const debounceDue = debounceFunctionSql(s.bossSchema, target.table, s.queueName);
  return [insert, NEXT_EVENT_ID, actorBusy, debounceDue, defaultPolicy, sendEvents, sendEvent].join('\n\n');
}

/**
 * E8: producers call the enqueue and nothing else. No role gets it by default (PUBLIC may not run
 * it); the role `corral_producer` (made by migration 0016, where the migrating role may make
 * roles) may, and only it: `GRANT corral_producer TO app_user` lets an application send without
 * any right on pg-boss's tables. The functions run as their owner (SECURITY DEFINER, with a
 * search path of pg_catalog alone, so no object of the caller's can stand in for one of theirs).
 */
const PRODUCER_GRANTS = `DO $corral_grants$
DECLARE
  f regprocedure;
  producer boolean := EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'corral_producer');
BEGIN
  -- only what is missing: a GRANT or REVOKE rewrites the function's row even when it changes
  -- nothing, and an unchanged install writes nothing (S11)
  FOREACH f IN ARRAY ARRAY['corral.send_events(jsonb)'::regprocedure, 'corral.send_event(text, text, jsonb, text, text, text)'::regprocedure] LOOP
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
                WHERE p.oid = f AND a.grantee = 0 AND a.privilege_type = 'EXECUTE') THEN
      EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END IF;
    IF producer AND NOT pg_catalog.has_function_privilege('corral_producer', f, 'EXECUTE') THEN
      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO corral_producer', f);
    END IF;
  END LOOP;
  IF producer AND NOT pg_catalog.has_schema_privilege('corral_producer', 'corral', 'USAGE') THEN
    GRANT USAGE ON SCHEMA corral TO corral_producer;
  END IF;
END $corral_grants$;`;

/** The comment that names the generated text's digest (so an unchanged one is not replaced). */
const MARK = 'corral generated ';

/**
 * Installs (or replaces) the functions for `s`, unless the ones installed were made from the same
 * text. Returns false, installing nothing, when the queue does not exist yet (pg-boss creates it
 * with the daemon's queues).
 */
export async function installSendEvent(db: BossSqlRunner, s: SendEventSettings): Promise<boolean> {
  const target = await insertTargetOf(db, s.bossSchema, s.queueName);
  if (!target) return false;
  const text = await sendEventFunctionsSql({ ...s, shard: s.shard ?? (await readShardIdentity((text) => db.executeSql(text))) }, target);
  const digest = createHash('sha256').update(text).digest('hex').slice(0, 32);
  const current = await db.executeSql(`select obj_description(to_regprocedure('corral.send_events(jsonb)'), 'pg_proc') as mark`);
  const installed = (current.rows[0] as { mark?: string | null } | undefined)?.mark === `${MARK}${digest}`;
  // one simple query: one implicit transaction, serialised between daemons starting together;
  // the grants every time (E8): `corral_producer` may have been made since the functions were
  await db.executeSql(
    [
      `select pg_advisory_xact_lock(${SEND_INSTALL_LOCK_KEY})`,
      ...(installed ? [] : [text, `COMMENT ON FUNCTION corral.send_events(jsonb) IS ${lit(MARK + digest)}`]),
      PRODUCER_GRANTS,
    ].join(';\n'),
  );
  return true;
}

/** Arbitrary, stable: "send" in ASCII. */
const SEND_INSTALL_LOCK_KEY = 0x73656e64;
