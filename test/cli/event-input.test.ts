/**
 * `send` and `steer` take their JSON from the argument, a file (`--file`) or standard input
 * (`-`): an event larger than the OS allows an argument (about 128 KiB) commits; a wrong source
 * is a usage error that names it. The CLI runs as subprocesses against an in-process daemon with
 * the example worker.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { actorKey, type ActorKey } from '../../src/base/actor-key.ts';
import { readTranscript, type TranscriptEntry } from '../../src/db/turns/transcript.ts';
import { actorStatus } from '../../src/ops/status.ts';
import { queuesOf } from '../../src/queue/boss.ts';
import { runExampleWorker } from '../../src/worker/example.ts';
import type { Worker } from '../../src/worker/sdk.ts';
import { startTestDaemon, testLogger, type TestDaemon } from '../helpers/daemon.ts';
import { waitFor } from '../helpers/wait.ts';
import { corral as corralOn, json } from './helpers.ts';

let t: TestDaemon;
let worker: Worker;
const dir = mkdtempSync(join(tmpdir(), 'corral-event-input-'));

beforeAll(async () => {
  t = await startTestDaemon({ drainMs: 0 });
  worker = await runExampleWorker({ endpoint: t.daemon.broker.endpoint, workerId: 'input-1', capacity: 4, logger: testLogger });
  await waitFor(() => worker.isRegistered(), { what: 'registration' });
});

afterAll(async () => {
  await worker?.stop();
  await t?.stop();
  rmSync(dir, { recursive: true, force: true });
});

const corral = (args: string[], opts: { input?: string | Buffer; env?: Record<string, string> } = {}) =>
  corralOn(args, t.db.url, opts.env ?? {}, opts);

function file(name: string, content: string | Buffer): string {
  const path = join(dir, name);
  writeFileSync(path, content);
  return path;
}

async function committed(key: ActorKey, turns = 1): Promise<TranscriptEntry[]> {
  return waitFor(
    async () => {
      const tr = await readTranscript(t.daemon.database.db, key);
      return tr.length >= turns ? tr : undefined;
    },
    { what: `${turns} committed turn(s) of ${key.agentUid}/${key.sessionId}` },
  );
}

const reply = (e: TranscriptEntry) => e.messages.find((m) => m.role === 'assistant')!.content as Record<string, unknown>;

/** 200 KiB of text: over Linux's limit for one argument (128 KiB), under the event limit (256 KiB). */
const BIG_TEXT = 'abcdefgh'.repeat((200 * 1024) / 8);

