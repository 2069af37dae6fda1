/**
 * `corral outbox list | show | replay | discard`: the messages committed turns deliver to webhook
 * sinks (src/outbox/operations.ts). A replay sends dead or discarded messages again with their
 * `webhook-id` (receivers de-duplicate by it); a discard gives up on pending or dead ones (a
 * discarded message keeps its row and can be replayed).
 *
 * Exit codes: 0 done, 1 error, 2 bad arguments (filters without --all), 3 nothing matched (an
 * unknown id, filters that matched nothing). The database and the operations load only when a
 * command runs.
 */
import type { Command } from 'commander';
import type { Config } from '../../config.ts';
import { CorralError } from '../../base/errors.ts';
import type { OutboxActionResult, OutboxMessage, OutboxQuery } from '../../outbox/operations.ts';
import { intArg } from '../args.ts';
import { EXIT } from '../exit.ts';
import { withDatabase, type ConfigFn, type Io, type RunFn } from './table-commands.ts';

export interface OutboxFilterFlags {
  state?: string[];
  sink?: string;
  actor?: string;
  agent?: string;
}

export interface OutboxListFlags extends OutboxFilterFlags {
  limit?: number;
  before?: string;
  json?: boolean;
}

export interface OutboxActFlags extends OutboxFilterFlags {
  all?: boolean;
  json?: boolean;
}

const ops = () => import('../../outbox/operations.ts');

/** The query of the filter flags, checked before the database is opened (bad input → exit 2). */
async function queryOf(f: OutboxFilterFlags): Promise<OutboxQuery> {
  const { parseOutboxStates } = await ops();
  const q: OutboxQuery = {};
  if (f.state !== undefined) q.states = parseOutboxStates(f.state);
  if (f.sink !== undefined) q.sink = f.sink;
  if (f.actor !== undefined) q.actor = f.actor;
  if (f.agent !== undefined) q.agent = f.agent;
  return q;
}

const narrowed = (f: OutboxFilterFlags) => f.state !== undefined || f.sink !== undefined || f.actor !== undefined || f.agent !== undefined;

function ageOf(iso: string, nowMs: number): number {
  return Math.max(0, (nowMs - Date.parse(iso)) / 1000);
}

export async function runOutboxList(config: Config, flags: OutboxListFlags, io: Io): Promise<number> {
  const m = await ops();
  const query = await queryOf(flags);
  const opts = {
    ...query,
    ...(flags.limit !== undefined ? { limit: flags.limit } : {}),
    ...(flags.before !== undefined ? { before: m.parseOutboxId(flags.before, '--before') } : {}),
  };
  // the checks of the list itself (limit, actor, sink) before the database is opened
  m.outboxFilterOf(opts);
  const page = await withDatabase(config, (db) => m.listOutboxMessages(db, opts));
  const nothing = page.messages.length === 0 && (narrowed(flags) || flags.before !== undefined);
  if (flags.json) {
    io.out.write(`${JSON.stringify(page, null, 2)}\n`);
  } else if (page.messages.length === 0) {
    io.out.write(nothing ? 'no outbox messages match\n' : 'no outbox messages\n');
  } else {
    const { fmtAge, renderTable } = await import('./status.ts');
    const now = Date.now();
    io.out.write(
      renderTable(
        ['ID', 'STATE', 'SINK', 'ACTOR', 'WEBHOOK-ID', 'ATTEMPTS', 'LAST STATUS', 'AGE'],
        page.messages.map((d: OutboxMessage) => [
          String(d.id),
          d.state,
          d.sink,
          d.actor,
          d.webhookId,
          String(d.attempts),
          m.lastAnswer(d),
          fmtAge(ageOf(d.createdAt, now)),
        ]),
        80,
      ),
    );
    const n = page.messages.length;
    io.out.write(`${n} message${n === 1 ? '' : 's'}${page.next !== null ? `; more with --before ${page.next}` : ''}\n`);
  }
  return nothing ? EXIT.nothingMatched : EXIT.ok;
}

export async function runOutboxShow(config: Config, id: string, flags: { json?: boolean }, io: Io): Promise<number> {
  const m = await ops();
  const n = m.parseOutboxId(id);
  const d = await withDatabase(config, (db) => m.showOutboxMessage(db, n));
  if (flags.json) {
    io.out.write(`${JSON.stringify(d, null, 2)}\n`);
    return EXIT.ok;
  }
  const w = (k: string, v: string) => io.out.write(`${k.padEnd(14)}${v}\n`);
  w('message', String(d.id));
  w('state', m.describeDelivery(d));
  w('sink', d.sink);
  w('webhook-id', d.webhookId);
  w('actor', d.actor);
  w('event', d.eventId);
  w('turn', `${d.turnId} (deliver[${d.position}])`);
  w('created', d.createdAt);
  w('attempts', String(d.attempts));
  w('last status', d.lastStatus === null ? '-' : String(d.lastStatus));
  w('last error', d.lastError ?? '-');
  w('next attempt', d.state === 'pending' ? d.nextAttemptAt : '-');
  w('claimed', d.claimedBy ? `by ${d.claimedBy} until ${d.claimedUntil ?? '?'}` : '-');
  w('delivered', d.deliveredAt ?? '-');
  io.out.write(`body\n${indentBody(d.body)}\n`);
  return EXIT.ok;
}

/** The body as sent, indented; JSON pretty-printed (the exact bytes are in --json). */
function indentBody(body: string): string {
  let text = body;
  try {
    text = JSON.stringify(JSON.parse(body), null, 2);
  } catch {
    // not JSON: shown as it is
  }
  return text
    .split('\n')
    .map((l) => `  ${l}`)
    .join('\n');
}

