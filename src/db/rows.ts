/**
 * Rows of statements written as SQL text (`db.execute`, named statements): their columns come
 * back under their SQL names and, through Drizzle's `execute`, timestamps as text. These turn
 * them into the schema's row types, from the schema itself, so a column change is made once.
 */
import { getTableColumns, type InferSelectModel, type Table } from 'drizzle-orm';
import pg from 'pg';

const parseTimestamptz = pg.types.getTypeParser(pg.types.builtins.TIMESTAMPTZ) as (v: string) => Date;

/** A timestamp column of a raw row as a Date (null stays null), parsed as node-postgres would. */
export function toDate(v: unknown): Date | null {
  if (v === null || v === undefined) return null;
  if (v instanceof Date) return v;
  return parseTimestamptz(String(v));
}

/** A raw row of `table` (SQL column names) as the schema's row type, each value mapped by its column. */
export function fromRawRow<T extends Table>(table: T, raw: Record<string, unknown>): InferSelectModel<T> {
  const out: Record<string, unknown> = {};
  for (const [key, column] of Object.entries(getTableColumns(table))) {
    const v = raw[column.name];
    out[key] = v === null || v === undefined ? null : column.mapFromDriverValue(v);
  }
  return out as InferSelectModel<T>;
}
