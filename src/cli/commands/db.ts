/** `corral db migrate | stop`: apply migrations; stop the embedded PostgreSQL. */
import type { Config } from '../../config.ts';
import { stopEmbeddedPostgres } from '../../db/postgres/embedded.ts';
import { createBoss, setUpDatabase } from '../../queue/boss.ts';
import { commandLogger, resolveDatabase } from '../context.ts';

export async function runMigrateCommand(config: Config, out: NodeJS.WritableStream, flags: { shards?: number } = {}): Promise<number> {
  const logger = commandLogger(config);
  const { url } = await resolveDatabase(config, logger);
  // pg-boss migrates its own schema on start; the queues (kept as a daemon set them, if one did)
  // carry the SQL enqueue, corral.send_event.
  const boss = createBoss(url, config);
  try {
    await setUpDatabase(url, boss, config, { updateExisting: false, installFunctions: true });
  } finally {
    await boss.stop({ graceful: false, close: true });
  }
  out.write('migrations applied (corral schema and pg-boss schema)\n');
  if (flags.shards !== undefined) {
    const { migrateShards } = await import('../../ops/shards.ts');
    const { maskUrl } = await import('../../config.ts');
    await migrateShards(url, flags.shards, config, (shard, at, what) => out.write(`shard ${shard}: ${what} (${maskUrl(at)})\n`));
    out.write(`${flags.shards} shard${flags.shards === 1 ? '' : 's'}: corral shards list shows them\n`);
  }
  return 0;
}

export async function runStopEmbeddedCommand(config: Config, out: NodeJS.WritableStream): Promise<number> {
  const stopped = await stopEmbeddedPostgres(config.homeDir, { rootDir: config.embeddedRootDir });
  out.write(stopped ? `stopped the embedded PostgreSQL in ${config.homeDir}\n` : 'the embedded PostgreSQL is not running\n');
  return 0;
}
