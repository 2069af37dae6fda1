/**
 * Webhook sinks (`corral.sinks`, `corral sinks`): where the outbox sends what turns deliver. The
 * rows only; names, URLs and secrets are checked in src/outbox/sinks.ts and again by the table's
 * constraints.
 */
import type { Db, DbOrTx } from '../client.ts';
import { asc, eq, inArray, sql } from '../orm.ts';
import { sinks } from '../schema.ts';

export interface SinkRow {
  name: string;
  url: string;
  secret: string;
  timeoutMs: number;
  concurrency: number;
  disabledAt: Date | null;
  disabledReason: string | null;
  createdAt: Date;
}

export interface NewSink {
  name: string;
  url: string;
  secret: string;
  timeoutMs: number;
  concurrency: number;
}

/** Stores a sink; undefined when one of that name exists. */
export async function insertSink(db: DbOrTx, sink: NewSink): Promise<SinkRow | undefined> {
  const rows = await db.insert(sinks).values(sink).onConflictDoNothing({ target: sinks.name }).returning();
  return rows[0];
}

/** Every sink, by name. */
export async function listSinks(db: DbOrTx): Promise<SinkRow[]> {
  return db.select().from(sinks).orderBy(asc(sinks.name));
}

export async function sinkByName(db: DbOrTx, name: string): Promise<SinkRow | undefined> {
  const rows = await db.select().from(sinks).where(eq(sinks.name, name));
  return rows[0];
}

/** Disables (with why) or enables a sink; the row after, or undefined when there is none. */
export async function setSinkDisabled(db: DbOrTx, name: string, reason: string | null): Promise<SinkRow | undefined> {
  const rows = await db
    .update(sinks)
    .set({ disabledAt: reason === null ? null : sql`now()`, disabledReason: reason, updatedAt: sql`now()` })
    .where(eq(sinks.name, name))
    .returning();
  return rows[0];
}

/** Which of `names` are sinks (enabled or not). */
export async function existingSinkNames(db: DbOrTx, names: readonly string[]): Promise<Set<string>> {
  if (names.length === 0) return new Set();
  const rows = await db
    .select({ name: sinks.name })
    .from(sinks)
    .where(inArray(sinks.name, [...names]));
  return new Set(rows.map((r) => r.name));
}

/**
 * Deletes a sink unless messages of it are pending (or `force`): its messages go with it (the
 * foreign key cascades). The sink's row is locked first, so no commit adds a message to it between
 * the count and the delete (a commit's insert takes a key-share lock on the row). Undefined when
 * there is no such sink.
 */
export async function deleteSinkUnlessPending(
  db: Db,
  name: string,
  force: boolean,
): Promise<{ deleted: boolean; pending: number; messages: number } | undefined> {
  return db.transaction(async (tx) => {
    const found = await tx.execute(sql`select 1 from corral.sinks where name = ${name} for update`);
    if (found.rows.length === 0) return undefined;
    const counts = await tx.execute<{ pending: string; messages: string }>(sql`
      select count(*) filter (where state = 'pending') as pending, count(*) as messages from corral.outbox where sink = ${name}`);
    const pending = Number(counts.rows[0]?.pending ?? 0);
    const messages = Number(counts.rows[0]?.messages ?? 0);
    if (pending > 0 && !force) return { deleted: false, pending, messages };
    await tx.execute(sql`delete from corral.sinks where name = ${name}`);
    return { deleted: true, pending, messages };
  });
}
