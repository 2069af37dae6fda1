/**
 * `corral dlq list | show | replay | discard`: the dead-letter queue for operators (also behind
 * `npm run dlq:inspect` and `npm run dlq:replay`, see scripts/).
 *
 * Exit codes: 0 done, 1 error, 2 bad arguments (also: a bulk action without --yes), 3 nothing
 * matched (unknown id, filters matched nothing).
 */
import { parseActorKey } from '../../base/actor-key.ts';
import type { Config } from '../../config.ts';
import { CorralError } from '../../base/errors.ts';
import { describeActivation } from '../../ops/actor-state.ts';
import { parseDurationMs } from '../../base/duration.ts';
import {
  assertJobId,
  discardDeadLetters,
  errorLine,
  listDeadLetters,
  replayDeadLetters,
  selectDeadLetters,
  showDeadLetter,
  type ActionResult,
  type DeadLetter,
  type DeadLetterFilter,
} from '../../ops/dead-letters.ts';
import { queuesOf } from '../../queue/names.ts';
import { openCommandContext } from '../context.ts';
import { EXIT } from '../exit.ts';
import { fmtTime, renderTable } from './status.ts';

export interface Io {
  out: NodeJS.WritableStream;
  err: NodeJS.WritableStream & { isTTY?: boolean; columns?: number };
}

export interface FilterFlags {
  actor?: string;
  since?: string;
  error?: string;
}

/** Validates filter flags before anything touches the database (bad input → exit 2). */
export function parseFilter(f: FilterFlags): DeadLetterFilter {
  const filter: DeadLetterFilter = {};
  if (f.actor !== undefined) filter.actor = parseActorKey(f.actor);
  if (f.since !== undefined) filter.sinceMs = parseDurationMs(f.since, '--since duration');
  if (f.error !== undefined) {
    if (f.error.trim() === '') throw new CorralError('invalid_argument', '--error needs some text to match');
    filter.error = f.error;
  }
  return filter;
}

const hasFilter = (f: DeadLetterFilter) => f.actor !== undefined || f.sinceMs !== undefined || f.error !== undefined;

function deadLetterRows(list: readonly DeadLetter[]): string[][] {
  return list.map((d) => [
    d.id,
    d.actor,
    d.eventId,
    fmtTime(d.enqueuedAt),
    fmtTime(d.failedAt),
    String(d.attempts),
    errorLine(d.lastError),
  ]);
}

const DL_HEADERS = ['ID', 'ACTOR', 'EVENT', 'ENQUEUED', 'FAILED', 'ATTEMPTS', 'LAST ERROR'];

// ---- list ------------------------------------------------------------------------------------

export interface ListFlags extends FilterFlags {
  limit: number;
  after?: string;
  json?: boolean;
}

export async function runDlqList(config: Config, flags: ListFlags, io: Io): Promise<number> {
  const filter = parseFilter(flags);
  if (flags.after !== undefined) assertJobId(flags.after, '--after id');
  const ctx = await openCommandContext(config, { connections: 1 });
  try {
    const list = await listDeadLetters(ctx.database.db, queuesOf(config), filter, {
      limit: flags.limit,
      ...(flags.after !== undefined ? { after: flags.after } : {}),
    });
    const next = list.length === flags.limit ? list.at(-1)!.id : null;
    const nothing = list.length === 0 && (hasFilter(filter) || flags.after !== undefined);
    if (flags.json) {
      io.out.write(`${JSON.stringify({ deadLetters: list, next }, null, 2)}\n`);
    } else if (list.length === 0) {
      io.out.write(nothing ? 'no dead letters match\n' : 'no dead letters\n');
    } else {
      io.out.write(renderTable(DL_HEADERS, deadLetterRows(list), 80));
      io.out.write(`${list.length} dead letter${list.length === 1 ? '' : 's'}${next ? `; more with --after ${next}` : ''}\n`);
    }
    return nothing ? EXIT.nothingMatched : EXIT.ok;
  } finally {
    await ctx.close();
  }
}

// ---- show ------------------------------------------------------------------------------------

