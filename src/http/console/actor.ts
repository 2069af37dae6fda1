/** One actor's page: transcript (newest first), live turn, queued events, policy, deliveries, and its actions. */
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { formatActorKey, type ActorKey } from '../../base/actor-key.ts';
import { CorralError } from '../../base/errors.ts';
import { transcriptPage } from '../../db/operations/console-pages.ts';
import { AVAILABLE_INPUT_POLICIES, parseBatchOptions, setPolicy, clearPolicy, type InputPolicy } from '../../ops/input-policies.ts';
import { errorLine } from '../../ops/dead-letters.ts';
import { actorStatus } from '../../ops/status.ts';
import { describeDelivery } from '../../outbox/operations.ts';
import { actorOf, StreamHeaders, parsed } from '../requests.ts';
import { principalOf } from './auth.ts';
import { acted, logAction, respond, type ConsoleDeps } from './context.ts';
import { markup, query, seg, shown, when } from './html.ts';
import { csrfForm, pager, stateBadge } from './layout.ts';
import { check, fieldsOf, PageSize, type Guard } from './forms.ts';

const ActorPageQuery = z.object({
  before: z.coerce
    .number()
    .int()
    .min(1)
    .max(2 ** 31 - 1)
    .optional(),
  limit: PageSize,
  notice: z.string().optional(),
  sig: z.string().optional(),
});

/** A JSON text from a form's textarea, at most `max` characters. */
const JsonText = (max: number) =>
  z
    .string()
    .max(max, `expected at most ${max} characters`)
    .transform((text, ctx) => {
      try {
        return JSON.parse(text) as unknown;
      } catch (e) {
        ctx.addIssue({ code: 'custom', message: `not JSON: ${(e as Error).message}` });
        return z.NEVER;
      }
    });

const DURATION = z.string().max(20).optional();

const PolicyBody = z.object({
  policy: z.enum(AVAILABLE_INPUT_POLICIES),
  scope: z.enum(['actor', 'agent']).default('actor'),
  debounce: DURATION,
  maxWait: DURATION,
  maxEvents: z.string().max(12).optional(),
});

const actorPath = (key: ActorKey) => `/console/actors/${seg(key.agentUid)}/${seg(key.sessionId)}`;

const blank = (s: string | undefined) => (s === undefined || s.trim() === '' ? undefined : s.trim());

