/**
 * Webhook sinks (`corral.sinks`, `corral sinks`): where the outbox sends what turns deliver. The
 * rows only; names, URLs and secrets are checked in src/outbox/sinks.ts and again by the table's
 * constraints.
 */
import type { Db, DbOrTx } from '../client.ts';
import { asc, eq, getTableColumns, inArray, sql } from '../orm.ts';
import { sinks } from '../schema.ts';

export interface SinkRow {
  name: string;
  url: string;
  secret: string;
  timeoutMs: number;
  concurrency: number;
  /** The agents whose turns may deliver to it; null: every agent. */
  agents: string[] | null;
  allowPrivate: boolean;
  /** The secret a rotation replaced, and when it stops signing (both null outside an overlap). */
  previousSecret: string | null;
  previousSecretUntil: Date | null;
  /** Whether the previous secret still signs now, by PostgreSQL's clock. */
  previousInUse: boolean;
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
  agents: string[] | null;
  allowPrivate: boolean;
}

/** Every column, and whether a rotation's previous secret still signs (by the database's clock, as the claims read it). */
const COLUMNS = {
  ...getTableColumns(sinks),
  previousInUse: sql<boolean>`coalesce(${sinks.previousSecretUntil} > now(), false)`,
};

/** Stores a sink; undefined when one of that name exists. */
export async function insertSink(db: DbOrTx, sink: NewSink): Promise<SinkRow | undefined> {
  const rows = await db.insert(sinks).values(sink).onConflictDoNothing({ target: sinks.name }).returning(COLUMNS);
  return rows[0];
}

/** Every sink, by name. */
export async function listSinks(db: DbOrTx): Promise<SinkRow[]> {
  return db.select(COLUMNS).from(sinks).orderBy(asc(sinks.name));
}

export async function sinkByName(db: DbOrTx, name: string): Promise<SinkRow | undefined> {
  const rows = await db.select(COLUMNS).from(sinks).where(eq(sinks.name, name));
  return rows[0];
}

/** Disables (with why) or enables a sink; the row after, or undefined when there is none. */
export async function setSinkDisabled(db: DbOrTx, name: string, reason: string | null): Promise<SinkRow | undefined> {
  const rows = await db
    .update(sinks)
    .set({ disabledAt: reason === null ? null : sql`now()`, disabledReason: reason, updatedAt: sql`now()` })
    .where(eq(sinks.name, name))
    .returning(COLUMNS);
  return rows[0];
}

/** The agents of each of `names` that is a sink (enabled or not; null: every agent); the others are absent. */
export async function sinkScopes(db: DbOrTx, names: readonly string[]): Promise<Map<string, string[] | null>> {
  if (names.length === 0) return new Map();
  const rows = await db
    .select({ name: sinks.name, agents: sinks.agents })
    .from(sinks)
    .where(inArray(sinks.name, [...names]));
  return new Map(rows.map((r) => [r.name, r.agents]));
}

/**
 * A new secret for a sink (`corral sinks rotate-secret`). With an overlap, the secret it replaces
 * signs too until `now() + overlapMs` by PostgreSQL's clock (the claims read it so, O5 of
 * messages.ts); a previous secret of an earlier rotation still in its overlap is dropped (two
 * signatures at most). Without one, the old secret stops signing at once. The row after, or
 * undefined when there is no such sink.
 */
export async function rotateSinkSecret(db: DbOrTx, name: string, secret: string, overlapMs: number): Promise<SinkRow | undefined> {
  const overlap = overlapMs > 0;
  const rows = await db
    .update(sinks)
    .set({
      previousSecret: overlap ? sql`${sinks.secret}` : null,
      previousSecretUntil: overlap ? sql`now() + make_interval(secs => ${overlapMs} / 1000.0)` : null,
      secret,
      updatedAt: sql`now()`,
    })
    .where(eq(sinks.name, name))
    .returning(COLUMNS);
  return rows[0];
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
