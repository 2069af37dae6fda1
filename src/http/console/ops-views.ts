/** Dead letters and the outbox: lists, a dead letter's detail, and their actions (one, several, or a confirmed filter). */
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { parseActorKey } from '../../base/actor-key.ts';
import { CorralError } from '../../base/errors.ts';
import { countDeadLetters, type DeadLetterFilter } from '../../db/boss/jobs.ts';
import { OUTBOX_STATES } from '../../db/views.ts';
import {
  discardDeadLetters,
  errorLine,
  listDeadLetters,
  replayDeadLetters,
  selectDeadLetters,
  showDeadLetter,
  type ActionResult,
} from '../../ops/dead-letters.ts';
import { actOnOutbox, listOutboxMessages, lastAnswer } from '../../outbox/operations.ts';
import { disableSink, enableSink, listSinkViews } from '../../outbox/sinks.ts';
import { acted, logAction, respond, type ConsoleDeps } from './context.ts';
import { markup, query, seg, shown, when } from './html.ts';
import { csrfForm, pager, stateBadge } from './layout.ts';
import { check, fieldsOf, PageSize, type Guard } from './forms.ts';

/** The most dead letters one batch takes: a larger filter is narrowed first, or acted on in turns. */
export const MAX_BATCH = 1_000;

const UUID = z.string().regex(/^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/, 'expected a UUID');
const ActorText = z.string().max(260).optional();
const ErrorText = z.string().max(200).optional();

const DeadLettersQuery = z.object({
  actor: ActorText,
  error: ErrorText,
  after: UUID.optional(),
  limit: PageSize,
  notice: z.string().optional(),
  sig: z.string().optional(),
});
/** One id or several (a repeated form field). */
const Ids = <T extends z.ZodTypeAny>(item: T) =>
  z.union([item, z.array(item).min(1).max(MAX_BATCH)]).transform((v) => (Array.isArray(v) ? v : [v]) as z.infer<T>[]);
const Back = z
  .string()
  .max(600)
  .regex(/^\/console(\/[A-Za-z0-9._:@%-]*)*$/, 'expected a console path')
  .optional();
const ActBody = z.object({ action: z.enum(['replay', 'discard']), ids: Ids(UUID), back: Back });
const BatchBody = z.object({
  action: z.enum(['replay', 'discard']),
  actor: ActorText,
  error: ErrorText,
  expected: z.coerce.number().int().min(1).max(MAX_BATCH),
});

const OutboxQueryParams = z.object({
  state: z.enum(OUTBOX_STATES).or(z.literal('')).optional(),
  sink: z.string().max(64).optional(),
  before: z.coerce.number().int().min(1).optional(),
  limit: PageSize,
  notice: z.string().optional(),
  sig: z.string().optional(),
});
const OutboxActBody = z.object({
  action: z.enum(['replay', 'discard']),
  ids: Ids(z.string().regex(/^[0-9]{1,16}$/, 'expected a message id')),
});
const SinkParams = z.object({ name: z.string().regex(/^[A-Za-z0-9._-]{1,64}$/, 'expected a sink name') });

function filterOf(actor: string | undefined, error: string | undefined): DeadLetterFilter {
  const a = actor?.trim() ? parseActorKey(actor.trim()) : undefined;
  const e = error?.trim() ? error.trim() : undefined;
  return { ...(a ? { actor: a } : {}), ...(e ? { error: e } : {}) };
}

const summary = (action: string, results: readonly ActionResult[]) => {
  const done = results.filter((r) => r.status === 'replayed' || r.status === 'discarded').length;
  return `${action === 'replay' ? 'Replayed' : 'Discarded'} ${done} of ${results.length} dead letter${results.length === 1 ? '' : 's'}.`;
};

