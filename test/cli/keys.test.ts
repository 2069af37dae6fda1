/** `corral keys …` and the security flags, as subprocesses: output, exit codes, file modes, no secrets. */
import { chmodSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { CORRAL, run } from './helpers.ts';

const home = mkdtempSync(join(tmpdir(), 'corral-keys-'));
const env = { CORRAL_HOME: home, DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none' };
const corral = (...args: string[]) => run([CORRAL, ...args], env);

afterAll(() => rmSync(home, { recursive: true, force: true }));

describe('corral keys', () => {
  it('init, add-worker, list, revoke; files 0600 in a 0700 folder; list shows no secrets', async () => {
    const init = await corral('keys', 'init');
    expect(init.code, init.stderr).toBe(0);
    expect(init.stdout).toMatch(/created: .*daemon\.key/);
    const serverKey = /server public key: (\S{40})/.exec(init.stdout)![1]!;
    expect(statSync(join(home, 'keys')).mode & 0o777).toBe(0o700);
    expect(statSync(join(home, 'keys', 'daemon.key')).mode & 0o777).toBe(0o600);
    expect((await corral('keys', 'init')).stdout).toMatch(/^exists:/);

    const out = join(home, 'w1.key');
    const add = await corral('keys', 'add-worker', 'w1', '--capacity', '2', '--out', out);
    expect(add.code, add.stderr).toBe(0);
    expect(statSync(out).mode & 0o777).toBe(0o600);
    const file = JSON.parse(readFileSync(out, 'utf8')) as Record<string, string>;
    expect(file).toMatchObject({ format: 'corral-worker-key/1', worker_id: 'w1', server_key: serverKey });
    expect((await corral('keys', 'add-worker', 'w1', '--out', out)).code).toBe(2); // exists, no --force

    const printed = await corral('keys', 'add-worker', 'w2');
    expect(printed.code).toBe(0);
    const w2 = JSON.parse(printed.stdout) as Record<string, string>;
    const list = await corral('keys', 'list', '--json');
    expect(list.code).toBe(0);
    const entries = JSON.parse(list.stdout) as Array<Record<string, unknown>>;
    expect(entries.map((e) => [e.worker_id, e.capacity])).toEqual([
      ['w1', 2],
      ['w2', undefined],
    ]);
    for (const secret of [file.secret_key!, file.token!, w2.secret_key!, w2.token!]) {
      expect(list.stdout).not.toContain(secret);
      expect(readFileSync(join(home, 'keys', 'workers.json'), 'utf8')).not.toContain(secret);
    }

    expect((await corral('keys', 'revoke', 'w2')).code).toBe(0);
    expect((await corral('keys', 'revoke', 'w2')).code).toBe(3);
    expect((await corral('keys', 'add-worker', 'bad id!')).code).toBe(2);
    for (const sub of ['init', 'add-worker', 'list', 'revoke']) expect((await corral('keys', sub, '--help')).code).toBe(0);
  });

  it('add-worker --agents stores the scope, list shows it, and a bad scope exits 2 and issues nothing', async () => {
    const scoped = await corral('keys', 'add-worker', 'w-scoped', '--agents', 'support-*', 'billing', 'support-*');
    expect(scoped.code, scoped.stderr).toBe(0);
    const list = await corral('keys', 'list', '--json');
    const entries = JSON.parse(list.stdout) as Array<{ worker_id: string; agents?: string[] }>;
    expect(entries.find((e) => e.worker_id === 'w-scoped')?.agents).toEqual(['support-*', 'billing']);
    const text = (await corral('keys', 'list')).stdout;
    expect(text).toMatch(/^w-scoped\t\S{40}\tcapacity=-\tagents=support-\*,billing\t/m);
    expect(text).toMatch(/^w1\t\S{40}\tcapacity=2\tagents=all\t/m);

    for (const [args, why] of [
      [['--agents', 'bad agent'], /invalid agent pattern "bad agent"/],
      [['--agents', 'a*b'], /invalid agent pattern "a\*b"/],
      [['--agents', ''], /may not be empty/],
      [['--agents', ...Array.from({ length: 65 }, (_, i) => `agent-${i}`)], /at most 64 patterns/],
    ] as const) {
      const r = await corral('keys', 'add-worker', 'w-bad', ...args);
      expect(r.code, r.stderr).toBe(2);
      expect(r.stderr).toMatch(why);
    }
    const after = JSON.parse((await corral('keys', 'list', '--json')).stdout) as Array<{ worker_id: string }>;
    expect(after.map((e) => e.worker_id)).not.toContain('w-bad');
  });

  it('add-worker --out leaves an existing folder as it is, and creates a missing one 0700', async () => {
    // an app's folder, which the embedded PostgreSQL (another OS user when run as root) must reach
    const shared = join(home, 'app');
    mkdirSync(shared);
    chmodSync(shared, 0o755);
    const inShared = await corral('keys', 'add-worker', 'w-shared', '--out', join(shared, 'w-shared.key'));
    expect(inShared.code, inShared.stderr).toBe(0);
    expect(statSync(shared).mode & 0o777).toBe(0o755);
    expect(statSync(join(shared, 'w-shared.key')).mode & 0o777).toBe(0o600);
    expect(readdirSync(shared)).toEqual(['w-shared.key']); // no temp file left

    const missing = join(home, 'new', 'deeper');
    const inMissing = await corral('keys', 'add-worker', 'w-new', '--out', join(missing, 'w-new.key'));
    expect(inMissing.code, inMissing.stderr).toBe(0);
    expect(statSync(missing).mode & 0o777).toBe(0o700);
    expect(statSync(join(missing, 'w-new.key')).mode & 0o777).toBe(0o600);
    expect((JSON.parse(readFileSync(join(missing, 'w-new.key'), 'utf8')) as { worker_id: string }).worker_id).toBe('w-new');
  });

  it('refuses --insecure on a non-loopback endpoint without --insecure-remote', async () => {
    const r = await corral('daemon', '--insecure', '--endpoint', 'tcp://0.0.0.0:5999');
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/insecure-remote/);
  });

  it('a worker with an unreadable key file exits 2 and names the file', async () => {
    const r = await run([CORRAL, 'worker', '--key-file', join(home, 'missing.key')], env);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/missing\.key/);
  });
});