export async function runDlqShow(config: Config, id: string, flags: { json?: boolean }, io: Io): Promise<number> {
  assertJobId(id);
  const ctx = await openCommandContext(config, { connections: 1 });
  try {
    const d = await showDeadLetter(ctx.database.db, queuesOf(config), id);
    if (flags.json) {
      io.out.write(`${JSON.stringify(d, null, 2)}\n`);
      return 0;
    }
    const { deadLetter: dl, actor } = d;
    const w = (k: string, v: string) => io.out.write(`${k.padEnd(13)}${v}\n`);
    w('dead letter', dl.id);
    w('event', dl.eventId);
    w('actor', dl.actor);
    w('enqueued', fmtTime(dl.enqueuedAt));
    w('failed', fmtTime(dl.failedAt));
    w('attempts', String(dl.attempts));
    w('last error', errorLine(dl.lastError) || '-');
    io.out.write(`payload\n${indent(JSON.stringify(dl.payload ?? null, null, 2))}\n`);
    io.out.write(`attempt errors (${d.attempts.length} turn${d.attempts.length === 1 ? '' : 's'})\n`);
    if (d.attempts.length > 0) {
      io.out.write(
        indent(
          renderTable(
            ['ATTEMPT', 'STATUS', 'EPOCH', 'WORKER', 'STARTED', 'ERROR'],
            d.attempts.map((t) => [
              String(t.attempt),
              t.status,
              String(t.epoch),
              t.workerId ?? '-',
              fmtTime(t.startedAt),
              t.error ? errorLine(t.error) : '',
            ]),
            100,
          ).trimEnd(),
        ) + '\n',
      );
    }
    io.out.write('actor state\n');
    const blocked = actor.blockedByEventId
      ? `yes, by event ${actor.blockedByEventId}${actor.blockedByEventId === dl.eventId ? ' (this one)' : ''}`
      : 'no';
    io.out.write(`  blocked      ${blocked}\n`);
    const a = actor.activation;
    io.out.write(`  activation   ${a ? describeActivation(a, fmtTime) : 'none'}\n`);
    const pending = actor.pendingEvents;
    io.out.write(
      `  queue depth  ${pending.length} pending event${pending.length === 1 ? '' : 's'}${
        pending.length ? ` (${summarise(pending.map((p) => p.state))})` : ''
      }\n`,
    );
    io.out.write(`  dead letters ${actor.deadLetters.length}\n`);
    if (d.history.length > 0) {
      io.out.write('history\n');
      for (const h of d.history) {
        io.out.write(`  ${fmtTime(h.actedAt)} ${h.action} of ${h.deadLetterId}: ${h.outcome}\n`);
      }
    }
    return 0;
  } finally {
    await ctx.close();
  }
}

function indent(text: string, by = '  '): string {
  return text
    .split('\n')
    .map((l) => (l ? by + l : l))
    .join('\n');
}

function summarise(states: string[]): string {
  const n = new Map<string, number>();
  for (const s of states) n.set(s, (n.get(s) ?? 0) + 1);
  return [...n].map(([s, c]) => `${c} ${s}`).join(', ');
}

// ---- replay / discard ------------------------------------------------------------------------

export interface ActFlags extends FilterFlags {
  all?: boolean;
  yes?: boolean;
  json?: boolean;
}

const VERB = {
  replay: { verb: 'replay', done: 'replayed' },
  discard: { verb: 'discard', done: 'discarded' },
} as const;

/** How many plan lines to print before "… and N more". */
const PLAN_LINES = 50;

