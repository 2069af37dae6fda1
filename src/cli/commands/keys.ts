/**
 * `corral keys …`: the daemon's CURVE keypair and the worker allow-list, as files under
 * `CORRAL_HOME/keys/` (folder 0700, files 0600). A running daemon notices allow-list changes
 * within `CORRAL_KEY_POLL_MS`: `revoke` needs no restart.
 *
 * Heavy modules (zeromq) load inside the actions, so `corral --help` stays fast.
 */
import { existsSync, rmSync } from 'node:fs';
import { resolve } from 'node:path';
import type { Command } from 'commander';
import type { Config } from '../../config.ts';
import { intArg } from '../args.ts';
import { CorralError } from '../../base/errors.ts';

type ConfigFn = () => Config;
type RunFn = (p: Promise<number>) => void;
interface Io {
  out: NodeJS.WritableStream;
  err: NodeJS.WritableStream;
}

const capacityArg = intArg(1, 1024);

async function paths(config: Config) {
  const keys = await import('../../fabric/keys.ts');
  return {
    keys,
    paths: keys.keyPaths(config.homeDir, {
      ...(config.daemonKeyFile ? { daemonKeyFile: config.daemonKeyFile } : {}),
      ...(config.allowlistFile ? { allowlistFile: config.allowlistFile } : {}),
    }),
  };
}

export function registerKeysCommands(program: Command, config: ConfigFn, run: RunFn, io: Io): void {
  const cmd = program.command('keys').description("CURVE keys: the daemon's keypair and the worker allow-list (under CORRAL_HOME/keys)");

  cmd
    .command('init')
    .description("create the daemon's keypair if missing (the daemon also does this on first start); print its public key")
    .action(() =>
      run(
        (async () => {
          const { keys, paths: p } = await paths(config());
          const { keys: pair, created } = keys.ensureDaemonKey(p);
          io.out.write(
            `${created ? 'created' : 'exists'}: ${p.daemonKey}\nserver public key: ${pair.publicKey}\nallow-list: ${p.allowlist}\n`,
          );
          return 0;
        })(),
      ),
    );

  cmd
    .command('add-worker')
    .description(
      "issue a key for a worker id: a keypair and a registration token, allow-listed; writes the worker's key file (or prints it)",
    )
    .argument('<id>', 'the worker id (1..64 chars of [A-Za-z0-9._:-])')
    .option('--capacity <n>', 'cap the capacity this worker may register with', capacityArg)
    .option(
      '--agents <pattern...>',
      'the agents this key may be given turns of and emit to: agent_uids, or prefixes ending in * (default: every agent)',
    )
    .option(
      '--out <file>',
      'write the key file here (mode 0600) instead of printing it; a missing folder is created 0700, an existing one is left as it is',
    )
    .option('--force', 'overwrite --out if it exists')
    .action((id: string, o: { capacity?: number; agents?: string[]; out?: string; force?: boolean }) =>
      run(
        (async () => {
          const { keys, paths: p } = await paths(config());
          // checked before anything is written: a bad pattern issues no key
          const agents = o.agents === undefined ? undefined : keys.checkedScope(o.agents);
          if (o.out && existsSync(o.out) && !o.force) {
            throw new CorralError('invalid_argument', `${o.out} exists (use --force to overwrite)`);
          }
          const { keys: pair } = keys.ensureDaemonKey(p);
          const issued = keys.addWorkerKey(p, pair.publicKey, id, {
            ...(o.capacity === undefined ? {} : { capacity: o.capacity }),
            ...(agents === undefined ? {} : { agents }),
          });
          const text = keys.formatWorkerKeyFile(issued);
          if (o.out) {
            keys.writePrivateFile(resolve(o.out), text);
            io.out.write(`wrote ${o.out} for worker ${id} (server public key ${pair.publicKey})\n`);
          } else {
            io.out.write(text);
          }
          io.err.write(`worker ${id} is on the allow-list; any key issued before for it is revoked\n`);
          return 0;
        })(),
      ),
    );

  cmd
    .command('list')
    .description('list the allow-listed workers: public keys, capacity caps, agent scopes (no secrets)')
    .option('--json', 'JSON output')
    .action((o: { json?: boolean }) =>
      run(
        (async () => {
          const { keys, paths: p } = await paths(config());
          const entries = keys.readAllowlist(p.allowlist);
          if (o.json) {
            io.out.write(
              `${JSON.stringify(
                entries.map(({ token_sha256: _t, ...rest }) => rest),
                null,
                2,
              )}\n`,
            );
            return 0;
          }
          if (entries.length === 0) io.out.write(`no workers on the allow-list (${p.allowlist})\n`);
          for (const e of entries) {
            const agents = e.agents === undefined ? 'all' : e.agents.join(',');
            io.out.write(`${e.worker_id}\t${e.public_key}\tcapacity=${e.capacity ?? '-'}\tagents=${agents}\t${e.created_at ?? ''}\n`);
          }
          return 0;
        })(),
      ),
    );

  cmd
    .command('revoke')
    .description('remove a worker from the allow-list; a running daemon drops it and re-dispatches its turns')
    .argument('<id>', 'the worker id')
    .action((id: string) =>
      run(
        (async () => {
          const { keys, paths: p } = await paths(config());
          if (!keys.revokeWorkerKey(p, id)) throw new CorralError('nothing_matched', `worker ${id} is not on the allow-list`);
          // a key file issued under CORRAL_HOME for a local worker goes too
          rmSync(keys.workerKeyPath(p, id), { force: true });
          io.out.write(`revoked ${id}\n`);
          return 0;
        })(),
      ),
    );
}
