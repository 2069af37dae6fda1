/**
 * The daemon's observability endpoints (node:http, no framework):
 *  - `GET /metrics`: Prometheus text format from the registry;
 *  - `GET /healthz`: 200 while the process serves requests (liveness: restart me if this fails);
 *  - `GET /readyz`: 200 when `ready()` says so (the daemon runs and the database answers), else 503
 *    with the reason (readiness: send me no traffic / alert).
 * Anything else is 404; methods other than GET/HEAD are 405.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Registry } from 'prom-client';
import { toError } from '../base/errors.ts';
import type { Logger } from '../base/logger.ts';

export interface Readiness {
  ready: boolean;
  reason?: string;
}

export interface ObservabilityServerOptions {
  host: string;
  /** 0 picks a free port (see `port` on the result). */
  port: number;
  registry: Registry;
  ready: () => Promise<Readiness>;
  /** Longest `/readyz` waits for `ready()`; default 2000 ms (then 503). */
  readyTimeoutMs?: number;
  logger?: Logger;
}

export interface ObservabilityServer {
  readonly host: string;
  readonly port: number;
  readonly url: string;
  close(): Promise<void>;
}

export async function startObservabilityServer(opts: ObservabilityServerOptions): Promise<ObservabilityServer> {
  const log = opts.logger?.child({ component: 'http' });
  const server = createServer((req, res) => {
    handle(opts, req, res).catch((e: unknown) => {
      log?.warn({ err: toError(e).message, path: req.url }, 'observability request failed');
      if (!res.headersSent) send(res, 500, 'text/plain; charset=utf-8', 'internal error\n');
      else res.destroy();
    });
  });
  server.keepAliveTimeout = 5_000;
  await listen(server, opts.port, opts.host);
  const addr = server.address() as AddressInfo;
  const host = addr.family === 'IPv6' ? `[${addr.address}]` : addr.address;
  let closed: Promise<void> | undefined;
  return {
    host: addr.address,
    port: addr.port,
    url: `http://${host}:${addr.port}`,
    close() {
      closed ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
      return closed;
    },
  };
}

function listen(server: Server, port: number, host: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const onError = (e: Error) => reject(e);
    server.once('error', onError);
    server.listen(port, host, () => {
      server.off('error', onError);
      resolve();
    });
  });
}

function send(res: ServerResponse, status: number, type: string, body: string): void {
  res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store', 'content-length': Buffer.byteLength(body) });
  res.end(res.req.method === 'HEAD' ? undefined : body);
}

async function handle(opts: ObservabilityServerOptions, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const path = new URL(req.url ?? '/', 'http://localhost').pathname;
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    res.setHeader('allow', 'GET, HEAD');
    send(res, 405, 'text/plain; charset=utf-8', 'method not allowed\n');
    return;
  }
  switch (path) {
    case '/metrics':
      send(res, 200, opts.registry.contentType, await opts.registry.metrics());
      return;
    case '/healthz':
      send(res, 200, 'text/plain; charset=utf-8', 'ok\n');
      return;
    case '/readyz': {
      const r = await readiness(opts);
      send(res, r.ready ? 200 : 503, 'text/plain; charset=utf-8', r.ready ? 'ready\n' : `not ready: ${r.reason ?? 'unknown'}\n`);
      return;
    }
    default:
      send(res, 404, 'text/plain; charset=utf-8', 'not found (try /metrics, /healthz, /readyz)\n');
  }
}

async function readiness(opts: ObservabilityServerOptions): Promise<Readiness> {
  const ms = opts.readyTimeoutMs ?? 2_000;
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      opts.ready(),
      new Promise<Readiness>((resolve) => {
        timer = setTimeout(() => resolve({ ready: false, reason: `readiness check timed out after ${ms} ms` }), ms);
      }),
    ]);
  } catch (e) {
    opts.logger?.warn({ err: toError(e).message }, 'readiness check failed');
    return { ready: false, reason: 'readiness check failed' };
  } finally {
    clearTimeout(timer);
  }
}
