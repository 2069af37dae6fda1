/**
 * The operator console at `/console` (docs/console.md): server-rendered pages (html.ts escapes
 * everything they show), one small script and a style sheet from memory (assets.ts), under the
 * chat page's strict Content-Security-Policy (but forms may post to the console itself).
 *
 *  R1 Every route is registered here, in one Fastify scope: its own body parsers (forms and
 *     JSON, at most `bodyLimit` bytes), its own error handler (a page for a browser, JSON for an
 *     API caller; a browser that is not signed in is sent to the sign-in page).
 *  R2 Every signed-in route runs A1-A2 of auth.ts before anything else; every write checks the
 *     CSRF token (A2) and its body with a zod schema before it acts, and acts only through the
 *     operations the CLI uses.
 *  R3 Every list is a keyset page, at most `MAX_PAGE` rows (src/db/operations/console-*.ts).
 */
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { CorralError, toError } from '../../base/errors.ts';
import type { TokenVerifier } from '../../ops/api-tokens.ts';
import { closeSession, openSession, useSignInCode } from '../../ops/console-sessions.ts';
import { cameOverHttps, type AuthFailures } from '../auth.ts';
import { httpErrorOf } from '../errors.ts';
import { CONSOLE_CSS, CONSOLE_ICON, CONSOLE_JS } from './assets.ts';
import { consoleCookie, CONSOLE_COOKIE, cookieOf, requireAdmin, requireSameOrigin } from './auth.ts';
import { check, fieldsOf, type Fields, type Guard } from './forms.ts';
import { CONSOLE_HEADERS, type ConsoleDeps, wantsJson } from './context.ts';
import { markup } from './html.ts';
import { page } from './layout.ts';
import { registerActorRoutes } from './actor.ts';
import { registerListRoutes } from './lists.ts';
import { registerOpsRoutes } from './ops-views.ts';

const SignInBody = z.object({
  code: z.string().max(64).optional(),
  token: z.string().max(128).optional(),
});

export interface ConsoleOptions {
  verifier: TokenVerifier;
  failures: AuthFailures;
  /** The largest body a console form may post. */
  bodyLimit: number;
}