export function registerOpsRoutes(app: FastifyInstance, deps: ConsoleDeps, guard: Guard): void {
  const opsDeps = async () => ({ db: deps.db, boss: await deps.boss(), queues: deps.queues });

  app.get('/console/dead-letters', { onRequest: guard }, async (req, reply) => {
    const q = check(DeadLettersQuery, req.query, 'query');
    const filter = filterOf(q.actor, q.error);
    const [rows, counted] = await Promise.all([
      listDeadLetters(deps.db, deps.queues, filter, { limit: q.limit + 1, ...(q.after ? { after: q.after } : {}) }),
      countDeadLetters(deps.db, deps.queues, filter),
    ]);
    const more = rows.length > q.limit;
    const list = rows.slice(0, q.limit);
    const base = { actor: q.actor?.trim(), error: q.error?.trim() };
    const next = more ? `/console/dead-letters${query({ ...base, after: list.at(-1)!.id })}` : undefined;
    return respond(req, reply, {
      title: 'Dead letters',
      here: '/console/dead-letters',
      json: { deadLetters: list, matching: counted.deadLetters, next: next ?? null },
      body: (viewer) =>
        markup`<h1>
            Dead letters
            <span class="muted">(${counted.deadLetters} matching, of ${counted.actors} actors; mode ${deps.deadLetterMode})</span>
          </h1>
          <form method="get" action="/console/dead-letters" class="filters" id="dlq-filters">
            <label>Actor (agent/session)<input name="actor" value="${base.actor ?? ''}" maxlength="260" /></label>
            <label>Error contains<input name="error" value="${base.error ?? ''}" maxlength="200" /></label>
            <button>Filter</button>
          </form>
          ${
            counted.deadLetters > 0
              ? markup`<div class="filters">
                  ${[
                    ['replay', 'Replay'],
                    ['discard', 'Discard'],
                  ].map(
                    ([action, label]) =>
                      markup`${csrfForm('/console/dead-letters/batch', viewer, { id: `batch-${action}`, confirm: `${label} all ${counted.deadLetters} dead letters this filter matches?` })}<input type="hidden" name="action" value="${action}"><input type="hidden" name="actor" value="${base.actor ?? ''}"><input type="hidden" name="error" value="${base.error ?? ''}"><input type="hidden" name="expected" value="${counted.deadLetters}"><button class="${action === 'discard' ? 'danger' : ''}"${counted.deadLetters > MAX_BATCH ? markup` disabled` : ''}>${label} all ${counted.deadLetters} matching</button></form> `,
                  )}${counted.deadLetters > MAX_BATCH ? markup`<span class="muted">Narrow the filter to at most ${MAX_BATCH} for a batch.</span>` : ''}
                </div>`
              : ''
          }
          <table id="dead-letters">
            <thead>
              <tr>
                <th>Dead letter</th>
                <th>Actor</th>
                <th>Error</th>
                <th>Attempts</th>
                <th>Failed</th>
                <th></th>
              </tr>
            </thead>
            <tbody>
              ${list.map(
                (d) =>
                  markup`<tr data-dead-letter="${d.id}"><td><a href="/console/dead-letters/${d.id}">${d.id}</a></td><td><a href="/console/actors/${seg(d.agentUid)}/${seg(d.sessionId)}">${d.actor}</a></td><td>${errorLine(d.lastError)}</td><td>${d.attempts}</td><td>${when(d.failedAt)}</td><td>${csrfForm('/console/dead-letters/act', viewer)}<input type="hidden" name="ids" value="${d.id}"><button name="action" value="replay" class="replay">Replay</button> <button name="action" value="discard" class="danger">Discard</button></form></td></tr>`,
              )}
              ${
                list.length === 0
                  ? markup`<tr>
                      <td colspan="6" class="muted">No dead letter matches.</td>
                    </tr>`
                  : ''
              }
            </tbody>
          </table>
          ${pager(next, q.after ? `/console/dead-letters${query(base)}` : undefined)}`,
    });
  });

  app.get('/console/dead-letters/:id', { onRequest: guard }, async (req, reply) => {
    const { id } = check(z.object({ id: UUID }), req.params, 'dead letter');
    const detail = await showDeadLetter(deps.db, deps.queues, id);
    const d = detail.deadLetter;
    return respond(req, reply, {
      title: `Dead letter ${d.id}`,
      here: '/console/dead-letters',
      json: detail,
      body: (viewer) => markup`<h1>Dead letter <code>${d.id}</code></h1>
<p>Event <code>${d.eventId}</code> of <a href="/console/actors/${seg(d.agentUid)}/${seg(d.sessionId)}">${d.actor}</a>, ${d.attempts} attempts, dead-lettered ${when(d.failedAt)}.</p>
<div class="error" id="dead-letter-error">${errorLine(d.lastError)}</div>
${csrfForm('/console/dead-letters/act', viewer)}<input type="hidden" name="ids" value="${d.id}"><input type="hidden" name="back" value="/console/dead-letters"><button name="action" value="replay" id="replay-one">Replay</button> <button name="action" value="discard" class="danger" id="discard-one">Discard</button></form>
<h2>Payload</h2><pre id="payload">${shown(d.payload, 20_000)}</pre>
<h2>Attempts</h2><table><tbody>${detail.attempts.map(
        (t) =>
          markup`<tr>
            <td>${t.attempt}</td>
            <td>${stateBadge(t.status)}</td>
            <td>${errorLine(t.error)}</td>
            <td>${when(t.startedAt)}</td>
            <td>${t.workerId ?? '-'}</td>
          </tr>`,
      )}</tbody></table>`,
    });
  });

  app.post('/console/dead-letters/act', { onRequest: guard }, async (req, reply) => {
    const f = check(ActBody, fieldsOf(req), 'form');
    const results =
      f.action === 'replay' ? await replayDeadLetters(await opsDeps(), f.ids) : await discardDeadLetters(await opsDeps(), f.ids);
    logAction(deps, req, `dead_letters.${f.action}`, { ids: f.ids, results: results.map((r) => r.status) });
    return acted(req, reply, f.back ?? '/console/dead-letters', summary(f.action, results), { results });
  });

  app.post('/console/dead-letters/batch', { onRequest: guard }, async (req, reply) => {
    const f = check(BatchBody, fieldsOf(req), 'form');
    const filter = filterOf(f.actor, f.error);
    // the confirmation: the count the operator saw is the count the filter matches now
    const now = await selectDeadLetters(deps.db, deps.queues, filter);
    if (now.length !== f.expected) {
      throw new CorralError(
        'invalid_argument',
        `the filter matches ${now.length} dead letters now, not the ${f.expected} confirmed: look at the list again and confirm anew`,
        { details: { matching: now.length, expected: f.expected } },
      );
    }
    const ids = now.map((d) => d.id);
    const results = f.action === 'replay' ? await replayDeadLetters(await opsDeps(), ids) : await discardDeadLetters(await opsDeps(), ids);
    logAction(deps, req, `dead_letters.${f.action}_batch`, { filter: { actor: f.actor, error: f.error }, count: ids.length });
    return acted(req, reply, '/console/dead-letters', summary(f.action, results), { results });
  });

  app.get('/console/outbox', { onRequest: guard }, async (req, reply) => {
    const q = check(OutboxQueryParams, req.query, 'query');
    const state = q.state === '' ? undefined : q.state;
    const sink = q.sink?.trim() ? q.sink.trim() : undefined;
    const [sinks, messages] = await Promise.all([
      listSinkViews(deps.db),
      listOutboxMessages(deps.db, {
        ...(state ? { states: [state] } : {}),
        ...(sink ? { sink } : {}),
        limit: q.limit,
        ...(q.before ? { before: q.before } : {}),
      }),
    ]);
    const next = messages.next === null ? undefined : `/console/outbox${query({ state, sink, before: messages.next })}`;
    return respond(req, reply, {
      title: 'Outbox',
      here: '/console/outbox',
      json: { sinks, messages: messages.messages, next: next ?? null },
      body: (viewer) =>
        markup`<h1>Outbox</h1>
          <h2>Sinks</h2>
          <table id="sinks">
            <thead>
              <tr>
                <th>Sink</th>
                <th>URL</th>
                <th>Pending</th>
                <th>Dead</th>
                <th>State</th>
                <th></th>
              </tr>
            </thead>
            <tbody>
              ${sinks.map(
                (s) =>
                  markup`<tr data-sink="${s.name}"><td><a href="/console/outbox${query({ sink: s.name })}">${s.name}</a></td><td class="mono">${s.url}</td><td>${s.pending}</td><td>${s.dead}</td><td>${
                    s.disabledAt
                      ? markup`${stateBadge('paused')} <span class="muted">${s.disabledReason ?? ''}</span>`
                      : stateBadge('ready')
                  }</td><td>${csrfForm(`/console/sinks/${seg(s.name)}/${s.disabledAt ? 'enable' : 'disable'}`, viewer, s.disabledAt ? {} : { confirm: `Disable sink ${s.name}? Its messages wait until it is enabled.` })}<button class="${s.disabledAt ? '' : 'danger'}">${s.disabledAt ? 'Enable' : 'Disable'}</button></form></td></tr>`,
              )}
              ${
                sinks.length === 0
                  ? markup`<tr>
                      <td colspan="6" class="muted">No sink (corral sinks add).</td>
                    </tr>`
                  : ''
              }
            </tbody>
          </table>
          <h2>Messages</h2>
          <form method="get" action="/console/outbox" class="filters">
            <label
              >State<select name="state">
                <option value="">any</option>
                ${OUTBOX_STATES.map((s) => markup`<option value="${s}" ${s === state ? markup` selected` : ''}>${s}</option>`)}
              </select></label
            ><label>Sink<input name="sink" value="${sink ?? ''}" maxlength="64" /></label><button>Filter</button>
          </form>
          <table id="outbox">
            <thead>
              <tr>
                <th>Id</th>
                <th>Sink</th>
                <th>Actor</th>
                <th>State</th>
                <th>Attempts</th>
                <th>Last answer</th>
                <th>Created</th>
                <th></th>
              </tr>
            </thead>
            <tbody>
              ${messages.messages.map(
                (m) =>
                  markup`<tr data-message="${m.id}">
                    <td>${m.id}</td>
                    <td>${m.sink}</td>
                    <td>${m.actor}</td>
                    <td>${stateBadge(m.state)}</td>
                    <td>${m.attempts}</td>
                    <td>${lastAnswer(m)}</td>
                    <td>${m.createdAt}</td>
                    <td>
                      ${
                        m.state === 'delivered'
                          ? ''
                          : markup`${csrfForm('/console/outbox/act', viewer)}<input type="hidden" name="ids" value="${m.id}">${m.state === 'dead' || m.state === 'discarded' ? markup`<button name="action" value="replay">Replay</button> ` : ''}${m.state === 'pending' || m.state === 'dead' ? markup`<button name="action" value="discard" class="danger">Discard</button>` : ''}</form>`
                      }
                    </td>
                  </tr>`,
              )}
              ${
                messages.messages.length === 0
                  ? markup`<tr>
                      <td colspan="8" class="muted">No message matches.</td>
                    </tr>`
                  : ''
              }
            </tbody>
          </table>
          ${pager(next, q.before ? `/console/outbox${query({ state, sink })}` : undefined)}`,
    });
  });

  app.post('/console/outbox/act', { onRequest: guard }, async (req, reply) => {
    const f = check(OutboxActBody, fieldsOf(req), 'form');
    const r = await actOnOutbox(deps.db, f.action, { ids: f.ids.map(Number) });
    logAction(deps, req, `outbox.${f.action}`, { ids: f.ids, done: r.done });
    return acted(req, reply, '/console/outbox', `${f.action === 'replay' ? 'Replayed' : 'Discarded'} ${r.done.length} message(s).`, r);
  });

  for (const action of ['enable', 'disable'] as const) {
    app.post(`/console/sinks/:name/${action}`, { onRequest: guard }, async (req, reply) => {
      const { name } = check(SinkParams, req.params, 'sink');
      fieldsOf(req);
      const who = logAction;
      const s = action === 'enable' ? await enableSink(deps.db, name) : await disableSink(deps.db, name, `disabled from the console`);
      who(deps, req, `sink.${action}`, { sink: name });
      return acted(req, reply, '/console/outbox', `Sink ${name} ${action}d.`, s);
    });
  }
}
