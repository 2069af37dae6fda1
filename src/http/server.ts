/**
 * The HTTP API (docs/http.md): applications in any language send events, read transcripts and
 * event states, and follow an actor's live stream, with a bearer token (src/http/auth.ts). Built
 * on Fastify; every route is the client's own use-case (a `Corral`), so a POST and `corral.send`
 * write the same row.
 *
 *  H1 Every response is JSON, but a stream's; every failure is one error shape with a stable code
 *     (src/http/errors.ts). Unknown paths are 404 `not_found`, a known path with another method
 *     405 `method_not_allowed` (with `Allow`), both before any token is looked at: they tell
 *     nothing the documentation does not.
 *  H2 Every input is checked before it is used: the token first (B1 of auth.ts), then the path's
 *     parameters, the headers read and the body, each with its zod schema (src/http/requests.ts).
 *  H3 A body is read only as `application/json` and only up to `maxEventBytes` bytes (413
 *     beyond, without reading the rest), the limit of the event it carries: no request costs
 *     more memory than an event may.
 *  H4 Bounded in time too: a request must arrive whole within `requestTimeoutMs`; idle keep-alive
 *     connections close after 5 s. `close()` refuses new requests (503 `shutdown`), ends the open
 *     streams, and waits for the requests under way.
 *  H5 `POST /v1/session` sets the session cookie a browser page's `EventSource` needs (B4 of
 *     auth.ts) from a valid bearer token; `DELETE /v1/session` clears it, with no token: it
 *     reads and writes nothing but the cookie.
 *  H6 At most `httpMaxConnections` connections are served: a request on one past it is answered
 *     429 `rate_limited` and its connection closed; twice that many are not accepted at all.
 *  H7 Every route that names an actor, or an event (by its actor), checks it against the token's
 *     actors first (B6 of auth.ts): outside them, 404 `not_found`, as for what does not exist.
 *  H8 With `console`, the operator console is served under `/console` (src/http/console/, its own
 *     rules there): admin tokens only, its own session cookie, CSRF tokens on every write.
 */
import { traceCarrierFromHeaders } from '../base/trace-context.ts';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest, type HTTPMethods } from 'fastify';
import type { AddressInfo } from 'node:net';
import type { Corral } from '../client/api.ts';
import type { Config } from '../config.ts';
import { liveApiTokenNames } from '../db/operations/api-tokens.ts';
import type { Db } from '../db/client.ts';
import { committedTurnOf, eventStatus } from '../db/turns/event-status.ts';
import { CorralError, toError } from '../base/errors.ts';
import type { Logger } from '../base/logger.ts';
import { tokenVerifier, type ApiTokenScope } from '../ops/api-tokens.ts';
import { queuesOf } from '../queue/names.ts';
import { parseActorKey } from '../base/actor-key.ts';
import { actorInScope } from '../base/actor-scope.ts';
import { AuthFailures, bearerToken, cameOverHttps, requireActor, requireToken, sessionCookie, tokenOf, type AccessRule } from './auth.ts';
import { httpErrorOf } from './errors.ts';
import { actorOf, EventBody, EventParams, parsed, SendHeaders, StreamHeaders } from './requests.ts';
import { Streams, type LiveSource } from './streams.ts';
import { loadUiFiles, UI_HEADERS } from './ui.ts';
import { eventJson, sendJson, transcriptJson } from './views.ts';
import type { ConsoleSettings } from './console/index.ts';

export type { LiveSource } from './streams.ts';

export interface ApiServerOptions {
  host: string;
  /** 0 picks a free port (see `port` on the result). */
  port: number;
  /** Sends events and reads transcripts. */
  corral: Corral;
  /** Where live streams come from; default `corral` (its `watch`). */
  live?: LiveSource | undefined;
  /** corral's database: tokens and event states. */
  db: Db;
  config: Pick<
    Config,
    | 'maxEventBytes'
    | 'queueName'
    | 'bossSchema'
    | 'httpMaxStreams'
    | 'httpMaxStreamsPerActor'
    | 'httpMaxStreamsPerToken'
    | 'httpStreamOpensPerSecond'
    | 'httpMaxConnections'
    | 'httpAuthFailuresPerMinute'
    | 'httpStreamBufferBytes'
  >;
  logger: Logger;
  /** S2 of streams.ts: how often a quiet stream gets a comment line. Default 15,000 ms. */
  keepAliveMs?: number;
  /** H4: how long a request may take to arrive whole. Default 30,000 ms. */
  requestTimeoutMs?: number;
  /** Serve the chat page at `/` (src/http/ui.ts), from `dir` (default examples/chat/); absent: `/` is 404. */
  ui?: { dir?: string } | undefined;
  /** H8: serve the operator console at `/console`; absent: `/console` is 404. */
  console?: ConsoleSettings | undefined;
}

