/**
 * What the plan tests share (test/db/*-plans.test.ts, claim-plan): the statements a piece of code
 * runs, captured as they go out, and the nodes of an `EXPLAIN (format json)` plan.
 */
import pg from 'pg';

/** A statement as a connection sent it. */
export interface Captured {
  text: string;
  values: unknown[];
}

/** A node of an `EXPLAIN (format json)` plan, with the fields the tests read. */
export interface PlanNode {
  'Node Type': string;
  'Relation Name'?: string;
  'Index Name'?: string;
  'Index Cond'?: string;
  'Subplan Name'?: string;
  Plans?: PlanNode[];
}

/** `node` and every node under it. */
export const planNodes = (node: PlanNode): PlanNode[] => [node, ...(node.Plans ?? []).flatMap(planNodes)];

/** Records every statement the process's pg connections run while `fn` does (transaction control left out). */
export async function statementsOf(fn: () => Promise<unknown>): Promise<Captured[]> {
  const seen: Captured[] = [];
  const original = pg.Client.prototype.query;
  const patched = function (this: pg.Client, ...args: unknown[]) {
    const [first, second] = args as [unknown, unknown];
    if (typeof first === 'string') seen.push({ text: first, values: Array.isArray(second) ? second : [] });
    else if (first && typeof first === 'object' && 'text' in first) {
      const q = first as { text: string; values?: unknown[] };
      seen.push({ text: q.text, values: Array.isArray(second) ? second : (q.values ?? []) });
    }
    return (original as (...a: unknown[]) => unknown).apply(this, args);
  };
  pg.Client.prototype.query = patched as typeof original;
  try {
    await fn();
  } finally {
    pg.Client.prototype.query = original;
  }
  return seen.filter((s) => !/^\s*(set|begin|commit|rollback)\b/i.test(s.text));
}
