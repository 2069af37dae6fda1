/** The console's overview, its list of actors and its workers (routes.ts registers them). */
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { ACTOR_PART, parseActorKey } from '../../base/actor-key.ts';
import { CorralError } from '../../base/errors.ts';
import { CONSOLE_ACTOR_STATES, listConsoleActors } from '../../db/operations/console-actors.ts';
import { overviewMinutes } from '../../db/operations/console-overview.ts';
import { workersPage } from '../../db/operations/console-pages.ts';
import { systemStatus } from '../../ops/status.ts';
import { acted, logAction, respond, type ConsoleDeps } from './context.ts';
import { markup, query, seg, when } from './html.ts';
import { barChart, csrfForm, pager, stateBadge } from './layout.ts';
import { check, fieldsOf, PageSize, type Guard } from './forms.ts';

const PART = z.string().regex(ACTOR_PART, 'expected 1-128 characters of A-Z a-z 0-9 . _ : @ -');
/** A prefix: what an actor part may hold, up to its length (empty: none). */
const PREFIX = z
  .string()
  .max(128)
  .regex(/^[A-Za-z0-9._:@-]*$/, 'expected characters of A-Z a-z 0-9 . _ : @ -');

const ActorsQuery = z.object({
  state: z.enum(CONSOLE_ACTOR_STATES).or(z.literal('')).optional(),
  agent: PREFIX.optional(),
  session: PREFIX.optional(),
  after: z.string().max(260).optional(),
  limit: PageSize,
  notice: z.string().optional(),
  sig: z.string().optional(),
});

const WorkersQuery = z.object({ after: PART.optional(), limit: PageSize, notice: z.string().optional() });
const WorkerParams = z.object({
  id: z.string().regex(/^[A-Za-z0-9._:-]{1,64}$/, 'expected a worker id (1-64 characters of A-Z a-z 0-9 . _ : -)'),
});