describe('send and steer read JSON from the argument, a file or standard input', () => {
  it('send --file of a 200 KiB event commits it, whole', async () => {
    const event = { text: BIG_TEXT, n: 1 };
    const path = file('big.json', JSON.stringify(event, null, 1));
    const sent = await corral(['send', 'input/big', '--file', path]);
    expect(sent.code, sent.stderr).toBe(0);
    const eventId = sent.stdout.trim();
    const [turn] = await committed(actorKey('input', 'big'));
    expect(turn!.eventId).toBe(eventId);
    expect(reply(turn!).text).toBe(`echo: ${BIG_TEXT}`);

    const tr = await corral(['transcript', 'input/big', '--json']);
    expect(tr.code, tr.stderr).toBe(0);
    const shown = json<{ turns: TranscriptEntry[] }>(tr).turns;
    expect(shown.map((x) => x.eventId)).toEqual([eventId]);
    expect(shown[0]!.messages.find((m) => m.role === 'user')!.content).toEqual(event);
  });

  it('send - and send --file - read standard input', async () => {
    const dash = await corral(['send', 'input/stdin', '-'], { input: '{"text":"from stdin"}\n' });
    expect(dash.code, dash.stderr).toBe(0);
    const [first] = await committed(actorKey('input', 'stdin'));
    expect(first!.eventId).toBe(dash.stdout.trim());
    expect(reply(first!).text).toBe('echo: from stdin');

    const viaFile = await corral(['send', 'input/stdin', '--file', '-'], { input: Buffer.from('{"text":"again"}') });
    expect(viaFile.code, viaFile.stderr).toBe(0);
    const turns = await committed(actorKey('input', 'stdin'), 2);
    expect(reply(turns[1]!).text).toBe('echo: again');
  });

  it('a missing, doubled, unreadable, empty or oversized source is a usage error that says so', async () => {
    const limit = 262_144;
    const cases: [string[], { input?: string | Buffer }, string][] = [
      [['send', 'input/bad'], {}, 'corral: no event given: pass it as JSON, with --file FILE, or as - to read it from standard input\n'],
      [
        ['send', 'input/bad', '{"a":1}', '--file', file('ok.json', '{}')],
        {},
        'corral: give the event either as an argument or with --file, not both\n',
      ],
      [
        ['send', 'input/bad', '--file', join(dir, 'missing.json')],
        {},
        `corral: cannot read ${join(dir, 'missing.json')}: ENOENT: no such file or directory\n`,
      ],
      [['send', 'input/bad', '--file', dir], {}, `corral: cannot read ${dir}: EISDIR: illegal operation on a directory, read\n`],
      [['send', 'input/bad', '-'], { input: '' }, 'corral: standard input is empty: expected the event as JSON\n'],
      [
        ['send', 'input/bad', '--file', file('blank.json', ' \n')],
        {},
        `corral: ${join(dir, 'blank.json')} is empty: expected the event as JSON\n`,
      ],
      [
        ['send', 'input/bad', '--file', file('over.json', JSON.stringify({ text: 'x'.repeat(limit) }))],
        {},
        `corral: ${join(dir, 'over.json')} holds more than the event limit of ${limit} bytes (CORRAL_MAX_EVENT_BYTES)\n`,
      ],
      // 64 MiB on a pipe: refused after the limit's worth, not read whole
      [
        ['send', 'input/bad', '-'],
        { input: Buffer.alloc(64 * 1024 * 1024, 0x20) },
        `corral: standard input holds more than the event limit of ${limit} bytes (CORRAL_MAX_EVENT_BYTES)\n`,
      ],
      [['send', 'input/bad', '-'], { input: '{"text": nope}' }, 'corral: the event must be JSON: Unexpected token'],
      [['send', 'input/bad', '-'], { input: Buffer.from([0x7b, 0xff, 0x7d]) }, 'corral: standard input is not UTF-8 text\n'],
      [
        ['steer', 'input/bad'],
        {},
        'corral: no steering input given: pass it as JSON, with --file FILE, or as - to read it from standard input\n',
      ],
      [
        ['steer', 'input/bad', '-'],
        { input: JSON.stringify({ text: 'x'.repeat(7_000) }) },
        'corral: standard input holds more than the steering input limit of 6900 bytes\n',
      ],
    ];
    for (const [args, opts, message] of cases) {
      const r = await corral(args, opts);
      expect([args.join(' '), r.code, r.stdout], r.stderr).toEqual([args.join(' '), 2, '']);
      if (message.endsWith('\n')) expect(r.stderr).toBe(message);
      else expect(r.stderr.startsWith(message), r.stderr).toBe(true);
    }
    // nothing of it reached the queue
    const s = await actorStatus(t.daemon.database.db, queuesOf(t.config), actorKey('input', 'bad'));
    expect(s.known).toBe(false);
  });

  it('steer --file and steer - reach the live turn', async () => {
    for (const [session, source] of [
      ['steer-file', { args: ['--file', file('steer.json', '{"more": "from a file"}')], input: undefined }],
      ['steer-stdin', { args: ['-'], input: '{"more": "from stdin"}' }],
    ] as const) {
      const key = actorKey('input', session);
      const sent = await corral(['send', `input/${session}`, '{"delayMs": 4000, "text": "slow"}']);
      expect(sent.code, sent.stderr).toBe(0);
      await waitFor(
        async () =>
          (await actorStatus(t.daemon.database.db, queuesOf(t.config), key)).recentTurns.some(
            (x) => x.eventId === sent.stdout.trim() && x.status === 'started',
          ),
        { what: `the turn of input/${session} to start` },
      );
      const steered = await corral(
        ['steer', `input/${session}`, ...source.args],
        source.input === undefined ? {} : { input: source.input },
      );
      expect(steered.code, steered.stderr).toBe(0);
      expect(steered.stdout).toBe(`steered input/${session}: event ${sent.stdout.trim()} now at revision 1\n`);
      const [turn] = await committed(key);
      expect(reply(turn!).steered).toEqual({ more: session === 'steer-file' ? 'from a file' : 'from stdin' });
    }
  });
});
