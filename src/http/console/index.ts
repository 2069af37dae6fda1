/** The console as the HTTP API starts it (server.ts): its routes, and the pg-boss its dead-letter actions use. */
import type { FastifyInstance } from 'fastify';
import type { PgBoss } from 'pg-boss';
import type { Config } from '../../config.ts';
import { toError } from '../../base/errors.ts';
import type { Logger } from '../../base/logger.ts';
import type { TokenVerifier } from '../../ops/api-tokens.ts';
import type { AuthFailures } from '../auth.ts';
import type { ConsoleDeps, WorkerKeys } from './context.ts';
import { registerConsole } from './routes.ts';
import { DepthHistory } from './depth-history.ts';

export type { WorkerKeys, WorkerKeyView } from './context.ts';

/** What the console needs besides what the API has (ApiServerOptions.console). */
export interface ConsoleSettings {
  /** The database's URL: dead-letter replays run through a pg-boss of their own, started on first use. */
  databaseUrl: string;
  config: Config;
  /** The worker allow-list, when this process manages it (a daemon with CURVE on). */
  workerKeys?: WorkerKeys | undefined;
}

/** Registers the console on `app`; returns what stops its pg-boss. */
export async function startConsole(
  app: FastifyInstance,
  settings: ConsoleSettings,
  deps: Omit<ConsoleDeps, 'boss' | 'workerKeys' | 'deadLetterMode' | 'depthHistory'> & {
    verifier: TokenVerifier;
    failures: AuthFailures;
    log: Logger;
  },
): Promise<{ close(): Promise<void> }> {
  let boss: Promise<PgBoss> | undefined;
  const getBoss = (): Promise<PgBoss> => {
    boss ??= (async () => {
      const { createBoss } = await import('../../queue/boss.ts');
      const b = createBoss(settings.databaseUrl, settings.config, {
        max: 2,
        onError: (e) => deps.log.warn({ err: e.message }, 'pg-boss error (console)'),
      });
      await b.start();
      return b;
    })();
    boss.catch(() => (boss = undefined));
    return boss;
  };
  const depthHistory = new DepthHistory({ db: deps.db, queues: deps.queues, log: deps.log });
  await registerConsole(
    app,
    { ...deps, boss: getBoss, workerKeys: settings.workerKeys, deadLetterMode: settings.config.deadLetterMode, depthHistory },
    { verifier: deps.verifier, failures: deps.failures, bodyLimit: Math.min(settings.config.maxEventBytes, 1024 * 1024) * 2 + 16_384 },
  );
  depthHistory.start();
  return {
    async close() {
      depthHistory.stop();
      const b = await boss?.catch(() => undefined);
      await b?.stop({ graceful: false, close: true }).catch((e: unknown) => deps.log.warn({ err: toError(e) }, 'console pg-boss stop'));
    },
  };
}
