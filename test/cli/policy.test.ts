/**
 * `corral policy set | list | clear` as subprocesses: the round trip through the database, the
 * output (table, JSON), `corral actor` naming the policy, `corral send` refused with exit code 4
 * while a `reject` actor's event waits (no daemon runs here, so it waits), and bad input answered
 * with exit code 2 before the database is touched. test/client/input-policy.test.ts covers the
 * policies on a running daemon.
 */
import { describe, expect, it } from 'vitest';
import { listInputPolicies } from '../../src/db/enqueue/input-policies.ts';
import { useTestDatabase } from '../helpers/db.ts';
import { CORRAL, corral, json, run } from './helpers.ts';

describe('corral policy (CLI)', { timeout: 180_000 }, () => {
  const tdb = useTestDatabase();
  const policy = (...args: string[]) => corral(['policy', ...args], tdb.url);

  it('sets, replaces, lists and clears policies of agents and actors', async () => {
    const empty = await policy('list');
    expect(empty.code, empty.stderr).toBe(0);
    expect(empty.stdout).toBe("no input policy set: every actor follows the default (queue, the daemon's CORRAL_INPUT_POLICY)\n");

    const set = await policy('set', 'support-bot', 'reject');
    expect(set.code, set.stderr).toBe(0);
    expect(set.stdout).toBe('input policy of support-bot: reject (was: the default)\n');
    const [actor, replaced] = await Promise.all([policy('set', 'support-bot/vip', 'queue', '--json'), policy('set', 'triage', 'queue')]);
    expect(actor.code, actor.stderr).toBe(0);
    expect(json(actor)).toMatchObject({
      target: 'support-bot/vip',
      agentUid: 'support-bot',
      sessionId: 'vip',
      policy: 'queue',
      previous: null,
    });
    expect(replaced.code, replaced.stderr).toBe(0);
    const again = await policy('set', 'triage', 'reject');
    expect(again.stdout).toBe('input policy of triage: reject (was: queue)\n');

    const [table, asJson] = await Promise.all([policy('list'), policy('list', '--json')]);
    expect(table.code, table.stderr).toBe(0);
    const lines = table.stdout.trimEnd().split('\n');
    expect(lines[0]).toMatch(/^TARGET\s+POLICY\s+OPTIONS\s+UPDATED$/);
    expect(lines[1]).toMatch(/^support-bot \(every session\)\s+reject\s+-\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ$/);
    expect(lines[2]).toMatch(/^support-bot\/vip\s+queue\s+/);
    expect(lines[3]).toMatch(/^triage \(every session\)\s+reject\s+/);
    expect(lines[4]).toBe("actors not listed follow their agent's policy, else the default (queue, the daemon's CORRAL_INPUT_POLICY)");
    const listed = json<{ policies: { target: string; policy: string }[]; default: string }>(asJson);
    expect(listed.default).toBe('queue');
    expect(listed.policies.map((p) => [p.target, p.policy])).toEqual([
      ['support-bot', 'reject'],
      ['support-bot/vip', 'queue'],
      ['triage', 'reject'],
    ]);

    const clear = await policy('clear', 'support-bot/vip');
    expect(clear.code, clear.stderr).toBe(0);
    expect(clear.stdout).toBe("input policy of support-bot/vip: its agent's, else the default (was: queue)\n");
    const none = await policy('clear', 'support-bot/vip');
    expect(none.code).toBe(3);
    expect(none.stderr).toBe('corral: support-bot/vip has no input policy of its own\n');
    expect((await listInputPolicies(tdb.database.db)).map((p) => `${p.agentUid}/${p.sessionId ?? '*'}=${p.policy}`)).toEqual([
      'support-bot/*=reject',
      'triage/*=reject',
    ]);

    // coalesce with its options, durations written like 300ms and 5s
    const co = await policy('set', 'chat', 'coalesce', '--debounce', '300ms', '--max-wait', '5s', '--max-events', '20');
    expect(co.code, co.stderr).toBe(0);
    expect(co.stdout).toBe('input policy of chat: coalesce (debounce 300ms, max-wait 5000ms, max-events 20) (was: the default)\n');
    const stored = (await listInputPolicies(tdb.database.db)).find((p) => p.agentUid === 'chat');
    expect(stored?.options).toEqual({ debounceMs: 300, maxWaitMs: 5_000, maxEvents: 20 });
    const plain = await policy('set', 'chat', 'interrupt');
    expect(plain.stdout, 'a set replaces the options too').toBe('input policy of chat: interrupt (was: coalesce)\n');
    expect((await listInputPolicies(tdb.database.db)).find((p) => p.agentUid === 'chat')?.options).toEqual({});
  });

  it('corral send exits 4 while a reject actor has an event waiting, enqueueing nothing; corral actor names the policy', async () => {
    const setIt = await policy('set', 'busy/one', 'reject');
    expect(setIt.code, setIt.stderr).toBe(0);
    const first = await corral(['send', 'busy/one', '{"text":"m1"}'], tdb.url);
    expect(first.code, first.stderr).toBe(0);
    const second = await corral(['send', 'busy/one', '{"text":"m2"}'], tdb.url);
    expect(second.code, second.stderr).toBe(4);
    expect(second.stderr).toMatch(
      /^corral: actor busy\/one is busy \(a turn runs or events wait\) and its input policy is reject: nothing was enqueued\n$/,
    );
    const { rows } = await tdb.database.pool.query<{ n: number }>(
      `select count(*)::int as n from pgboss.job where name = 'actor-events' and singleton_key = 'busy/one'`,
    );
    expect(rows[0]!.n).toBe(1);
    // an actor of the same agent without the policy takes both
    for (const text of ['a', 'b']) expect((await corral(['send', 'busy/two', JSON.stringify({ text })], tdb.url)).code).toBe(0);
    const shown = await corral(['actor', 'busy/one'], tdb.url);
    expect(shown.code, shown.stderr).toBe(0);
    expect(shown.stdout).toContain("input policy: reject (the actor's own)\n");
    const asJson = await corral(['actor', 'busy/two', '--json'], tdb.url);
    expect(json<{ inputPolicy: unknown }>(asJson).inputPolicy).toEqual({ policy: 'queue', options: {}, from: 'default' });
  });

  it('answers bad input with exit code 2 and a clear message, before the database is touched', async () => {
    // nothing listens there: a command that got past its arguments would fail with exit 1
    const nowhere = { DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none' };
    const cases: [string[], RegExp][] = [
      [['set', 'agent', 'queue', '--debounce', '300ms'], /input policy queue takes no options/],
      [['set', 'agent', 'coalesce', '--debounce', 'soon'], /invalid --debounce duration "soon"/],
      [['set', 'agent', 'coalesce', '--max-wait', '5s'], /a max-wait bounds a debounce: set a debounce too/],
      [
        ['set', 'agent', 'coalesce', '--debounce', '2s', '--max-wait', '1s'],
        /the max-wait \(1000 ms\) is shorter than the debounce \(2000 ms\)/,
      ],
      [['set', 'agent', 'coalesce', '--max-events', '101'], /max-events is 1 to 100, not 101/],
      [['set', 'agent', 'coalesce', '--max-events', 'many'], /invalid --max-events "many": expected a whole number/],
      [['set', 'agent', 'drop'], /unknown input policy "drop": choose one of queue, coalesce, interrupt, reject/],
      [['set', 'bad agent!', 'reject'], /invalid agent_uid "bad agent!"/],
      [['set', 'agent/bad session', 'reject'], /invalid/],
      [['clear', 'x'.repeat(129)], /invalid agent_uid/],
      [['set', 'agent'], /missing required argument 'policy'/],
      [['purge', 'agent'], /unknown command 'purge'/],
      [['list', '--verbose'], /unknown option '--verbose'/],
    ];
    const results = await Promise.all(cases.map(([args]) => run([CORRAL, 'policy', ...args], nowhere)));
    for (const [i, r] of results.entries()) {
      const [args, why] = cases[i]!;
      expect(r.code, `${args.join(' ')}: ${r.stderr}`).toBe(2);
      expect(r.stderr, args.join(' ')).toMatch(why);
    }
    const help = await Promise.all(['set', 'list', 'clear'].map((sub) => run([CORRAL, 'policy', sub, '--help'], nowhere)));
    for (const h of help) expect(h.code, h.stderr).toBe(0);
    expect(help[0]!.stdout).toContain('corral policy set support-bot reject');
    expect((await run([CORRAL, 'policy', '--help'], nowhere)).stdout).toMatch(/set .*<target> <policy>/);
  });
});
