/**
 * `corral policy set | list | clear`: what an event sent to a busy actor does, per agent or per
 * actor (src/ops/input-policies.ts). Without one, an actor follows its agent's, else the daemon's
 * CORRAL_INPUT_POLICY (default `queue`).
 *
 * Exit codes: 0 done, 1 error, 2 bad arguments (target, policy), 3 nothing matched (`clear` of a
 * target without a policy). Light on purpose: the database and the operations load only when a
 * command runs, so `--help` and argument errors answer at once.
 */
import type { Command } from 'commander';
import type { Config } from '../../config.ts';
import type { BatchOptionsText } from '../../ops/input-policies.ts';
import { withDatabase, type ConfigFn, type Io, type RunFn } from './table-commands.ts';

const AFTER_SET = `
Policies:
  queue     each event becomes a turn of its own, after the ones before it (the default)
  coalesce  a turn takes every event waiting for the actor, in order (at most --max-events, 20 by
            default, and --max-bytes of payload); events sent while it runs go to the next turn,
            together. With --debounce, an idle actor's turn begins once no new event came for
            that long, but no later than --max-wait after the first
  interrupt an event sent while a turn runs interrupts it (the worker is told, its result no
            longer counts, its attempt is not spent) and the next turn takes the interrupted
            events with the new one; takes coalesce's options
  reject    while a turn runs or events wait, a send fails with actor_busy (corral send exits 4)
            and nothing is enqueued; an idle actor takes the event

Durations are written like 300ms, 5s, 2m.

Examples:
  corral policy set support-bot reject         # every session of support-bot
  corral policy set support-bot coalesce --debounce 300ms --max-wait 5s --max-events 20
  corral policy set support-bot/s-42 queue     # one actor: wins over its agent's policy
  corral policy list
  corral policy clear support-bot/s-42

A policy decides the sends after it is set; events already sent are not touched.`;

export type PolicySetFlags = BatchOptionsText & { json?: boolean };

export async function runPolicySet(config: Config, target: string, policy: string, flags: PolicySetFlags, io: Io): Promise<number> {
  const ops = await import('../../ops/input-policies.ts');
  const t = ops.parsePolicyTarget(target);
  const p = ops.parsePolicy(policy);
  const options = ops.parseBatchOptions(p, flags);
  const set = await withDatabase(config, (db) => ops.setPolicy(db, t, p, options));
  if (flags.json) {
    io.out.write(`${JSON.stringify(set, null, 2)}\n`);
    return 0;
  }
  const was = set.previous ?? (t.sessionId === null ? 'the default' : "its agent's or the default");
  const opts = ops.optionsText(set.options);
  io.out.write(`input policy of ${set.target}: ${set.policy}${opts ? ` (${opts})` : ''} (was: ${was})\n`);
  return 0;
}

export async function runPolicyList(config: Config, flags: { json?: boolean }, io: Io): Promise<number> {
  const ops = await import('../../ops/input-policies.ts');
  const { policies: list, default: fallback } = await withDatabase(config, (db) => ops.listPolicies(db));
  if (flags.json) {
    io.out.write(`${JSON.stringify({ policies: list, default: fallback }, null, 2)}\n`);
    return 0;
  }
  if (list.length === 0) {
    io.out.write(`no input policy set: every actor follows the default (${fallback}, the daemon's CORRAL_INPUT_POLICY)\n`);
    return 0;
  }
  const { fmtTime, renderTable } = await import('./status.ts');
  io.out.write(
    renderTable(
      ['TARGET', 'POLICY', 'OPTIONS', 'UPDATED'],
      list.map((r) => [
        r.sessionId === null ? `${r.agentUid} (every session)` : r.target,
        r.policy,
        ops.optionsText(r.options) || '-',
        fmtTime(new Date(r.updatedAt)),
      ]),
      130,
    ),
  );
  io.out.write(`actors not listed follow their agent's policy, else the default (${fallback}, the daemon's CORRAL_INPUT_POLICY)\n`);
  return 0;
}

export async function runPolicyClear(config: Config, target: string, io: Io): Promise<number> {
  const ops = await import('../../ops/input-policies.ts');
  const t = ops.parsePolicyTarget(target);
  const had = await withDatabase(config, (db) => ops.clearPolicy(db, t));
  const now = t.sessionId === null ? 'the default' : "its agent's, else the default";
  io.out.write(`input policy of ${ops.targetText(t)}: ${now} (was: ${had})\n`);
  return 0;
}

/** Adds `policy set|list|clear` under `program` (inheriting its error handling). */
export function registerPolicyCommands(program: Command, config: ConfigFn, run: RunFn, io: Io): void {
  const cmd = program
    .command('policy')
    .description('input policies: what an event sent to a busy actor does (queue, coalesce, interrupt, reject), per agent or per actor');

  cmd
    .command('set')
    .description("set the input policy of an agent (every session) or of one actor (wins over its agent's)")
    .argument('<target>', '<agent_uid> or <agent_uid>/<session_id>')
    .argument('<policy>', 'queue, coalesce, interrupt or reject')
    .option('--debounce <duration>', 'coalesce: an idle actor waits this long after each new event (e.g. 300ms)')
    .option('--max-wait <duration>', 'coalesce: but no longer than this after the first (needs --debounce; e.g. 5s)')
    .option('--max-events <n>', 'coalesce: at most this many events in one turn (1-100; default 20)')
    .option('--max-bytes <n>', "coalesce: at most this many bytes of the events' JSON in one turn (default: what a turn_start holds)")
    .option('--json', 'JSON output')
    .addHelpText('after', AFTER_SET)
    .action((target: string, policy: string, o: PolicySetFlags) => run(runPolicySet(config(), target, policy, o, io)));

  cmd
    .command('list')
    .description('list the input policies set (other actors follow the default, CORRAL_INPUT_POLICY)')
    .option('--json', 'JSON output')
    .action((o: { json?: boolean }) => run(runPolicyList(config(), o, io)));

  cmd
    .command('clear')
    .description("remove the input policy of an agent or actor: its agent's or the default applies again")
    .argument('<target>', '<agent_uid> or <agent_uid>/<session_id>')
    .action((target: string) => run(runPolicyClear(config(), target, io)));
}