export function registerListRoutes(app: FastifyInstance, deps: ConsoleDeps, guard: Guard): void {
  app.get('/console', { onRequest: guard }, async (req, reply) => {
    const [minutes, status] = await Promise.all([
      overviewMinutes(deps.db, deps.queues, 60),
      systemStatus(deps.db, deps.queues, { defaultStaleMs: 30_000 }),
    ]);
    const perMinute = (f: (m: (typeof minutes)[number]) => number) => minutes.map(f);
    const turns = perMinute((m) => m.turns);
    const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
    const wake = minutes.filter((m) => m.wakeMs !== null).map((m) => m.wakeMs!);
    const lastMinute = turns.at(-2) ?? 0;
    const depth = status.queue;
    const cards = [
      {
        id: 'turns',
        title: 'Turns/s (last full minute)',
        big: (lastMinute / 60).toFixed(2),
        sub: `${sum(turns)} turns in the hour`,
        chart: turns,
      },
      {
        id: 'queue',
        title: 'Queue depth (now)',
        big: String(depth.ready + depth.deferred + depth.retrying + depth.active),
        sub: `ready ${depth.ready}, active ${depth.active}, retrying ${depth.retrying}, deferred ${depth.deferred}`,
        chart: deps.depthHistory.values().map((d) => d.depth),
      },
      {
        id: 'wake',
        title: 'Wake latency (mean, first attempts)',
        big: wake.length > 0 ? `${wake.at(-1)} ms` : '-',
        sub: 'enqueue to turn start, per minute',
        chart: perMinute((m) => m.wakeMs ?? 0),
      },
      {
        id: 'failures',
        title: 'Failed turns',
        big: String(sum(perMinute((m) => m.failed))),
        sub: 'in the last hour',
        chart: perMinute((m) => m.failed),
      },
      {
        id: 'dead-letters',
        title: 'Dead letters',
        big: String(depth.deadLettered),
        sub: `${sum(perMinute((m) => m.deadLetters))} new in the last hour`,
        chart: perMinute((m) => m.deadLetters),
      },
    ];
    return respond(req, reply, {
      title: 'Overview',
      here: '/console',
      json: {
        minutes,
        queue: depth,
        queueHistory: deps.depthHistory.values(),
        liveActivations: status.liveActivations,
        blockedActors: status.blockedActors,
        outbox: status.outbox,
      },
      body: () =>
        markup`<h1>Overview</h1>
          <div class="grid">
            ${cards.map(
              (c) =>
                markup`<div class="card" id="card-${c.id}">
                  <div class="muted">${c.title}</div>
                  <div class="big">${c.big}</div>
                  ${barChart(c.chart, c.title)}
                  <div class="muted">${c.sub}</div>
                </div>`,
            )}
          </div>
          <p class="muted">
            The charts cover the last 60 minutes, a bar a minute: from the database (turns by their start), and for the queue's depth
            from a sample a minute this server took since it started. Live activations ${status.liveActivations}, blocked actors ${status.blockedActors}, outbox
            pending ${status.outbox.pending}, dead ${status.outbox.dead}.
          </p>`,
    });
  });

  app.get('/console/actors', { onRequest: guard }, async (req, reply) => {
    const q = check(ActorsQuery, req.query, 'query');
    const state = q.state === '' ? undefined : q.state;
    const agent = q.agent === '' ? undefined : q.agent;
    const session = q.session === '' ? undefined : q.session;
    if (session !== undefined && agent === undefined)
      throw new CorralError('invalid_argument', 'a session prefix needs an agent (the exact agent_uid)');
    const after = q.after ? parseActorKey(q.after) : undefined;
    const rows = await listConsoleActors(
      deps.db,
      deps.queues,
      { state, agentPrefix: agent, sessionPrefix: session },
      { after, limit: q.limit + 1 },
    );
    const more = rows.length > q.limit;
    const shownRows = rows.slice(0, q.limit);
    const last = shownRows.at(-1);
    const base = { state, agent, session, limit: q.limit === 50 ? undefined : q.limit };
    const next = more && last ? `/console/actors${query({ ...base, after: `${last.agentUid}/${last.sessionId}` })}` : undefined;
    return respond(req, reply, {
      title: 'Actors',
      here: '/console/actors',
      json: { actors: shownRows, next: next ?? null },
      body: () =>
        markup`<h1>Actors</h1>
          <form method="get" action="/console/actors" class="filters" id="actor-filters">
            <label
              >Agent (prefix; exact with a session)<input name="agent" id="filter-agent" value="${agent ?? ''}" maxlength="128"
            /></label>
            <label>Session (prefix)<input name="session" id="filter-session" value="${session ?? ''}" maxlength="128" /></label>
            <label
              >State<select name="state" id="filter-state">
                <option value="">any</option>
                ${CONSOLE_ACTOR_STATES.map(
                  (s) => markup`<option value="${s}" ${s === state ? markup` selected` : ''}>${s.replace('_', '-')}</option>`,
                )}
              </select></label
            >
            <button id="filter-apply">Search</button>
          </form>
          <table id="actors">
            <thead>
              <tr>
                <th>Agent</th>
                <th>Session</th>
                <th>State</th>
                <th>Queued</th>
                <th>Policy</th>
                <th>Last turn</th>
                <th>Epoch</th>
              </tr>
            </thead>
            <tbody>
              ${shownRows.map(
                (r) =>
                  markup`<tr data-actor="${r.agentUid}/${r.sessionId}">
                    <td>${r.agentUid}</td>
                    <td><a href="/console/actors/${seg(r.agentUid)}/${seg(r.sessionId)}">${r.sessionId}</a></td>
                    <td>${stateBadge(r.state)}</td>
                    <td>${r.queued}</td>
                    <td>${r.policy ?? markup`<span class="muted">default</span>`}</td>
                    <td>${when(r.lastTurnAt)}</td>
                    <td>${r.epoch}</td>
                  </tr>`,
              )}
              ${
                shownRows.length === 0
                  ? markup`<tr>
                      <td colspan="7" class="muted">No actor matches.</td>
                    </tr>`
                  : ''
              }
            </tbody>
          </table>
          ${pager(next, q.after ? `/console/actors${query(base)}` : undefined)}`,
    });
  });

  app.get('/console/workers', { onRequest: guard }, async (req, reply) => {
    const q = check(WorkersQuery, req.query, 'query');
    const rows = await workersPage(deps.db, { after: q.after, limit: q.limit + 1 });
    const more = rows.length > q.limit;
    const list = rows.slice(0, q.limit);
    const keys = new Map((deps.workerKeys?.list() ?? []).map((k) => [k.workerId, k]));
    const view = list.map((w) => {
      const stale = w.status === 'ready' && w.heartbeatAgeSeconds * 1000 > (w.staleMs ?? 30_000);
      return { ...w, status: stale ? 'stale' : w.status, key: keys.get(w.workerId) ?? null };
    });
    const next = more ? `/console/workers${query({ after: list.at(-1)!.workerId })}` : undefined;
    const connected = new Set(list.map((w) => w.workerId));
    const keyOnly = [...keys.values()].filter((k) => !connected.has(k.workerId));
    return respond(req, reply, {
      title: 'Workers',
      here: '/console/workers',
      json: { workers: view, keysWithoutWorker: keyOnly, next: next ?? null, keysManaged: deps.workerKeys !== undefined },
      body: (viewer) =>
        markup`<h1>Workers</h1>
          ${deps.workerKeys ? '' : markup`<p class="muted">Worker keys are not managed by this process (CURVE is off, or the console runs outside a daemon): revoke with corral keys revoke.</p>`}
          <table id="workers">
            <thead>
              <tr>
                <th>Worker</th>
                <th>Status</th>
                <th>Capacity</th>
                <th>In flight</th>
                <th>Key (public)</th>
                <th>Last heartbeat</th>
                <th>Daemon</th>
                <th></th>
              </tr>
            </thead>
            <tbody>
              ${view.map(
                (w) =>
                  markup`<tr data-worker="${w.workerId}">
                    <td>${w.workerId}</td>
                    <td>${stateBadge(w.status)}</td>
                    <td>${w.capacity}</td>
                    <td>${w.inFlight}</td>
                    <td class="mono">${w.key ? w.key.publicKey : markup`<span class="muted">none</span>`}</td>
                    <td>${when(w.lastHeartbeatAt)} <span class="muted">(${Math.round(w.heartbeatAgeSeconds)} s ago)</span></td>
                    <td class="mono">${w.ownerId}</td>
                    <td>
                      ${
                        w.key && deps.workerKeys
                          ? markup`${csrfForm(`/console/workers/${seg(w.workerId)}/revoke`, viewer, { confirm: `Revoke the key of worker ${w.workerId}? It is disconnected and its turns are dispatched again.` })}<button class="danger" id="revoke-${w.workerId}">Revoke</button></form>`
                          : ''
                      }
                    </td>
                  </tr>`,
              )}
              ${
                view.length === 0
                  ? markup`<tr>
                      <td colspan="8" class="muted">No worker has registered.</td>
                    </tr>`
                  : ''
              }
            </tbody>
          </table>
          ${pager(next, q.after ? '/console/workers' : undefined)}
          ${
            keyOnly.length > 0
              ? markup`<h2>Keys of workers not connected</h2>
                  <table id="keys">
                    <tbody>
                      ${keyOnly.map(
                        (k) =>
                          markup`<tr>
                            <td>${k.workerId}</td>
                            <td class="mono">${k.publicKey}</td>
                            <td>${k.createdAt ?? ''}</td>
                          </tr>`,
                      )}
                    </tbody>
                  </table>`
              : ''
          }`,
    });
  });

  app.post('/console/workers/:id/revoke', { onRequest: guard }, async (req, reply) => {
    const { id } = check(WorkerParams, req.params, 'worker');
    fieldsOf(req);
    if (!deps.workerKeys)
      throw new CorralError('invalid_argument', 'worker keys are not managed by this process (CURVE is off): use corral keys revoke');
    const revoked = deps.workerKeys.revoke(id);
    if (!revoked) throw new CorralError('nothing_matched', `worker ${id} is not on the allow-list`);
    logAction(deps, req, 'worker.revoke', { workerId: id });
    return acted(req, reply, '/console/workers', `Revoked the key of worker ${id}: the daemon drops it within its key poll.`, {
      revoked: id,
    });
  });
}
