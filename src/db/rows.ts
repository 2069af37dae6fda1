/**
 * Rows of statements written as SQL text (`db.execute`, named statements): their columns come
 * back under their SQL names and, through Drizzle's `execute`, timestamps as text. These turn
 * them into the schema's row types, from the schema itself, so a column change is made once.
 */
import { getTableColumns, sql, type Column, type InferSelectModel, type SQL, type Table } from './orm.ts';
import pg from 'pg';

const parseTimestamptz = pg.types.getTypeParser(pg.types.builtins.TIMESTAMPTZ) as (v: string) => Date;

/** A timestamp column of a raw row as a Date (null stays null), parsed as node-postgres would. */
export function toDate(v: unknown): Date | null {
  if (v === null || v === undefined) return null;
  if (v instanceof Date) return v;
  return parseTimestamptz(String(v));
}

const columnLists = new WeakMap<Table, [string, Column][]>();

/** The table's columns as [property, column] pairs (computed once per table: this runs per row). */
function columnsOf(table: Table): [string, Column][] {
  let list = columnLists.get(table);
  if (!list) {
    list = Object.entries(getTableColumns(table));
    columnLists.set(table, list);
  }
  return list;
}

/**
 * A raw row of `table` (SQL column names, each with `prefix` when given) as the schema's row type,
 * each value mapped by its column.
 */
export function fromRawRow<T extends Table>(table: T, raw: Record<string, unknown>, prefix = ''): InferSelectModel<T> {
  const out: Record<string, unknown> = {};
  for (const [key, column] of columnsOf(table)) {
    const v = raw[prefix + column.name];
    out[key] = v === null || v === undefined ? null : column.mapFromDriverValue(v);
  }
  return out as InferSelectModel<T>;
}

/**
 * A select list of every column of `table` under the SQL alias `alias`, each named `prefix` +
 * its column name: two tables' rows in one raw row, read back with `fromRawRow(table, row, prefix)`.
 */
export function prefixedColumns(table: Table, alias: string, prefix: string): SQL {
  return sql.raw(
    columnsOf(table)
      .map(([, c]) => `${alias}."${c.name}" as "${prefix}${c.name}"`)
      .join(', '),
  );
}