export interface ApiServer {
  readonly host: string;
  readonly port: number;
  /** `http://host:port`. */
  readonly url: string;
  /** Open live streams. */
  readonly streams: number;
  /** H4. Idempotent. */
  close(): Promise<void>;
}

export const DEFAULT_KEEPALIVE_MS = 15_000;

const METHODS: HTTPMethods[] = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'];

export async function startApiServer(opts: ApiServerOptions): Promise<ApiServer> {
  const log = opts.logger.child({ component: 'http-api' });
  const { config, db, corral } = opts;
  const live = opts.live ?? corral;
  const queues = queuesOf(config);
  const bodyLimit = config.maxEventBytes;
  const keepAliveMs = opts.keepAliveMs ?? DEFAULT_KEEPALIVE_MS;
  const verifier = tokenVerifier(db, { onTouchError: (e) => log.warn({ err: toError(e) }, 'could not record a token use') });
  const streams = new Streams(
    {
      maxStreams: config.httpMaxStreams,
      maxStreamsPerActor: config.httpMaxStreamsPerActor,
      maxStreamsPerToken: config.httpMaxStreamsPerToken,
      opensPerSecond: config.httpStreamOpensPerSecond,
      bufferBytes: config.httpStreamBufferBytes,
      keepAliveMs,
    },
    log,
  );
  const failures = new AuthFailures(config.httpAuthFailuresPerMinute);
  // U1, U2 of ui.ts: read before anything listens, so a missing folder stops the start
  const uiFiles = opts.ui ? await loadUiFiles(opts.ui.dir) : [];
  let closing = false;

  const app: FastifyInstance = Fastify({
    logger: false,
    bodyLimit,
    // actor key parts are up to 128 characters: a longer one is answered 400, not a router 404
    routerOptions: { maxParamLength: 512 },
    requestTimeout: opts.requestTimeoutMs ?? 30_000,
    keepAliveTimeout: 5_000,
    return503OnClosing: false,
    exposeHeadRoutes: false,
  });

  // H3: JSON alone; Fastify's text/plain parser would hand a route a string as an event
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('application/json', { parseAs: 'string', bodyLimit }, (_req, body, done) => {
    if (body.length === 0) {
      done(new CorralError('invalid_json', 'the request body is empty: the event is a JSON value (null is one)'), undefined);
      return;
    }
    try {
      done(null, JSON.parse(body as string));
    } catch (e) {
      done(new CorralError('invalid_json', `the request body is not JSON: ${toError(e).message}`), undefined);
    }
  });

  app.addHook('onRequest', async (_req, reply) => {
    if (closing) throw new CorralError('shutdown', 'the server is shutting down');
    // H6: past the cap, a request is answered at once and its connection closed
    if (connections > config.httpMaxConnections) {
      void reply.header('connection', 'close');
      throw new CorralError(
        'rate_limited',
        `the server holds ${config.httpMaxConnections} connections, its limit (CORRAL_HTTP_MAX_CONNECTIONS)`,
        {
          details: { retryAfterS: 1 },
        },
      );
    }
  });
  app.addHook('onSend', async (_req, reply) => {
    reply.header('cache-control', 'no-store');
  });
  app.addHook('onResponse', async (req, reply) => {
    log.debug(
      { method: req.method, route: req.routeOptions.url ?? null, status: reply.statusCode, ms: Math.round(reply.elapsedTime) },
      'request',
    );
  });

  app.setErrorHandler(async (e, req, reply) => {
    const failure = httpErrorOf(e, bodyLimit);
    if (failure.log) {
      const line = {
        method: req.method,
        route: req.routeOptions.url ?? null,
        status: failure.status,
        err: failure.log.cause ?? failure.log,
      };
      if (failure.status === 500) log.error(line, 'request failed');
      else log.warn(line, 'request failed');
    }
    return reply.code(failure.status).headers(failure.headers).type('application/json; charset=utf-8').send(failure.body);
  });
  app.setNotFoundHandler(async (req) => {
    throw new CorralError('not_found', `no route ${req.method} ${new URL(req.url, 'http://x').pathname} (docs/http.md lists them)`);
  });

  type Handler = (req: FastifyRequest, reply: FastifyReply) => Promise<unknown>;
  /**
   * H1: `url` answers the methods of `handlers`, each behind its token check (`null`: none);
   * any other method is 405. B4 of auth.ts: only a GET takes the session cookie.
   */
  const serve = (url: string, handlers: Partial<Record<HTTPMethods, { scope: ApiTokenScope | undefined | null; handler: Handler }>>) => {
    const methods = Object.keys(handlers) as HTTPMethods[];
    for (const method of methods) {
      const { scope, handler } = handlers[method]!;
      const rule: AccessRule = { scope: scope ?? undefined, cookie: method === 'GET' };
      app.route({ method, url, ...(scope === null ? {} : { onRequest: requireToken(verifier, rule, failures) }), handler });
    }
    const allowed = methods.map((m) => `${m} ${url}`).join(' and ');
    app.route({
      method: METHODS.filter((m) => !methods.includes(m)),
      url,
      handler: async (req, reply) => {
        void reply.header('allow', methods.join(', '));
        throw new CorralError('method_not_allowed', `${req.method} is not allowed here: ${allowed} ${methods.length > 1 ? 'are' : 'is'}`);
      },
    });
  };
  const route = (method: HTTPMethods, url: string, scope: ApiTokenScope, handler: Handler) => serve(url, { [method]: { scope, handler } });

  // B4 of auth.ts: a browser page trades its token for a cookie that `EventSource` sends. Any
  // valid token, from the header alone (a POST never takes the cookie); leaving needs none
  serve('/v1/session', {
    POST: {
      scope: undefined,
      handler: async (req, reply) => {
        const token = bearerToken(req.headers.authorization)!;
        log.debug({ token: tokenOf(req).name }, 'session cookie set');
        return reply
          .code(204)
          .header('set-cookie', sessionCookie(token, cameOverHttps(req)))
          .send();
      },
    },
    DELETE: {
      scope: null,
      handler: async (req, reply) =>
        reply
          .code(204)
          .header('set-cookie', sessionCookie(undefined, cameOverHttps(req)))
          .send(),
    },
  });

  route('POST', '/v1/actors/:agent_uid/:session_id/events', 'send', async (req, reply) => {
    const actor = actorOf(req.params);
    requireActor(req, actor);
    const headers = parsed(SendHeaders, req.headers, 'invalid_argument', 'header');
    if (!isJson(req)) throw new CorralError('unsupported_media_type', 'the body must be JSON, sent with Content-Type: application/json');
    const data = parsed(EventBody, req.body, 'invalid_argument', 'event');
    const idempotencyKey = headers['idempotency-key'];
    // E4 of src/db/enqueue/send-event.ts: a key is its token's; no other caller sees what it sent
    // W3C Trace Context: an invalid traceparent is ignored, not refused (src/base/trace-context.ts)
    const trace = traceCarrierFromHeaders(req.headers);
    const sent = await corral.send(actor, data, {
      ...(idempotencyKey === undefined ? {} : { idempotencyKey, idempotencyScope: `token:${tokenOf(req).name}` }),
      traceparent: trace?.traceparent ?? null,
      ...(trace?.tracestate === undefined ? {} : { tracestate: trace.tracestate }),
    });
    log.debug(
      { actor: `${actor.agentUid}/${actor.sessionId}`, eventId: sent.eventId, duplicate: sent.duplicate, token: tokenOf(req).name },
      'event sent',
    );
    return reply.code(202).header('location', `/v1/events/${sent.eventId}`).send(sendJson(sent));
  });

  route('GET', '/v1/actors/:agent_uid/:session_id/transcript', 'read', async (req) => {
    const actor = actorOf(req.params);
    requireActor(req, actor);
    return transcriptJson(actor, await corral.transcript(actor));
  });

  route('GET', '/v1/events/:id', 'read', async (req) => {
    const id = parsed(EventParams, req.params, 'invalid_argument', 'event').id.toLowerCase();
    const status = await eventStatus(db, queues, id);
    // B6 of auth.ts: an event of an actor outside the token's is one that does not exist
    const outside = status.actor !== undefined && !actorInScope(tokenOf(req).actors, parseActorKey(status.actor));
    if (status.state === 'unknown' || outside) {
      throw new CorralError('not_found', `no event ${id}: never sent, or gone with the retention`, { details: { eventId: id } });
    }
    const turn = status.state === 'committed' ? await committedTurnOf(db, id) : undefined;
    return eventJson(id, status, turn);
  });

  route('GET', '/v1/actors/:agent_uid/:session_id/stream', 'read', async (req, reply) => {
    const actor = actorOf(req.params);
    requireActor(req, actor);
    const headers = parsed(StreamHeaders, req.headers, 'invalid_argument', 'header');
    const token = tokenOf(req);
    await streams.serve(req, reply, { live, actor, lastEventId: headers['last-event-id'], token: token.name, expiresAt: token.expiresAt });
  });

  // the chat page: public files, served without a token (the page asks for one)
  for (const file of uiFiles) {
    serve(file.path, {
      GET: { scope: null, handler: async (_req, reply) => reply.headers(UI_HEADERS).type(file.contentType).send(file.body) },
    });
  }

  // H8: loaded only when asked for
  const operatorConsole = opts.console
    ? await (
        await import('./console/index.ts')
      ).startConsole(app, opts.console, { db, corral, queues, live, streams, log, verifier, failures })
    : undefined;

  // S4 of streams.ts: one statement for all open streams' tokens
  const recheck = setInterval(() => {
    const names = streams.tokenNames();
    if (names.length === 0) return;
    liveApiTokenNames(db, names).then(
      (live) => streams.endUnauthorized(live),
      (e: unknown) => log.warn({ err: toError(e) }, 'could not check the tokens of open streams'),
    );
  }, keepAliveMs);
  recheck.unref();

  // H6: every connection counted, from its first byte; twice the cap are not even kept
  let connections = 0;
  app.server.on('connection', (socket) => {
    connections++;
    socket.once('close', () => connections--);
  });
  app.server.maxConnections = 2 * config.httpMaxConnections;

  try {
    await app.listen({ host: opts.host, port: opts.port });
  } catch (e) {
    clearInterval(recheck);
    await app.close().catch(() => undefined);
    await operatorConsole?.close();
    throw e;
  }
  const addr = app.server.address() as AddressInfo;
  const shownHost = addr.family === 'IPv6' ? `[${addr.address}]` : addr.address;
  const url = `http://${shownHost}:${addr.port}`;
  log.info(
    { url, ...(uiFiles.length > 0 ? { page: `${url}/` } : {}), ...(operatorConsole ? { console: `${url}/console` } : {}) },
    'HTTP API listening',
  );
  if (!isLoopback(addr.address)) {
    log.warn({ url }, 'the HTTP API listens beyond loopback and speaks plain HTTP: put a TLS proxy in front of it (docs/operations.md)');
  }
  let closed: Promise<void> | undefined;
  return {
    host: addr.address,
    port: addr.port,
    url,
    get streams() {
      return streams.size;
    },
    close() {
      closed ??= (async () => {
        closing = true;
        clearInterval(recheck);
        streams.endAll('the server closes');
        await app.close();
        await operatorConsole?.close();
      })();
      return closed;
    },
  };
}

function isJson(req: FastifyRequest): boolean {
  const type = req.headers['content-type'];
  return typeof type === 'string' && /^application\/json\s*(;|$)/i.test(type.trim());
}

function isLoopback(address: string): boolean {
  return address === '::1' || /^127\./.test(address) || /^::ffff:127\./.test(address);
}
