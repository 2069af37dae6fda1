/**
 * `corral shards list | set-url`, and `corral db migrate --shards N` (src/ops/shards.ts): the
 * shard map of a deployment whose actors are spread over N shards, each a pair of schemas
 * (docs/scaling.md, "Shards").
 *
 * Exit codes: 0 done, 1 error (the shard count fixed, a shard's database unreachable), 2 bad
 * arguments, 3 no such shard. Light on purpose: the database modules load only when a command runs.
 */
import type { Command } from 'commander';
import type { Config } from '../../config.ts';
import type { ConfigFn, Io, RunFn } from './table-commands.ts';

const AFTER_LIST = `
Each shard: its number, the database it lives in (the catalog's own when none is set), its two
schemas (corral's tables, pg-boss's), its actors, the events queued for them, and the emits its
turns made to other shards' actors that wait for delivery (with how many failed at least once: a
target shard that cannot be reached). The catalog is the database of DATABASE_URL (shard 0). A
shard whose database cannot be reached shows why.`;

const AFTER_SET_URL = `
Moves where the catalog looks for a shard; the shard's number, and so which actors it holds,
never changes. Copy the shard's two schemas to the new database first, with no daemon serving it
(docs/scaling.md, "Moving a shard"), then set its URL here; --catalog sets it back to the
catalog's own database. A URL's password is shown masked by corral shards list.

Examples:
  corral shards set-url 3 postgres://corral:secret@db-2.internal:5432/corral
  corral shards set-url 3 --catalog`;

async function catalogUrl(config: Config): Promise<string> {
  const { commandLogger, resolveDatabase } = await import('../context.ts');
  return (await resolveDatabase(config, commandLogger(config))).url;
}

export async function runShardsList(config: Config, flags: { json?: boolean }, io: Io): Promise<number> {
  const { listShards } = await import('../../ops/shards.ts');
  const { maskUrl } = await import('../../config.ts');
  const rows = await listShards(await catalogUrl(config), config);
  if (flags.json) {
    io.out.write(
      `${JSON.stringify(
        rows.map((r) => ({ ...r, url: r.url === null ? null : maskUrl(r.url) })),
        null,
        2,
      )}\n`,
    );
    return 0;
  }
  io.out.write('SHARD  SCHEMAS                 ACTORS   QUEUED  EMITS-OUT  DATABASE\n');
  for (const r of rows) {
    const schemas = `${r.schemas.corral}, ${r.schemas.boss}`;
    const where = r.url === null ? '(the catalog)' : maskUrl(r.url);
    const out = r.emitsFailing ? `${r.emitsOut} (${r.emitsFailing} failing)` : String(r.emitsOut ?? 0);
    const counts =
      r.error === undefined
        ? `${String(r.actors).padStart(6)}  ${String(r.queued).padStart(7)}  ${out.padStart(9)}`
        : `     -        -          -`;
    io.out.write(`${String(r.shard).padStart(5)}  ${schemas.padEnd(22)}  ${counts}  ${where}${r.error ? `  (${r.error})` : ''}\n`);
  }
  return 0;
}

export async function runShardsSetUrl(
  config: Config,
  shardText: string,
  url: string | undefined,
  flags: { catalog?: boolean },
  io: Io,
): Promise<number> {
  const ops = await import('../../ops/shards.ts');
  const { CorralError } = await import('../../base/errors.ts');
  const shard = ops.parseShardNumber(shardText);
  if ((url === undefined) === (flags.catalog !== true)) {
    throw new CorralError('invalid_argument', "give the shard a URL, or --catalog for the catalog's own database (not both)");
  }
  if (shard === 0) throw new CorralError('invalid_argument', 'shard 0 is the catalog itself: its database is DATABASE_URL');
  const target = url === undefined ? null : ops.parseShardUrl(url);
  await ops.setShardUrl(await catalogUrl(config), shard, target);
  const { maskUrl } = await import('../../config.ts');
  io.err.write(`shard ${shard}: ${target === null ? "the catalog's own database" : maskUrl(target)}\n`);
  return 0;
}

export function registerShardsCommands(program: Command, config: ConfigFn, run: RunFn, io: Io): void {
  const cmd = program.command('shards').description('the shards of a deployment (corral db migrate --shards N): list, set-url');
  cmd
    .command('list')
    .description('list the shards: number, schemas, actors, queued events, emits waiting for other shards, database')
    .option('--json', 'JSON output')
    .addHelpText('after', AFTER_LIST)
    .action((o: { json?: boolean }) => run(runShardsList(config(), o, io)));
  cmd
    .command('set-url')
    .description("set the database a shard lives in (the catalog's own with --catalog)")
    .argument('<shard>', 'the shard number, 1 to 1023')
    .argument('[url]', 'postgres://user:password@host:port/database')
    .option('--catalog', "the catalog's own database")
    .addHelpText('after', AFTER_SET_URL)
    .action((shard: string, url: string | undefined, o: { catalog?: boolean }) => run(runShardsSetUrl(config(), shard, url, o, io)));
}
