/**
 * `corral retention set | list | clear`: how long each agent's transcript is kept
 * (src/ops/transcript-retention.ts). Without a policy an agent's transcript is kept forever; the
 * daemon's retention sweep (every minute) deletes what a policy lets go.
 *
 * Exit codes: 0 done, 1 error, 2 bad arguments (agent uid, duration), 3 nothing matched (`clear`
 * of an agent without a policy). Light on purpose: the database and the operations load only
 * when a command runs, so `--help` and argument errors answer at once.
 */
import type { Command } from 'commander';
import type { Config } from '../../config.ts';
import { withDatabase, type ConfigFn, type Io, type RunFn } from './table-commands.ts';

const AFTER_SET = `
Examples:
  corral retention set support-bot 90d    # forget support-bot's turns 90 days after they finished
  corral retention set triage 12h
  corral retention set triage 1d12h       # also: 30m, 2w, P90D

The window counts from when a turn finished; the daemon's retention sweep deletes the turn with
its messages within about a minute after. Turns still running are never deleted.`;

export async function runRetentionSet(config: Config, agent: string, duration: string, flags: { json?: boolean }, io: Io): Promise<number> {
  const ops = await import('../../ops/transcript-retention.ts');
  const agentUid = ops.parseAgentUid(agent);
  const keepSeconds = ops.parseKeepSeconds(duration);
  const set = await withDatabase(config, (db) => ops.setRetention(db, agentUid, keepSeconds));
  if (flags.json) {
    io.out.write(`${JSON.stringify(set, null, 2)}\n`);
    return 0;
  }
  const was = set.previousKeepSeconds === null ? 'kept forever' : `kept ${ops.formatKeep(set.previousKeepSeconds)}`;
  io.out.write(`transcripts of agent ${agentUid}: kept ${set.keep} after each turn finished (was: ${was})\n`);
  return 0;
}

export async function runRetentionList(config: Config, flags: { json?: boolean }, io: Io): Promise<number> {
  const ops = await import('../../ops/transcript-retention.ts');
  const list = await withDatabase(config, (db) => ops.listRetention(db));
  if (flags.json) {
    io.out.write(`${JSON.stringify({ retention: list }, null, 2)}\n`);
    return 0;
  }
  if (list.length === 0) {
    io.out.write('no transcript retention set: every agent keeps its transcript forever\n');
    return 0;
  }
  const { fmtTime, renderTable } = await import('./status.ts');
  io.out.write(
    renderTable(
      ['AGENT', 'KEEP', 'SECONDS', 'UPDATED'],
      list.map((r) => [r.agentUid, r.keep, String(r.keepSeconds), fmtTime(new Date(r.updatedAt))]),
      130,
    ),
  );
  io.out.write('agents not listed keep their transcripts forever\n');
  return 0;
}

export async function runRetentionClear(config: Config, agent: string, io: Io): Promise<number> {
  const ops = await import('../../ops/transcript-retention.ts');
  const agentUid = ops.parseAgentUid(agent);
  const had = await withDatabase(config, (db) => ops.clearRetention(db, agentUid));
  io.out.write(`transcripts of agent ${agentUid}: kept forever (was: kept ${ops.formatKeep(had)})\n`);
  return 0;
}

/** Adds `retention set|list|clear` under `program` (inheriting its error handling). */
export function registerRetentionCommands(program: Command, config: ConfigFn, run: RunFn, io: Io): void {
  const cmd = program
    .command('retention')
    .description("transcript retention per agent: how long an agent's turns and messages are kept (default: forever)");

  cmd
    .command('set')
    .description("keep an agent's transcript for a window: its turns that finished longer ago are deleted, with their messages")
    .argument('<agent_uid>', 'the agent (every session of it)')
    .argument('<duration>', 'the window: 90d, 12h, 30m, 1d12h, 2w or ISO 8601 (P90D); whole seconds')
    .option('--json', 'JSON output')
    .addHelpText('after', AFTER_SET)
    .action((agent: string, duration: string, o: { json?: boolean }) => run(runRetentionSet(config(), agent, duration, o, io)));

  cmd
    .command('list')
    .description('list the agents with a transcript retention (the others keep their transcripts forever)')
    .option('--json', 'JSON output')
    .action((o: { json?: boolean }) => run(runRetentionList(config(), o, io)));

  cmd
    .command('clear')
    .description("remove an agent's transcript retention: its transcript is kept forever again (what was deleted stays deleted)")
    .argument('<agent_uid>', 'the agent')
    .action((agent: string) => run(runRetentionClear(config(), agent, io)));
}
