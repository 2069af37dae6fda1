/**
 * The library links of the embedded PostgreSQL's platform package (src/db/postgres/embedded.ts,
 * `hydrateLinks`): made when its postinstall did not run, as that script would make them.
 */
import { lstat, mkdir, mkdtemp, readlink, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { hydrateLinks } from '../../src/db/postgres/embedded.ts';

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'corral-links-'));
  await mkdir(join(dir, 'native', 'lib'), { recursive: true });
  await writeFile(join(dir, 'native', 'lib', 'libpq.so.5.17'), 'library');
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

const list = (links: unknown) => writeFile(join(dir, 'native', 'pg-symlinks.json'), JSON.stringify(links));
const isLink = (path: string) =>
  lstat(path).then(
    (s) => s.isSymbolicLink(),
    () => false,
  );

describe('hydrateLinks', () => {
  it('makes each missing link, relative to its own folder, and leaves existing ones alone', async () => {
    await list([
      { source: 'native/lib/libpq.so.5.17', target: 'native/lib/libpq.so.5' },
      { source: 'native/lib/libpq.so.5.17', target: 'native/lib/libpq.so' },
    ]);
    await symlink('elsewhere', join(dir, 'native', 'lib', 'libpq.so'));
    await hydrateLinks(dir);
    expect(await readlink(join(dir, 'native', 'lib', 'libpq.so.5'))).toBe('libpq.so.5.17');
    expect(await readlink(join(dir, 'native', 'lib', 'libpq.so'))).toBe('elsewhere');
    await hydrateLinks(dir); // again: nothing to do, no error
    expect(await readlink(join(dir, 'native', 'lib', 'libpq.so.5'))).toBe('libpq.so.5.17');
  });

  it('makes nothing outside the package, and nothing without a list', async () => {
    await list([{ source: 'native/lib/libpq.so.5.17', target: '../outside.so' }, { source: 7, target: null }, 'junk']);
    await hydrateLinks(dir);
    expect(await isLink(join(dir, '..', 'outside.so'))).toBe(false);
    await rm(join(dir, 'native', 'pg-symlinks.json'));
    await expect(hydrateLinks(dir)).resolves.toBeUndefined();
  });
});