export function registerActorRoutes(app: FastifyInstance, deps: ConsoleDeps, guard: Guard): void {
  const maxEventChars = 1024 * 1024;

  app.get('/console/actors/:agent_uid/:session_id', { onRequest: guard }, async (req, reply) => {
    const key = actorOf(req.params);
    const q = check(ActorPageQuery, req.query, 'query');
    const [status, messages] = await Promise.all([
      actorStatus(deps.db, deps.queues, key, { turns: 10, pending: 50, deadLetters: 20 }),
      transcriptPage(deps.db, key, { beforeSeq: q.before, limit: q.limit + 1 }),
    ]);
    const more = messages.length > q.limit;
    const list = messages.slice(0, q.limit);
    const here = actorPath(key);
    const next = more ? `${here}${query({ before: list.at(-1)!.seq })}` : undefined;
    // a warm activation between turns holds no event: the actor is idle
    const live =
      status.activation && ['starting', 'active', 'draining'].includes(status.activation.status) && status.activation.currentEventId
        ? status.activation
        : null;
    const state = live ? 'running' : status.blockedByEventId ? 'blocked' : status.deadLetters.length > 0 ? 'dead_lettered' : 'idle';
    const policy = status.inputPolicy;
    return respond(req, reply, {
      title: formatActorKey(key),
      here: '/console/actors',
      json: { ...status, state, transcript: list, next: next ?? null },
      body: (viewer) => markup`<h1>${key.agentUid} / ${key.sessionId} ${stateBadge(state)}</h1>
<p class="muted">epoch ${status.epochCounter}${live ? markup`, turn in flight: event <code>${live.currentEventId ?? '-'}</code> (activation ${live.status}, revision ${live.revision})` : ''}${
        status.blockedByEventId ? markup`, <strong>blocked</strong> by the dead-lettered event <code>${status.blockedByEventId}</code>` : ''
      }</p>
<div class="live" id="live" data-stream="${here}/stream" data-state="connecting"><div class="muted">Live turn: <span id="live-state">connecting</span></div><pre id="live-text"></pre></div>
<div class="actions">
${csrfForm(`${here}/send`, viewer, { cls: 'panel', id: 'send-form' })}<label>Send an event (JSON)<textarea name="event" id="send-event" maxlength="${maxEventChars}" required>{"text": ""}</textarea></label><button id="send-button">Send</button></form>
${csrfForm(`${here}/steer`, viewer, { cls: 'panel', id: 'steer-form' })}<label>Steer the turn in flight (JSON)<textarea name="input" id="steer-input" maxlength="8000" required>{"text": ""}</textarea></label><button id="steer-button"${live ? '' : markup` disabled`}>Steer</button></form>
${csrfForm(`${here}/cancel`, viewer, { cls: 'panel', id: 'cancel-form', confirm: 'Cancel the turn in flight? Its event is completed as cancelled.' })}<label>Cancel the turn in flight: reason<input name="reason" maxlength="500" value="cancelled from the console"></label><button class="danger" id="cancel-button"${live ? '' : markup` disabled`}>Cancel turn</button></form>
${csrfForm(`${here}/policy`, viewer, { cls: 'panel', id: 'policy-form' })}<label>Input policy (now ${policy.policy}, from ${policy.from})<select name="policy" id="policy-select">${AVAILABLE_INPUT_POLICIES.map(
        (p) => markup`<option value="${p}" ${p === policy.policy ? markup` selected` : ''}>${p}</option>`,
      )}</select></label><label>For<select name="scope"><option value="actor">this actor</option><option value="agent">every session of ${key.agentUid}</option></select></label><label>Debounce (coalesce, interrupt: 300ms, 2s)<input name="debounce" maxlength="20"></label><button id="policy-button">Set policy</button></form>
</div>
${policy.from === 'actor' ? markup`${csrfForm(`${here}/policy/clear`, viewer)}<button class="quiet" id="policy-clear">Clear this actor's own policy</button></form>` : ''}
${
  status.deadLetters.length > 0
    ? markup`<h2>Dead letters</h2>
        <table id="actor-dead-letters">
          <tbody>
            ${status.deadLetters.map(
              (d) =>
                markup`<tr><td><a href="/console/dead-letters/${d.id}">${d.id}</a></td><td>${errorLine(d.lastError)}</td><td>${d.attempts} attempts</td><td>${csrfForm('/console/dead-letters/act', viewer)}<input type="hidden" name="ids" value="${d.id}"><input type="hidden" name="back" value="${here}"><button name="action" value="replay">Replay${d.eventId === status.blockedByEventId ? ' (unblocks)' : ''}</button> <button name="action" value="discard" class="danger">Discard${d.eventId === status.blockedByEventId ? ' (unblocks)' : ''}</button></form></td></tr>`,
            )}
          </tbody>
        </table>`
    : ''
}
<h2>Pending events, waiting or in flight (${status.pendingEvents.length})</h2>
<table id="queued"><thead><tr><th>Event</th><th>State</th><th>Enqueued</th><th>Payload</th></tr></thead><tbody>${status.pendingEvents.map(
        (p) =>
          markup`<tr>
            <td class="mono">${p.id}</td>
            <td>${stateBadge(p.state)}</td>
            <td>${when(p.createdOn)}</td>
            <td><pre>${shown(p.payload, 400)}</pre></td>
          </tr>`,
      )}${
        status.pendingEvents.length === 0
          ? markup`<tr>
              <td colspan="4" class="muted">None.</td>
            </tr>`
          : ''
      }</tbody></table>
<h2>Recent turns and deliveries</h2>
<table id="turns"><thead><tr><th>Started</th><th>Event</th><th>Status</th><th>Attempt</th><th>Worker</th><th>Delivered</th></tr></thead><tbody>${status.recentTurns.map(
        (t) =>
          markup`<tr>
            <td>${when(t.startedAt)}</td>
            <td class="mono">${t.eventId}</td>
            <td>${stateBadge(t.status)}${t.error ? markup` <span class="muted">${errorLine(t.error)}</span>` : ''}</td>
            <td>${t.attempt}</td>
            <td>${t.workerId ?? '-'}</td>
            <td>${t.delivered.map((d) => markup`<div>${describeDelivery(d)}</div>`)}</td>
          </tr>`,
      )}${
        status.recentTurns.length === 0
          ? markup`<tr>
              <td colspan="6" class="muted">None.</td>
            </tr>`
          : ''
      }</tbody></table>
<h2>Transcript (newest first)</h2>
<table id="transcript"><thead><tr><th>#</th><th>Role</th><th>Content</th><th>Turn</th><th>At</th></tr></thead><tbody>${list.map(
        (m) =>
          markup`<tr class="msg-${m.role}">
            <td>${m.seq}</td>
            <td>${m.role}</td>
            <td><pre>${shown(m.content)}</pre></td>
            <td>${stateBadge(m.turnStatus)} <span class="muted mono">${m.eventId}</span></td>
            <td>${when(m.createdAt)}</td>
          </tr>`,
      )}${
        list.length === 0
          ? markup`<tr>
              <td colspan="5" class="muted">No message yet.</td>
            </tr>`
          : ''
      }</tbody></table>
${pager(next, q.before ? here : undefined)}`,
    });
  });

  // the same stream as GET /v1/actors/.../stream, for the page's EventSource (its cookie is /console's)
  app.get('/console/actors/:agent_uid/:session_id/stream', { onRequest: guard }, async (req, reply) => {
    const actor = actorOf(req.params);
    const headers = parsed(StreamHeaders, req.headers, 'invalid_argument', 'header');
    const p = principalOf(req);
    await deps.streams.serve(req, reply, {
      live: deps.live,
      actor,
      lastEventId: headers['last-event-id'],
      token: p.tokenName,
      expiresAt: p.expiresAt,
    });
  });

  app.post('/console/actors/:agent_uid/:session_id/send', { onRequest: guard }, async (req, reply) => {
    const key = actorOf(req.params);
    const f = check(z.object({ event: JsonText(maxEventChars) }), fieldsOf(req), 'form');
    const sent = await deps.corral.send(key, f.event);
    logAction(deps, req, 'actor.send', { actor: formatActorKey(key), eventId: sent.eventId });
    return acted(req, reply, actorPath(key), `Sent event ${sent.eventId}.`, { eventId: sent.eventId, duplicate: sent.duplicate });
  });

  app.post('/console/actors/:agent_uid/:session_id/steer', { onRequest: guard }, async (req, reply) => {
    const key = actorOf(req.params);
    const f = check(z.object({ input: JsonText(8_000) }), fieldsOf(req), 'form');
    const r = await deps.corral.steer(key, f.input);
    logAction(deps, req, 'actor.steer', { actor: formatActorKey(key), eventId: r.eventId });
    return acted(req, reply, actorPath(key), `Steered the turn of event ${r.eventId}.`, r);
  });

  app.post('/console/actors/:agent_uid/:session_id/cancel', { onRequest: guard }, async (req, reply) => {
    const key = actorOf(req.params);
    const f = check(z.object({ reason: z.string().max(500).optional() }), fieldsOf(req), 'form');
    const reason = blank(f.reason) ?? `cancelled from the console by ${principalOf(req).tokenName}`;
    const r = await deps.corral.cancel(key, reason);
    logAction(deps, req, 'actor.cancel', { actor: formatActorKey(key), eventId: r.eventId });
    return acted(req, reply, actorPath(key), `Cancelled the turn of event ${r.eventId}.`, r);
  });

  app.post('/console/actors/:agent_uid/:session_id/policy', { onRequest: guard }, async (req, reply) => {
    const key = actorOf(req.params);
    const f = check(PolicyBody, fieldsOf(req), 'form');
    const policy: InputPolicy = f.policy;
    const options = parseBatchOptions(policy, {
      ...(blank(f.debounce) ? { debounce: blank(f.debounce)! } : {}),
      ...(blank(f.maxWait) ? { maxWait: blank(f.maxWait)! } : {}),
      ...(blank(f.maxEvents) ? { maxEvents: blank(f.maxEvents)! } : {}),
    });
    const target = { agentUid: key.agentUid, sessionId: f.scope === 'agent' ? null : key.sessionId };
    const r = await setPolicy(deps.db, target, policy, options);
    logAction(deps, req, 'policy.set', { target: r.target, policy, previous: r.previous });
    return acted(req, reply, actorPath(key), `Input policy of ${r.target} set to ${policy}.`, r);
  });

  app.post('/console/actors/:agent_uid/:session_id/policy/clear', { onRequest: guard }, async (req, reply) => {
    const key = actorOf(req.params);
    fieldsOf(req);
    const had = await clearPolicy(deps.db, { agentUid: key.agentUid, sessionId: key.sessionId });
    logAction(deps, req, 'policy.clear', { target: formatActorKey(key), had });
    return acted(req, reply, actorPath(key), `Cleared the input policy (${had}) of ${formatActorKey(key)}.`, { cleared: had });
  });
}

export { CorralError };
