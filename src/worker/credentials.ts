/**
 * Where a worker's CURVE keys and registration token come from (docs/protocol.md §13):
 * - a key file (`corral keys add-worker ID --out FILE`), or its content: all a worker on another
 *   host needs; the worker id is the file's, and an id given besides may only repeat it;
 * - on the daemon's host, with neither, a key issued on first use under `CORRAL_HOME`
 *   (`keys/workers/<id>.key`), which a daemon with the same `CORRAL_HOME` accepts;
 * - `insecure`: none (a daemon started with --insecure).
 */
import { hostname } from 'node:os';
import { CorralError } from '../base/errors.ts';
import {
  ensureLocalWorkerKey,
  keyPaths,
  parseWorkerKey,
  readWorkerKeyFile,
  workerCredentials,
  type WorkerKeyFile,
} from '../fabric/keys.ts';

/** CURVE keys and registration credentials; the SDK adds the key proof (see `workerCredentials` in src/fabric/keys.ts). */
export interface WorkerCredentials {
  curve: { serverKey: string; publicKey: string; secretKey: string };
  auth: { scheme: string; credential: string };
}

export interface WorkerKeySource {
  /** A key file's path. */
  keyFile?: string;
  /** A key file's content: the parsed object or its JSON text (e.g. from a secret store). */
  key?: WorkerKeyFile | string;
  /** With a key: must be its worker id. Without: the id to issue a key for (default `<host>-<pid>`). */
  workerId?: string;
  /** The daemon's public key, overriding the key's `server_key`. */
  serverKey?: string;
  /** `CORRAL_HOME`, where a key is issued when none is given. */
  homeDir: string;
  daemonKeyFile?: string;
  allowlistFile?: string;
  /** No CURVE: any key given is not used. */
  insecure?: boolean;
  /** How the worker id is called in a mismatch's message (`--id` for the CLI). */
  idName?: string;
}

export interface ResolvedWorkerKey {
  workerId: string;
  /** Undefined with `insecure`. */
  credentials: WorkerCredentials | undefined;
  /** Where the key came from: its file, `(given)`, or `insecure`. */
  source: string;
}

/** `<host>-<pid>`: the worker id when none is given and no key names one. */
export function defaultWorkerId(): string {
  return `${hostname()
    .replace(/[^A-Za-z0-9._:-]/g, '-')
    .slice(0, 40)}-${process.pid}`;
}

/** The worker's id and credentials; throws `invalid_config` for a key that cannot be read, `invalid_argument` for an id that is not the key's. */
export function resolveWorkerKey(src: WorkerKeySource): ResolvedWorkerKey {
  if (src.insecure) return { workerId: src.workerId ?? defaultWorkerId(), credentials: undefined, source: 'insecure' };
  if (src.key !== undefined || src.keyFile !== undefined) {
    if (src.key !== undefined && src.keyFile !== undefined) throw new CorralError('invalid_argument', 'give a key or a key file, not both');
    const file = src.key !== undefined ? parseWorkerKey(src.key) : readWorkerKeyFile(src.keyFile!);
    if (src.workerId !== undefined && src.workerId !== file.worker_id) {
      throw new CorralError(
        'invalid_argument',
        `${src.idName ?? 'workerId'} ${src.workerId} differs from the key file's worker id ${file.worker_id}`,
      );
    }
    return { workerId: file.worker_id, credentials: workerCredentials(file, src.serverKey), source: src.keyFile ?? '(given)' };
  }
  const paths = keyPaths(src.homeDir, {
    ...(src.daemonKeyFile ? { daemonKeyFile: src.daemonKeyFile } : {}),
    ...(src.allowlistFile ? { allowlistFile: src.allowlistFile } : {}),
  });
  // The daemon's keypair is created by whichever of the daemon and its workers starts first
  // (exclusively: both end up with the same one), so start order does not matter.
  const workerId = src.workerId ?? defaultWorkerId();
  const file = ensureLocalWorkerKey(paths, workerId);
  return { workerId, credentials: workerCredentials(readWorkerKeyFile(file), src.serverKey), source: file };
}