export async function runOutboxAct(
  config: Config,
  action: OutboxActionResult['action'],
  ids: string[],
  flags: OutboxActFlags,
  io: Io,
): Promise<number> {
  const m = await ops();
  if (ids.length > 0 && (flags.all || narrowed(flags))) {
    throw new CorralError('invalid_argument', 'give message ids or --all (with filters), not both');
  }
  if (ids.length === 0 && !flags.all) {
    throw new CorralError(
      'invalid_argument',
      narrowed(flags)
        ? `${action} every message the filters match with --all (filters alone do nothing, so that a forgotten id cannot widen into a bulk ${action})`
        : `nothing to ${action}: give message ids, or --all (optionally with --state/--sink/--actor/--agent)`,
    );
  }
  const target = ids.length > 0 ? { ids: ids.map((id) => m.parseOutboxId(id)) } : { ...(await queryOf(flags)), all: true as const };
  if (!('ids' in target)) m.outboxFilterOf(target);
  const r = await withDatabase(config, (db) => m.actOnOutbox(db, action, target));
  if (flags.json) {
    io.out.write(`${JSON.stringify(r, null, 2)}\n`);
  } else {
    const verb = action === 'replay' ? 'replayed' : 'discarded';
    const takes = action === 'replay' ? 'dead or discarded' : 'pending or dead';
    if (r.done.length > 0) io.out.write(`${verb} ${r.done.length} message${r.done.length === 1 ? '' : 's'}: ${idList(r.done)}\n`);
    for (const s of r.skipped) io.out.write(`skipped ${s.id}: it is ${s.state} (${action} takes ${takes} messages)\n`);
    for (const id of r.notFound) io.out.write(`not found ${id}\n`);
    if (r.done.length === 0 && r.skipped.length === 0 && r.notFound.length === 0) io.out.write(`no messages match: nothing to ${action}\n`);
  }
  for (const s of r.disabledSinks) {
    io.err.write(`corral: sink ${s} is disabled: its replayed messages wait until corral sinks enable ${s}\n`);
  }
  return r.done.length === 0 || r.notFound.length > 0 ? EXIT.nothingMatched : EXIT.ok;
}

/** Ids in a line, at most 20 of them. */
function idList(ids: readonly number[]): string {
  return ids.length <= 20 ? ids.join(', ') : `${ids.slice(0, 20).join(', ')} … and ${ids.length - 20} more`;
}

const collect = (value: string, previous: string[] | undefined): string[] => [...(previous ?? []), value];

const filterOptions = (cmd: Command, what: string): Command =>
  cmd
    .option('--state <state>', `only ${what} in this state: pending, delivered, dead, discarded (repeat, or a comma list)`, collect)
    .option('--sink <name>', `only ${what} to this sink`)
    .option('--actor <agent_uid/session_id>', `only ${what} of this actor's turns`)
    .option('--agent <agent_uid>', `only ${what} of this agent's turns (every session)`);

const AFTER_LIST = `
Examples:
  corral outbox list
  corral outbox list --state dead --sink crm
  corral outbox list --state pending,dead --actor support/s-42 --json
  corral outbox list --limit 100 --before 5120`;

const AFTER_ACT = {
  replay: `
A replayed message is pending again, due at once, with a new set of retries and its webhook-id kept (a
receiver that had it already drops it again). A disabled sink's messages wait for corral sinks enable.

Examples:
  corral outbox replay 5120 5121
  corral outbox replay --all --sink crm --state dead
  corral outbox replay --all`,
  discard: `
A discarded message is never sent (again); one being sent right now may still arrive. It keeps
its row and can be replayed.

Examples:
  corral outbox discard 5120
  corral outbox discard --all --sink old-bridge --state pending`,
};

/** Adds `outbox list|show|replay|discard` under `program`. */
export function registerOutboxCommands(program: Command, config: ConfigFn, run: RunFn, io: Io): void {
  const cmd = program.command('outbox').description('the messages turns deliver to webhook sinks: list, show, replay, discard');
  filterOptions(cmd.command('list').description('list outbox messages, newest first'), 'messages')
    .option('--limit <n>', 'at most this many (1 to 1000)', intArg(1, 1000), 50)
    .option('--before <id>', 'only messages with a lower id (the next page)')
    .option('--json', 'JSON output: { messages, next }')
    .addHelpText('after', AFTER_LIST)
    .action((o: OutboxListFlags) => run(runOutboxList(config(), o, io)));
  cmd
    .command('show')
    .description('one message: its state, attempts, last status and error, next attempt, claim, and its body as sent')
    .argument('<id>', 'the message id (from corral outbox list)')
    .option('--json', 'JSON output (the body exactly as sent)')
    .action((id: string, o: { json?: boolean }) => run(runOutboxShow(config(), id, o, io)));
  for (const action of ['replay', 'discard'] as const) {
    const description =
      action === 'replay'
        ? 'send dead or discarded messages again (same webhook-id)'
        : 'give up on pending or dead messages: never sent (again)';
    filterOptions(cmd.command(action).description(description).argument('[ids...]', 'message ids'), 'messages')
      .option('--all', `${action} every message the filters match (or every one it takes)`)
      .option('--json', 'JSON output: { action, done, skipped, notFound, disabledSinks }')
      .addHelpText('after', AFTER_ACT[action])
      .action((ids: string[], o: OutboxActFlags) => run(runOutboxAct(config(), action, ids, o, io)));
  }
}