export async function runDlqAct(config: Config, action: 'replay' | 'discard', ids: string[], flags: ActFlags, io: Io): Promise<number> {
  const filter = parseFilter(flags);
  const bulk = flags.all === true || hasFilter(filter);
  if (ids.length > 0 && bulk) {
    throw new CorralError('invalid_argument', `give dead letter ids or --all/filters, not both`);
  }
  if (ids.length === 0 && !bulk) {
    throw new CorralError(
      'invalid_argument',
      `nothing to ${action}: give dead letter ids, or --all (optionally with --actor/--since/--error)`,
    );
  }
  for (const id of ids) assertJobId(id);
  const ctx = await openCommandContext(config);
  try {
    const q = queuesOf(config);
    let targets = ids;
    if (bulk) {
      const selected = await selectDeadLetters(ctx.database.db, q, filter);
      if (selected.length === 0) {
        if (flags.json) io.out.write(`${JSON.stringify({ action, results: [], summary: {} }, null, 2)}\n`);
        io.err.write(`corral: no dead letters match: nothing to ${action}\n`);
        return EXIT.nothingMatched;
      }
      const actors = new Set(selected.map((d) => d.actor)).size;
      if (!flags.yes) {
        printPlan(io.err, action, selected, actors, config);
        io.err.write(`corral: refusing to ${action} ${selected.length} dead letter(s) without --yes: add --yes to proceed\n`);
        return EXIT.usage;
      }
      targets = selected.map((d) => d.id);
    }
    const boss = await ctx.boss();
    const progress = bulk || targets.length > 1 ? progressReporter(io.err, VERB[action].verb) : undefined;
    const deps = { db: ctx.database.db, boss, queues: q };
    const run = action === 'replay' ? replayDeadLetters : discardDeadLetters;
    const results = await run(deps, targets, progress ? { onProgress: progress.update } : {});
    progress?.finish();
    printResults(io, action, results, flags.json === true);
    return results.some((r) => r.status === 'not_found') ? EXIT.nothingMatched : EXIT.ok;
  } finally {
    await ctx.close();
  }
}

function printPlan(
  err: NodeJS.WritableStream,
  action: 'replay' | 'discard',
  selected: readonly DeadLetter[],
  actors: number,
  config: Config,
): void {
  const what =
    action === 'replay'
      ? 'put back on their actors, in their original order'
      : `deleted (payloads kept in corral.dead_letter_actions${config.deadLetterMode === 'block' ? '; failed originals holding their actors are deleted too' : ''})`;
  err.write(`would ${action} ${selected.length} dead letter(s) of ${actors} actor(s), ${what}:\n`);
  err.write(renderTable(DL_HEADERS, deadLetterRows(selected.slice(0, PLAN_LINES)), 80));
  if (selected.length > PLAN_LINES) err.write(`… and ${selected.length - PLAN_LINES} more\n`);
}

function printResults(io: Io, action: 'replay' | 'discard', results: ActionResult[], json: boolean): void {
  const summary: Record<string, number> = {};
  for (const r of results) summary[r.status] = (summary[r.status] ?? 0) + 1;
  if (json) {
    io.out.write(`${JSON.stringify({ action, results, summary }, null, 2)}\n`);
    return;
  }
  for (const r of results) {
    const where = r.eventId ? ` event ${r.eventId} of ${r.actor}` : '';
    const detail = r.outcome ? ` (${r.outcome}${r.unblocked ? ', actor unblocked' : ''})` : '';
    const status = r.status.replace('_', ' ');
    io.out.write(`${status.padEnd(17)} ${r.id}${where}${detail}\n`);
  }
  const parts = Object.entries(summary).map(([s, n]) => `${n} ${s.replace('_', ' ')}`);
  io.out.write(`${VERB[action].verb}: ${parts.join(', ')}\n`);
}

/**
 * A progress bar on a TTY (redrawn in place, at most every 100 ms), plain lines otherwise (logs,
 * CI): one per tenth of the way and the last one.
 */
export function progressReporter(err: Io['err'], label: string): { update: (done: number, total: number) => void; finish: () => void } {
  const tty = err.isTTY === true;
  let lastDone = -1;
  let lastDrawMs = 0;
  let drawn = false;
  return {
    update(done, all) {
      if (done === lastDone) return;
      const final = done >= all;
      if (tty) {
        const now = Date.now();
        if (!final && now - lastDrawMs < 100) return;
        lastDrawMs = now;
        const width = Math.max(10, Math.min(40, (err.columns ?? 80) - 30));
        const filled = all === 0 ? width : Math.round((done / all) * width);
        err.write(`\r${label} [${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${done}/${all}`);
        drawn = true;
      } else {
        const tenth = (n: number) => Math.floor((n * 10) / Math.max(1, all));
        if (!final && lastDone >= 0 && tenth(done) === tenth(lastDone)) return;
        err.write(`${label}: ${done}/${all}\n`);
      }
      lastDone = done;
    },
    finish() {
      if (tty && drawn) err.write('\n');
    },
  };
}
