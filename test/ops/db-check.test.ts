/**
 * `npm run db:check` (scripts/db-check.ts <root>) on a scratch copy of the schema and drizzle/:
 * passes when they agree, fails with a helpful message once the schema gains a column that no
 * migration covers. Offline: drizzle-kit only compares files.
 */
import { cpSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ROOT, run, RUN_TS } from '../cli/helpers.ts';

function scratchCopy(): string {
  const dir = mkdtempSync(join(tmpdir(), 'corral-db-check-test-'));
  mkdirSync(join(dir, 'src', 'db'), { recursive: true });
  mkdirSync(join(dir, 'src', 'base'), { recursive: true });
  // The schema, the module it loads Drizzle through and the one of its shared values (with the
  // defaults it takes the input policies from), and the actor key's and trace context's rules
  // (check constraints) with the error module they import.
  // every schema module (schema.ts re-exports the others), so a new one is copied without a change here
  const schemas = readdirSync(join(ROOT, 'src', 'db')).filter((f) => /^schema(-[a-z]+)?\.ts$/.test(f));
  for (const f of [...schemas, 'orm.ts', 'views.ts']) cpSync(join(ROOT, 'src', 'db', f), join(dir, 'src', 'db', f));
  for (const f of ['actor-key.ts', 'trace-context.ts', 'errors.ts', 'defaults.ts'])
    cpSync(join(ROOT, 'src', 'base', f), join(dir, 'src', 'base', f));
  cpSync(join(ROOT, 'drizzle'), join(dir, 'drizzle'), { recursive: true });
  // drizzle-orm (loaded by orm.ts) and drizzle-kit resolve from the copy's node_modules.
  symlinkSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'), 'dir');
  return dir;
}

describe('db:check', { timeout: 180_000 }, () => {
  const dirs: string[] = [];
  afterAll(() => {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  it('passes on an unchanged copy and fails once the schema gains a column', async () => {
    const same = scratchCopy();
    const changed = scratchCopy();
    dirs.push(same, changed);
    const schemaPath = join(changed, 'src', 'db', 'schema.ts');
    const schema = readFileSync(schemaPath, 'utf8');
    const anchor = "    capacity: integer('capacity').notNull(),\n";
    expect(schema).toContain(anchor);
    writeFileSync(schemaPath, schema.replace(anchor, `${anchor}    hostname: text('hostname'),\n`));

    const [ok, bad] = await Promise.all([
      run([RUN_TS, 'scripts/db-check.ts', same], {}, { timeoutMs: 60_000 }),
      run([RUN_TS, 'scripts/db-check.ts', changed], {}, { timeoutMs: 60_000 }),
    ]);
    expect(ok.code, ok.stderr).toBe(0);
    expect(ok.stdout).toContain('db:check: schema and drizzle/ agree');
    expect(bad.code).not.toBe(0);
    expect(bad.stderr).toContain('src/db/schema.ts has changes that no migration in drizzle/ covers');
    expect(bad.stderr).toContain('npm run db:generate');
  });
});
