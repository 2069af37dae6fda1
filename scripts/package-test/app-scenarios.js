// @ts-check
/**
 * Run by the package test in the folder corral was installed into, with plain node: what an
 * application does with the installed package, against a daemon of the package and the example
 * worker app. Each scenario prints one JSON line; the first failure exits 1 with why.
 *
 *   DATABASE_URL / CORRAL_HOME   the daemon's database (read by connect(), as by the CLI)
 *   CORRAL_ENDPOINT              the daemon's endpoint
 *   SCENARIO_REVOKED_KEY_FILE    a key file whose worker id was revoked
 *   SCENARIO_UNKNOWN_KEY_FILE    a key file the daemon never issued (its server_key is the daemon's)
 *
 *   node app-scenarios.js
 */
import { connect, CorralError } from 'corral';
import { createWorker } from 'corral/worker';
import pg from 'pg';

const endpoint = process.env.CORRAL_ENDPOINT ?? 'tcp://127.0.0.1:5555';
const tag = `${process.pid}-${Date.now()}`;

/** @param {string} name @param {Record<string, unknown>} facts */
function report(name, facts) {
  process.stdout.write(`${JSON.stringify({ scenario: name, ...facts })}\n`);
}

/** @param {unknown} condition @param {string} why @returns {asserts condition} */
function check(condition, why) {
  if (!condition) throw new Error(why);
}

/** @param {import('corral').CommittedTurn} turn */
const replyOf = (turn) => turn.messages.filter((m) => m.role === 'assistant').map((m) => m.content);

const corral = await connect({ applicationName: 'package-test-app' });
try {
  // a pg connection of the application's own, to the database corral uses
  const app = new pg.Client({ connectionString: corral.databaseUrl });
  await app.connect();
  try {
    // 1. send inside the application's transaction: rolled back, nothing; committed, one turn
    const actor = `package-test/tx-${tag}`;
    await app.query('begin');
    const rolledBack = await corral.send(actor, { text: 'rolled back' }, { db: app });
    await app.query('rollback');
    await app.query('begin');
    const committed = await corral.send(actor, { text: 'committed' }, { db: app });
    await app.query('commit');
    const turn = await corral.waitForTurn(committed.eventId, { timeoutMs: 60_000 });
    check(
      JSON.stringify(replyOf(turn)) === JSON.stringify([{ text: 'example worker: committed' }]),
      `unexpected reply ${JSON.stringify(turn.messages)}`,
    );
    const gone = await corral.waitForTurn(rolledBack.eventId, { timeoutMs: 2_000 }).then(
      () => 'found',
      (/** @type {unknown} */ e) => (e instanceof CorralError ? e.code : String(e)),
    );
    check(gone === 'not_found', `the rolled-back event: ${gone}, expected not_found`);
    const transcript = await corral.transcript(actor);
    check(transcript.length === 1, `the transaction's actor has ${transcript.length} turns, expected 1`);
    report('send in a transaction', { rolledBack: gone, committed: replyOf(turn), turns: transcript.length });

    // 2. an idempotency key sent twice is one event
    const idem = `package-test/idem-${tag}`;
    const first = await corral.send(idem, { text: 'once' }, { idempotencyKey: 'order-1' });
    const again = await corral.send(idem, { text: 'once' }, { idempotencyKey: 'order-1' });
    check(first.eventId === again.eventId && !first.duplicate && again.duplicate, `idempotency: ${JSON.stringify({ first, again })}`);
    await corral.waitForTurn(first.eventId, { timeoutMs: 60_000 });
    const idemTurns = await corral.transcript(idem);
    check(idemTurns.length === 1, `the idempotent actor has ${idemTurns.length} turns`);
    report('idempotency key twice', { eventId: first.eventId, duplicate: again.duplicate, turns: idemTurns.length });

    // 3. corral.send_event from plain SQL, in one transaction: the turns commit in order
    const sqlAgent = 'package-test';
    const sqlSession = `sql-${tag}`;
    await app.query('begin');
    const ids = [];
    for (const text of ['one', 'two', 'three']) {
      const r = await app.query('select corral.send_event($1, $2, $3::jsonb) as id', [sqlAgent, sqlSession, JSON.stringify({ text })]);
      ids.push(String(r.rows[0].id));
    }
    await app.query('commit');
    for (const id of ids) await corral.waitForTurn(id, { timeoutMs: 60_000 });
    const sqlTurns = await corral.transcript(`${sqlAgent}/${sqlSession}`);
    const said = sqlTurns.flatMap((t) => t.messages.filter((m) => m.role === 'user').map((m) => JSON.stringify(m.content)));
    check(
      JSON.stringify(said) === JSON.stringify(['one', 'two', 'three'].map((text) => JSON.stringify({ text }))),
      `SQL events out of order: ${said.join(', ')}`,
    );
    report('send_event from SQL', { events: ids.length, order: said });

    // 4. watch: started and committed of a turn, as they happen
    const watched = `package-test/watch-${tag}`;
    const watch = await corral.watchTurns(watched);
    const sentAt = Date.now();
    const sent = await corral.send(watched, { text: 'watched' });
    /** @type {Record<string, number>} */
    const heardAfterMs = {};
    for await (const e of watch) {
      if (e.kind === 'gap' || e.eventId !== sent.eventId) continue;
      heardAfterMs[e.kind] = Date.now() - sentAt;
      if (e.kind === 'committed') break;
    }
    await watch.close();
    check(heardAfterMs.started !== undefined && heardAfterMs.committed !== undefined, `watch heard ${JSON.stringify(heardAfterMs)}`);
    report('watch', { heardAfterMs });

    // 5. a worker whose key was revoked, or never issued, is refused within 5 s
    for (const [name, keyFile] of [
      ['revoked key', process.env.SCENARIO_REVOKED_KEY_FILE],
      ['unknown key', process.env.SCENARIO_UNKNOWN_KEY_FILE],
    ]) {
      check(keyFile, `${name}: no key file given`);
      const worker = createWorker({ endpoint, keyFile, handler: async () => ({ messages: [] }), startTimeoutMs: 20_000 });
      const t0 = Date.now();
      const outcome = await worker.start().then(
        () => 'started',
        (/** @type {unknown} */ e) => (e instanceof CorralError ? e.code : String(e)),
      );
      const ms = Date.now() - t0;
      await worker.stop();
      check(outcome === 'key_refused', `${name}: start() gave ${outcome}, expected key_refused`);
      check(ms < 5_000, `${name}: refused after ${ms} ms, expected within 5 s`);
      report(name, { refused: outcome, afterMs: ms });
    }
  } finally {
    await app.end();
  }
} finally {
  await corral.close();
}
