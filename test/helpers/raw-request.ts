/** One HTTP request sent exactly as written, for tests of what a server does with odd paths and bodies. */
import { request } from 'node:http';

/** A request sent as written (no client normalizing its path), with its status and body. */
export function rawRequest(
  url: string,
  opts: { method: string; headers?: Record<string, string>; body?: string },
): Promise<{ status: number; body: string }> {
  const { origin, pathname, search } = new URL(url);
  // new URL() resolves `..`: keep the path as the caller wrote it
  const path = url.slice(origin.length) || `${pathname}${search}`;
  return new Promise((done, fail) => {
    let answered = false;
    const req = request(`${origin}/`, { path, method: opts.method, headers: opts.headers }, (res) => {
      answered = true;
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => done({ status: res.statusCode ?? 0, body }));
      res.on('error', fail);
    });
    // a server that answered before it read the whole body (a 413) closes: the rest is not written
    req.on('error', (e) => {
      if (!answered) fail(e);
    });
    req.setTimeout(15_000, () => req.destroy(new Error(`no answer from ${url} within 15 s`)));
    req.end(opts.body);
  });
}
