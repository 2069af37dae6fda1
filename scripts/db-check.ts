/**
 * `npm run db:check`: fails when the Drizzle schema (src/db/schema.ts) and the committed
 * migrations in drizzle/ disagree, i.e. the schema changed without `npm run db:generate`.
 *
 * It asks drizzle-kit to generate into a scratch copy of drizzle/: if that would write a new
 * migration, the two disagree. Runs offline (no database needed).
 */
import { spawnSync } from 'node:child_process';
import { cpSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

const root = resolve(process.argv[2] ?? '.');
const scratch = mkdtempSync(join(tmpdir(), 'corral-db-check-'));
try {
  const out = join(scratch, 'drizzle');
  cpSync(join(root, 'drizzle'), out, { recursive: true });
  const before = readdirSync(out).filter((f) => f.endsWith('.sql'));
  const config = join(scratch, 'drizzle.config.mjs');
  writeFileSync(
    config,
    `export default ${JSON.stringify({
      dialect: 'postgresql',
      schema: join(root, 'src/db/schema.ts'),
      // drizzle-kit only accepts an output folder relative to its working directory
      out: './drizzle',
      schemaFilter: ['corral'],
    })};\n`,
  );
  const kit = join(root, 'node_modules', '.bin', 'drizzle-kit');
  const res = spawnSync(kit, ['generate', '--config', config, '--name', 'db_check'], { cwd: scratch, encoding: 'utf8' });
  // drizzle-kit can print an error and still exit 0: treat any error output as a failure.
  if (res.status !== 0 || /\bError\b/.test(res.stderr) || /\bError\b/.test(res.stdout)) {
    process.stderr.write(`db:check: drizzle-kit generate failed\n${res.stdout}${res.stderr}`);
    process.exit(1);
  }
  const after = readdirSync(out).filter((f) => f.endsWith('.sql'));
  const added = after.filter((f) => !before.includes(f));
  if (added.length > 0) {
    process.stderr.write(
      `db:check: src/db/schema.ts has changes that no migration in drizzle/ covers.\n` +
        `Run \`npm run db:generate\`, review the new SQL, and commit it.\n`,
    );
    process.exit(1);
  }
  process.stdout.write(`db:check: schema and drizzle/ agree (${before.length} migration${before.length === 1 ? '' : 's'})\n`);
} finally {
  rmSync(scratch, { recursive: true, force: true });
}
