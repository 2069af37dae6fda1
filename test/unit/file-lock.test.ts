/** The lock that serialises starts of the embedded PostgreSQL (src/db/postgres/file-lock.ts). */
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm, utimes, writeFile } from 'node:fs/promises';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isStale, withFileLock } from '../../src/db/postgres/file-lock.ts';

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'corral-lock-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** The pid of a process that has exited. */
async function deadPid(): Promise<number> {
  const child = spawn(process.execPath, ['-e', '0']);
  await new Promise((r) => child.once('exit', r));
  return child.pid!;
}

describe('isStale', () => {
  it('is stale when the holder on this host is gone, or when the file is old', async () => {
    const gone = await deadPid();
    expect(isStale({ pid: gone, host: hostname(), token: 't', since: '' }, 0, 10_000)).toBe(true);
    expect(isStale({ pid: process.ppid, host: hostname(), token: 't', since: '' }, 0, 10_000)).toBe(false);
    // Another host's pid cannot be checked: only the age counts.
    expect(isStale({ pid: gone, host: 'elsewhere', token: 't', since: '' }, 0, 10_000)).toBe(false);
    expect(isStale({ pid: process.ppid, host: 'elsewhere', token: 't', since: '' }, 10_001, 10_000)).toBe(true);
    // Created but not yet written: judged by age alone.
    expect(isStale(undefined, 100, 10_000)).toBe(false);
  });
});

describe('withFileLock', () => {
  it('runs one holder at a time', async () => {
    const path = join(dir, 'serial.lock');
    let inside = 0;
    let most = 0;
    const order: number[] = [];
    await Promise.all(
      Array.from({ length: 8 }, (_, i) =>
        withFileLock(path, async () => {
          inside++;
          most = Math.max(most, inside);
          await new Promise((r) => setTimeout(r, 5));
          order.push(i);
          inside--;
        }),
      ),
    );
    expect(most).toBe(1);
    expect(order.sort()).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(existsSync(path)).toBe(false);
  });

  it('takes over the lock of a holder that died, and of one silent past the stale time', async () => {
    const dead = join(dir, 'dead.lock');
    await writeFile(dead, JSON.stringify({ pid: await deadPid(), host: hostname(), token: 'x', since: '' }));
    expect(await withFileLock(dead, async () => 'ran', { timeoutMs: 5_000 })).toBe('ran');

    const silent = join(dir, 'silent.lock');
    await writeFile(silent, JSON.stringify({ pid: process.ppid, host: 'elsewhere', token: 'y', since: '' }));
    const old = new Date(Date.now() - 60_000);
    await utimes(silent, old, old);
    expect(await withFileLock(silent, async () => 'ran', { timeoutMs: 5_000 })).toBe('ran');
  });

  it('gives up with a clear error naming a live holder', async () => {
    const path = join(dir, 'held.lock');
    await writeFile(path, JSON.stringify({ pid: process.ppid, host: hostname(), token: 'z', since: '' }));
    await expect(withFileLock(path, async () => 'ran', { timeoutMs: 300 })).rejects.toThrow(`held by pid ${process.ppid}`);
    await rm(path);
  });
});