export async function registerConsole(app: FastifyInstance, deps: ConsoleDeps, opts: ConsoleOptions): Promise<void> {
  await app.register(async (scope) => {
    const limit = opts.bodyLimit;
    scope.addContentTypeParser('application/x-www-form-urlencoded', { parseAs: 'string', bodyLimit: limit }, (_req, body, done) => {
      // no prototype: a field named __proto__ is a field like any other
      const fields = Object.create(null) as Fields;
      for (const [k, v] of new URLSearchParams(body as string)) {
        const had = fields[k];
        fields[k] = had === undefined ? v : Array.isArray(had) ? [...had, v] : [had, v];
      }
      done(null, fields);
    });
    scope.removeContentTypeParser('application/json');
    scope.addContentTypeParser('application/json', { parseAs: 'string', bodyLimit: limit }, (_req, body, done) => {
      try {
        done(null, body === '' ? {} : JSON.parse(body as string));
      } catch (e) {
        done(new CorralError('invalid_json', `the request body is not JSON: ${toError(e).message}`), undefined);
      }
    });

    // R1: a browser gets a page, a browser not signed in the sign-in page, an API caller JSON
    scope.setErrorHandler(async (e, req, reply) => {
      const failure = httpErrorOf(e, limit);
      if (failure.log)
        deps.log.error(
          { method: req.method, route: req.routeOptions.url ?? null, err: failure.log.cause ?? failure.log },
          'console request failed',
        );
      const browser = !wantsJson(req) && req.headers.authorization === undefined;
      if (browser && failure.status === 401 && req.method === 'GET') {
        return reply.code(303).header('location', '/console/sign-in').send();
      }
      if (!browser) return reply.code(failure.status).headers(failure.headers).type('application/json; charset=utf-8').send(failure.body);
      const body = markup`<h1>${String(failure.status)}: ${failure.body.error.code}</h1>
        <div class="error" id="error">${failure.body.error.message}</div>
        <p>${failure.status === 401 ? markup`<a href="/console/sign-in">Sign in</a>` : markup`<a href="/console">Back to the console</a>`}</p>`;
      return reply
        .code(failure.status)
        .headers({ ...CONSOLE_HEADERS, ...failure.headers })
        .type('text/html; charset=utf-8')
        .send(page({ title: 'Error', here: '', viewer: undefined, body }).text);
    });

    // the two static files: public, like the sign-in page
    const asset = (path: string, type: string, body: string) =>
      scope.get(path, async (_req, reply) => reply.headers(CONSOLE_HEADERS).type(type).send(body));
    asset('/console/assets/console.css', 'text/css; charset=utf-8', CONSOLE_CSS);
    asset('/console/assets/console.js', 'text/javascript; charset=utf-8', CONSOLE_JS);
    asset('/console/assets/icon.svg', 'image/svg+xml', CONSOLE_ICON);

    scope.get('/console/sign-in', async (_req, reply) => {
      const body = markup`<h1>Sign in</h1>
        <form method="post" action="/console/sign-in" class="panel" id="sign-in-code"><input type="hidden" name="code" value="" /></form>
        <form method="post" action="/console/sign-in" class="panel" id="sign-in">
          <label
            >An API token with the admin scope (corral tokens create NAME --scope admin)
            <input type="password" name="token" id="token" autocomplete="off" required maxlength="128"
          /></label>
          <button id="sign-in-button">Sign in</button>
          <p class="muted">Or open the one-time link <code>corral console --token NAME</code> prints.</p>
        </form>`;
      return reply
        .headers(CONSOLE_HEADERS)
        .type('text/html; charset=utf-8')
        .send(page({ title: 'Sign in', here: '', viewer: undefined, body }).text);
    });

    scope.post('/console/sign-in', async (req, reply) => {
      opts.failures.check(req.ip);
      requireSameOrigin(req);
      const { code, token } = check(SignInBody, req.body ?? {}, 'sign-in');
      let tokenName: string | undefined;
      if (code) tokenName = await useSignInCode(deps.db, code);
      else if (token) {
        const t = await opts.verifier.verify(token.trim());
        if (t && !t.scopes.includes('admin')) {
          throw new CorralError(
            'forbidden',
            `the token ${t.name} has no scope admin (its scopes: ${t.scopes.join(', ')}): the console needs an admin token`,
            {
              details: { scope: 'admin' },
            },
          );
        }
        tokenName = t?.name;
      }
      const session = tokenName === undefined ? undefined : await openSession(deps.db, tokenName);
      if (!session) {
        opts.failures.failed(req.ip);
        throw new CorralError(
          'unauthorized',
          code
            ? 'the sign-in link is not valid (used, expired, or its token revoked)'
            : 'the token is not valid (unknown, revoked or expired)',
          {
            details: { tokenGiven: true },
          },
        );
      }
      deps.log.info({ token: tokenName, via: code ? 'sign-in link' : 'token' }, 'console sign-in');
      const maxAge = (session.expiresAt.getTime() - Date.now()) / 1000;
      return reply
        .code(303)
        .header('set-cookie', consoleCookie(session.secret, maxAge, cameOverHttps(req)))
        .header('location', '/console')
        .send();
    });

    const guard: Guard = requireAdmin(deps.db, opts.verifier, opts.failures);

    scope.post('/console/sign-out', { onRequest: guard }, async (req, reply) => {
      fieldsOf(req);
      const secret = cookieOf(req.headers.cookie, CONSOLE_COOKIE);
      if (secret) await closeSession(deps.db, secret);
      return reply
        .code(303)
        .header('set-cookie', consoleCookie(undefined, 0, cameOverHttps(req)))
        .header('location', '/console/sign-in')
        .send();
    });

    registerListRoutes(scope, deps, guard);
    registerActorRoutes(scope, deps, guard);
    registerOpsRoutes(scope, deps, guard);
  });
}
