/**
 * Output to a closed pipe (`corral transcript … | head -1`) ends quietly, with the exit code the
 * command has with a reader, however long the output: no EPIPE stack trace, nothing on stderr.
 * The CLI runs as subprocesses against an in-process daemon with the example worker.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { actorKey } from '../../src/base/actor-key.ts';
import { readTranscript } from '../../src/db/turns/transcript.ts';
import { actorStatus } from '../../src/ops/status.ts';
import { queuesOf } from '../../src/queue/boss.ts';
import { runExampleWorker } from '../../src/worker/example.ts';
import type { Worker } from '../../src/worker/sdk.ts';
import { startTestDaemon, testLogger, type TestDaemon } from '../helpers/daemon.ts';
import { trackChild } from '../helpers/processes.ts';
import { waitFor } from '../helpers/wait.ts';
import { CORRAL, ROOT, RUN_TS, run, type CliResult } from './helpers.ts';
import { sendEvent } from '../helpers/send.ts';

let t: TestDaemon;
let worker: Worker;
const home = mkdtempSync(join(tmpdir(), 'corral-closed-pipe-'));

beforeAll(async () => {
  // retryLimit 0: an event that fails is dead-lettered at once (`dlq list` has something to show)
  t = await startTestDaemon({ drainMs: 0, retryLimit: 0 });
  worker = await runExampleWorker({ endpoint: t.daemon.broker.endpoint, workerId: 'pipe-1', capacity: 2, logger: testLogger });
  await waitFor(() => worker.isRegistered(), { what: 'registration' });
  // A long transcript (about 400 KiB of text: the event and its echo), far more than a pipe
  // buffers; and a dead letter.
  const db = t.daemon.database.db;
  await sendEvent(db, actorKey('pipe', 'long'), { text: 'abcdefgh'.repeat(25_600) });
  await sendEvent(db, actorKey('pipe', 'fails'), { fail: true });
  await waitFor(async () => (await readTranscript(db, actorKey('pipe', 'long'))).length > 0, { what: 'the long turn' });
  await waitFor(async () => (await actorStatus(db, queuesOf(t.config), actorKey('pipe', 'fails'))).deadLetters.length > 0, {
    what: 'the dead letter',
  });
});

afterAll(async () => {
  await worker?.stop();
  await t?.stop();
  rmSync(home, { recursive: true, force: true });
});

const pipeEnv = () => ({ DATABASE_URL: t.db.url, CORRAL_HOME: home, CORRAL_LOG_LEVEL: 'warn' });

interface PipeResult {
  code: number | null;
  stderr: string;
  /** What was read from stdout before it was closed. */
  read: string;
}

/**
 * Runs `node <command>` (the CLI, or a script) with its stdout closed by the reader: at once
 * (`afterFirstChunk` false: the first write fails), or after the first chunk, as `| head -1` does.
 */
function withStdoutClosed(command: string[], afterFirstChunk: boolean): Promise<PipeResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, command, {
      cwd: ROOT,
      env: { ...process.env, ...pipeEnv() },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    trackChild(child);
    let stderr = '';
    let read = '';
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    if (afterFirstChunk) {
      child.stdout.setEncoding('utf8').once('data', (d: string) => {
        read = d;
        child.stdout.destroy();
      });
    } else {
      child.stdout.destroy();
    }
    const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stderr, read });
    });
  });
}

describe('output to a closed pipe', () => {
  it('ends quietly, with the exit code the command has with a reader', async () => {
    const commands = [
      [CORRAL, 'transcript', 'pipe/long'],
      [CORRAL, 'transcript', 'pipe/long', '--json'],
      [CORRAL, 'status'],
      [CORRAL, 'status', '--json'],
      [CORRAL, 'actor', 'pipe/long'],
      [CORRAL, 'dlq', 'list'],
      [CORRAL, 'dlq', 'list', '--actor', 'nobody/none'], // exit 3: nothing matched
      [CORRAL, 'keys', 'list'],
      [CORRAL, '--help'],
      [CORRAL, 'send', '--help'],
      [RUN_TS, 'scripts/dlq-inspect.ts', 'list'],
    ];
    for (const command of commands) {
      const what = command.slice(1).join(' ');
      const normal: CliResult = await run(command, pipeEnv());
      expect(normal.stdout.length, `${what}: ${normal.stderr}`).toBeGreaterThan(0);
      const closed = await withStdoutClosed(command, false);
      expect([what, closed.code, closed.stderr]).toEqual([what, normal.code, '']);
    }
  });

  it('`transcript | head -1` of a transcript larger than the pipe holds ends quietly, exit 0', async () => {
    // the transcript is about 400 KiB: far more than a pipe buffers, so the writer meets the closed pipe
    const r = await withStdoutClosed([CORRAL, 'transcript', 'pipe/long'], true);
    expect([r.code, r.stderr]).toEqual([0, '']);
    expect(r.read).toMatch(/^── turn /);

    const shell = await new Promise<CliResult>((resolve, reject) => {
      const child = spawn('bash', ['-c', 'set -o pipefail; "$0" "$1" transcript pipe/long | head -1', process.execPath, CORRAL], {
        cwd: ROOT,
        env: { ...process.env, ...pipeEnv() },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      trackChild(child);
      let stdout = '';
      let stderr = '';
      child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
      child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
      child.on('error', reject);
      child.on('close', (code) => resolve({ code, stdout, stderr }));
    });
    expect([shell.code, shell.stderr]).toEqual([0, '']);
    expect(shell.stdout).toMatch(/^── turn [0-9a-f-]{36} .*\n$/);
  });
});
