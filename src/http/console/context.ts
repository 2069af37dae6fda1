/** What the console's routes share: their dependencies, and the one way a page or an action answers. */
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { PgBoss } from 'pg-boss';
import type { Corral } from '../../client/api.ts';
import type { Db } from '../../db/client.ts';
import type { Queues } from '../../db/boss/jobs.ts';
import type { Logger } from '../../base/logger.ts';
import type { LiveSource, Streams } from '../streams.ts';
import { UI_HEADERS } from '../ui.ts';
import { noticeSignature } from '../../ops/console-sessions.ts';
import { csrfOf, principalOf } from './auth.ts';
import { page, type Viewer } from './layout.ts';
import type { HtmlValue } from './html.ts';
import type { DepthHistory } from './depth-history.ts';

/** A worker's key on the allow-list, as the console shows it (never its token hash). */
export interface WorkerKeyView {
  workerId: string;
  publicKey: string;
  capacity: number | null;
  agents: string[] | null;
  createdAt: string | null;
}

/**
 * The worker allow-list (CURVE keys under CORRAL_HOME/keys), as the host gives it: the console
 * reads and revokes keys through `corral keys`' own functions, which the HTTP layer does not reach.
 */
export interface WorkerKeys {
  list(): WorkerKeyView[];
  /** Removes `workerId` from the allow-list (a running daemon drops it); false when it was not on it. */
  revoke(workerId: string): boolean;
}

export interface ConsoleDeps {
  db: Db;
  corral: Corral;
  queues: Queues;
  live: LiveSource;
  streams: Streams;
  log: Logger;
  /** pg-boss, started on first use (replaying and discarding dead letters need it). */
  boss(): Promise<PgBoss>;
  /** Absent: the page says keys are not managed by this process. */
  workerKeys: WorkerKeys | undefined;
  deadLetterMode: string;
  /** The queue's depth, sampled each minute (the overview's chart). */
  depthHistory: DepthHistory;
}

/** Whether the caller asked for JSON (the pages' API) rather than a page. */
export function wantsJson(req: FastifyRequest): boolean {
  const accept = req.headers.accept ?? '';
  return /application\/json/i.test(accept) && !/text\/html/i.test(accept);
}

export const CONSOLE_HEADERS: Readonly<Record<string, string>> = {
  ...UI_HEADERS,
  // forms post to the console itself (A2 of auth.ts)
  'content-security-policy': UI_HEADERS['content-security-policy']!.replace("form-action 'none'", "form-action 'self'"),
  // the console's own forms then carry their Origin (A2 of auth.ts); no other site learns a console URL
  'referrer-policy': 'same-origin',
};

export function viewerOf(req: FastifyRequest): Viewer {
  const p = principalOf(req);
  return { tokenName: p.tokenName, csrf: csrfOf(p) };
}

/** A page, or its data as JSON for a caller that asked for JSON. */
export function respond(
  req: FastifyRequest,
  reply: FastifyReply,
  view: { title: string; here: string; json: unknown; body: (viewer: Viewer) => HtmlValue },
): FastifyReply {
  if (wantsJson(req)) return reply.type('application/json; charset=utf-8').send(view.json);
  const viewer = viewerOf(req);
  const notice = noticeOf(req);
  return reply
    .headers(CONSOLE_HEADERS)
    .type('text/html; charset=utf-8')
    .send(page({ title: view.title, here: view.here, viewer, notice, body: view.body(viewer) }).text);
}

/** The notice an action of this session left for the page (`?notice=…&sig=…`), if its signature is the session's. */
function noticeOf(req: FastifyRequest): string | undefined {
  const q = (req.query ?? {}) as Record<string, unknown>;
  const p = principalOf(req);
  if (typeof q.notice !== 'string' || typeof q.sig !== 'string' || !p.secret || q.notice.length > 300) return undefined;
  return q.sig === noticeSignature(p.secret, q.notice) ? q.notice : undefined;
}

/** An action's answer: its result as JSON, or back to `to` with a notice (303, so a reload does not repeat it). */
export function acted(req: FastifyRequest, reply: FastifyReply, to: string, notice: string, json: unknown): FastifyReply {
  if (wantsJson(req) || principalOf(req).via === 'bearer') return reply.type('application/json; charset=utf-8').send(json);
  const sep = to.includes('?') ? '&' : '?';
  const text = notice.slice(0, 300);
  const sig = noticeSignature(principalOf(req).secret!, text);
  return reply
    .code(303)
    .header('location', `${to}${sep}notice=${encodeURIComponent(text)}&sig=${sig}`)
    .send();
}

/** A3: the log line of an action. */
export function logAction(deps: ConsoleDeps, req: FastifyRequest, action: string, fields: Record<string, unknown>): void {
  deps.log.info({ token: principalOf(req).tokenName, action, ...fields }, 'console action');
}
