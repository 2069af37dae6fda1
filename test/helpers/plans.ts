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

/** A parameter as pg sends it: arrays as array literals, objects as JSON. */
const literalOf = (v: unknown): string =>
  Array.isArray(v) ? `{${v.map((x) => `"${String(x)}"`).join(',')}}` : typeof v === 'object' ? JSON.stringify(v) : String(v);

/**
 * The plan `c` would run `s` with as a daemon connection plans it (`force_generic_plan`), in a
 * transaction rolled back after.
 */
export async function genericPlan(c: pg.Client, s: Captured): Promise<PlanNode> {
  await c.query('begin');
  try {
    await c.query('set local plan_cache_mode = force_generic_plan');
    await c.query(`prepare captured_plan as ${s.text}`);
    const params = s.values.map((v) => (v === null ? 'null' : `'${literalOf(v).replaceAll("'", "''")}'`));
    const r = await c.query<{ 'QUERY PLAN': { Plan: PlanNode }[] }>(
      `explain (format json) execute captured_plan${params.length ? `(${params.join(', ')})` : ''}`,
    );
    return r.rows[0]!['QUERY PLAN'][0]!.Plan;
  } finally {
    await c.query('rollback');
    // a prepared statement outlives the transaction
    await c.query('deallocate captured_plan').catch(() => undefined);
  }
}
