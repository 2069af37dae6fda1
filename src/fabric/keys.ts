/**
 * CURVE key material on disk: the daemon's long-term keypair, one key file per worker, and the
 * allow-list that lists, per worker id, the public key admitted for it, its token's hash and its
 * scope (a registration needs the token and a proof made with the id's own secret key, see
 * src/fabric/auth.ts).
 *
 * Rules:
 * 1. Every file written here is mode 0600, and a folder created for it 0700: a secret key or
 *    token readable by another local user would let that user impersonate the daemon or a
 *    worker. A folder that exists already is never changed (it may be shared: see
 *    `ensurePrivateDir`).
 * 2. The allow-list holds no secrets: only public keys and the SHA-256 of each worker's token.
 *    The token itself lives only in the worker's key file.
 * 3. Files are replaced atomically (write a temp file, rename), so a daemon polling the
 *    allow-list never reads half a file.
 * 4. Nothing here logs; callers must never log a secret key or a token.
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import {
  chmodSync,
  closeSync,
  existsSync,
  linkSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  statSync,
  unlinkSync,
  writeFileSync,
} from 'node:fs';
import { dirname, join } from 'node:path';
import { curveKeyPair } from 'zeromq';
import { z } from 'zod';
import { CorralError, toError } from '../base/errors.ts';
import { MAX_CAPACITY, WORKER_ID_PATTERN } from './protocol.ts';
import { MAX_PATTERN_CHARS, MAX_SCOPE_PATTERNS, agentPatternProblem, checkedScope } from '../base/agent-scope.ts';

/** Re-exported: `corral keys` takes scopes through this module. */
export { checkedScope };

const Z85_CHARS = '0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#';
/** A CURVE key in Z85: 40 characters for 32 bytes. */
export const Z85_KEY_PATTERN = /^[0-9a-zA-Z.\-:+=^!/*?&<>()[\]{}@%$#]{40}$/;

/** Z85-encodes bytes (length a multiple of 4); zeromq.js has no helper for the ZAP key frame. */
export function z85Encode(data: Uint8Array): string {
  if (data.length % 4 !== 0) throw new CorralError('invalid_argument', 'z85: length must be a multiple of 4');
  let out = '';
  for (let i = 0; i < data.length; i += 4) {
    let value = ((data[i]! << 24) >>> 0) + (data[i + 1]! << 16) + (data[i + 2]! << 8) + data[i + 3]!;
    const chunk: string[] = [];
    for (let j = 0; j < 5; j++) {
      chunk.unshift(Z85_CHARS[value % 85]!);
      value = Math.floor(value / 85);
    }
    out += chunk.join('');
  }
  return out;
}

/** Decodes Z85 text (length a multiple of 5), e.g. a 40-character CURVE key to its 32 bytes. */
export function z85Decode(text: string): Buffer {
  if (text.length % 5 !== 0) throw new CorralError('invalid_argument', 'z85: length must be a multiple of 5');
  const out = Buffer.alloc((text.length / 5) * 4);
  for (let i = 0; i < text.length; i += 5) {
    let value = 0;
    for (let j = 0; j < 5; j++) {
      const digit = Z85_CHARS.indexOf(text[i + j]!);
      if (digit < 0) throw new CorralError('invalid_argument', 'z85: not a Z85 character');
      value = value * 85 + digit;
    }
    if (value > 0xffffffff) throw new CorralError('invalid_argument', 'z85: group out of range');
    out.writeUInt32BE(value, (i / 5) * 4);
  }
  return out;
}

export interface KeyPair {
  publicKey: string;
  secretKey: string;
}

/** A fresh CURVE keypair (Z85), from libzmq. */
export function newKeyPair(): KeyPair {
  return curveKeyPair();
}

/** A fresh registration token: 32 random bytes, base64url. */
export function newToken(): string {
  return randomBytes(32).toString('base64url');
}

export function tokenHash(token: string): string {
  return createHash('sha256').update(token, 'utf8').digest('hex');
}

/** Constant-time check of a presented token against a stored SHA-256 (hex). */
export function tokenMatches(presented: string, expectedHashHex: string): boolean {
  const a = createHash('sha256').update(presented, 'utf8').digest();
  const b = Buffer.from(expectedHashHex, 'hex');
  return a.length === b.length && timingSafeEqual(a, b);
}

const z85Key = z.string().regex(Z85_KEY_PATTERN, 'expected a 40-character Z85 CURVE key');
const workerIdSchema = z.string().regex(WORKER_ID_PATTERN);

export const DAEMON_KEY_FORMAT = 'corral-daemon-key/1';
export const WORKER_KEY_FORMAT = 'corral-worker-key/1';
export const ALLOWLIST_FORMAT = 'corral-allowlist/1';

const daemonKeySchema = z.object({ format: z.literal(DAEMON_KEY_FORMAT), public_key: z85Key, secret_key: z85Key });

export const workerKeyFileSchema = z.object({
  format: z.literal(WORKER_KEY_FORMAT),
  worker_id: workerIdSchema,
  public_key: z85Key,
  secret_key: z85Key,
  /** The daemon's public key (`curve_serverkey`). */
  server_key: z85Key,
  /** Sent in `worker_ready.auth` (scheme `key`), with the key proof, to register as the worker id. */
  token: z.string().min(16).max(256),
});
export type WorkerKeyFile = z.infer<typeof workerKeyFileSchema>;

const allowEntrySchema = z.object({
  worker_id: workerIdSchema,
  public_key: z85Key,
  token_sha256: z.string().regex(/^[0-9a-f]{64}$/),
  capacity: z.int().min(1).max(MAX_CAPACITY).optional(),
  /** The agents this key may be given turns of and emit to (src/base/agent-scope.ts); absent: every agent. */
  agents: z
    .array(
      z
        .string()
        .max(MAX_PATTERN_CHARS)
        .refine((p) => agentPatternProblem(p) === undefined, 'invalid agent pattern'),
    )
    .min(1)
    .max(MAX_SCOPE_PATTERNS)
    .optional(),
  created_at: z.string().optional(),
});
export type AllowEntry = z.infer<typeof allowEntrySchema>;
const allowlistSchema = z.object({ format: z.literal(ALLOWLIST_FORMAT), workers: z.array(allowEntrySchema) });

/** Where the key files live under `CORRAL_HOME`. */
export interface KeyPaths {
  dir: string;
  daemonKey: string;
  allowlist: string;
  workersDir: string;
}

export function keyPaths(homeDir: string, over: { daemonKeyFile?: string; allowlistFile?: string } = {}): KeyPaths {
  const dir = join(homeDir, 'keys');
  return {
    dir,
    daemonKey: over.daemonKeyFile ?? join(dir, 'daemon.key'),
    allowlist: over.allowlistFile ?? join(dir, 'workers.json'),
    workersDir: join(dir, 'workers'),
  };
}

/** The key file a worker with `workerId` finds under `CORRAL_HOME` by default. */
export function workerKeyPath(paths: KeyPaths, workerId: string): string {
  return join(paths.workersDir, `${workerId}.key`);
}

/**
 * Creates `dir` (and any missing parent) 0700 when it does not exist. A folder that exists is left
 * as it is: it may be anyone's (`--out gpu-box-1.key` names the current folder, which may hold
 * the embedded PostgreSQL that the `postgres` user must still reach); the files in it are 0600.
 */
function ensurePrivateDir(dir: string): void {
  // the mode applies to each folder created, less the umask, which can only take bits away
  mkdirSync(dir, { recursive: true, mode: 0o700 });
}

/** Atomic write, mode 0600 (rules 1 and 3); the folder as `ensurePrivateDir` leaves it. */
export function writePrivateFile(path: string, text: string): void {
  ensurePrivateDir(dirname(path));
  const tmp = `${path}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  writeFileSync(tmp, text, { mode: 0o600 });
  chmodSync(tmp, 0o600);
  renameSync(tmp, path);
}

function readJson(path: string, what: string): unknown {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new CorralError('invalid_config', `cannot read the ${what} ${path}: ${toError(e).message}`);
  }
  try {
    return JSON.parse(text) as unknown;
  } catch {
    // never echo the content: it may hold a secret
    throw new CorralError('invalid_config', `the ${what} ${path} is not valid JSON`);
  }
}

function parseOrThrow<T>(schema: z.ZodType<T>, raw: unknown, what: string, path: string): T {
  const r = schema.safeParse(raw);
  if (!r.success) {
    const i = r.error.issues[0];
    throw new CorralError('invalid_config', `the ${what} ${path} is invalid: ${i ? `${i.path.join('.')}: ${i.message}` : ''}`);
  }
  return r.data;
}

export function readDaemonKey(path: string): KeyPair {
  const k = parseOrThrow(daemonKeySchema, readJson(path, 'daemon key file'), 'daemon key file', path);
  return { publicKey: k.public_key, secretKey: k.secret_key };
}

/** Loads the daemon keypair, creating it (and the 0700 folder) on first use. */
export function ensureDaemonKey(paths: KeyPaths): { keys: KeyPair; created: boolean } {
  if (existsSync(paths.daemonKey)) return { keys: readDaemonKey(paths.daemonKey), created: false };
  // its folder: `keys/` by default, or that of CORRAL_DAEMON_KEY_FILE
  ensurePrivateDir(dirname(paths.daemonKey));
  const keys = newKeyPair();
  const tmp = `${paths.daemonKey}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  writeFileSync(
    tmp,
    `${JSON.stringify({ format: DAEMON_KEY_FORMAT, public_key: keys.publicKey, secret_key: keys.secretKey }, null, 2)}\n`,
    {
      mode: 0o600,
    },
  );
  try {
    // link() fails if the file exists: a daemon and a worker starting together agree on one key
    linkSync(tmp, paths.daemonKey);
  } catch (e) {
    if ((e as { code?: string }).code !== 'EEXIST') throw e;
    return { keys: readDaemonKey(paths.daemonKey), created: false };
  } finally {
    unlinkSync(tmp);
  }
  return { keys, created: true };
}

export function readWorkerKeyFile(path: string): WorkerKeyFile {
  return parseOrThrow(workerKeyFileSchema, readJson(path, 'worker key file'), 'worker key file', path);
}

/** A worker key given as a key file's content: the parsed object, or its JSON text. */
export function parseWorkerKey(key: unknown): WorkerKeyFile {
  let raw = key;
  if (typeof key === 'string') {
    try {
      raw = JSON.parse(key) as unknown;
    } catch {
      // never echo the content: it holds a secret
      throw new CorralError('invalid_config', 'the worker key given is not valid JSON');
    }
  }
  const r = workerKeyFileSchema.safeParse(raw);
  if (!r.success) {
    const i = r.error.issues[0];
    throw new CorralError('invalid_config', `the worker key given is invalid: ${i ? `${i.path.join('.')}: ${i.message}` : ''}`);
  }
  return r.data;
}

export function readAllowlist(path: string): AllowEntry[] {
  if (!existsSync(path)) return [];
  return parseOrThrow(allowlistSchema, readJson(path, 'allow-list'), 'allow-list', path).workers;
}

export function writeAllowlist(path: string, entries: AllowEntry[]): void {
  writePrivateFile(path, `${JSON.stringify({ format: ALLOWLIST_FORMAT, workers: entries }, null, 2)}\n`);
}

/** mtime + size of a file, or null when absent: the cheap change check for polling. */
export function fileStamp(path: string): string | null {
  try {
    const s = statSync(path);
    return `${s.mtimeMs}:${s.size}:${s.ino}`;
  } catch {
    return null;
  }
}

/**
 * Serialises read-modify-write of the allow-list between processes (several `corral worker`
 * processes issuing their keys at once would otherwise lose each other's entries). A lock file
 * older than 10 s is taken to be left by a dead process.
 */
function withAllowlistLock<T>(paths: KeyPaths, fn: () => T): T {
  ensurePrivateDir(dirname(paths.allowlist));
  const lock = `${paths.allowlist}.lock`;
  const deadline = Date.now() + 10_000;
  for (;;) {
    try {
      closeSync(openSync(lock, 'wx', 0o600));
      break;
    } catch (e) {
      if ((e as { code?: string }).code !== 'EEXIST') throw e;
      try {
        if (Date.now() - statSync(lock).mtimeMs > 10_000) unlinkSync(lock);
      } catch {
        // gone meanwhile: retry
      }
      if (Date.now() > deadline) throw new CorralError('timeout', `the allow-list is locked (${lock})`);
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 20);
    }
  }
  try {
    return fn();
  } finally {
    try {
      unlinkSync(lock);
    } catch {
      // already removed
    }
  }
}

/**
 * Issues a key for `workerId`: a new keypair and token, an allow-list entry (replacing any
 * previous one for that id, which revokes the old key), and the key file's content.
 */
export function addWorkerKey(
  paths: KeyPaths,
  serverPublicKey: string,
  workerId: string,
  opts: { capacity?: number; agents?: readonly string[] } = {},
): WorkerKeyFile {
  if (!WORKER_ID_PATTERN.test(workerId)) {
    throw new CorralError('invalid_argument', `invalid worker id ${JSON.stringify(workerId).slice(0, 80)}`);
  }
  const agents = opts.agents === undefined ? undefined : checkedScope(opts.agents);
  const keys = newKeyPair();
  const token = newToken();
  withAllowlistLock(paths, () => {
    const entries = readAllowlist(paths.allowlist).filter((e) => e.worker_id !== workerId);
    entries.push({
      worker_id: workerId,
      public_key: keys.publicKey,
      token_sha256: tokenHash(token),
      ...(opts.capacity === undefined ? {} : { capacity: opts.capacity }),
      ...(agents === undefined ? {} : { agents }),
      created_at: new Date().toISOString(),
    });
    writeAllowlist(paths.allowlist, entries);
  });
  return {
    format: WORKER_KEY_FORMAT,
    worker_id: workerId,
    public_key: keys.publicKey,
    secret_key: keys.secretKey,
    server_key: serverPublicKey,
    token,
  };
}

export function formatWorkerKeyFile(k: WorkerKeyFile): string {
  return `${JSON.stringify(k, null, 2)}\n`;
}

/** Removes `workerId` from the allow-list; true when it was there. */
export function revokeWorkerKey(paths: KeyPaths, workerId: string): boolean {
  return withAllowlistLock(paths, () => {
    const entries = readAllowlist(paths.allowlist);
    const kept = entries.filter((e) => e.worker_id !== workerId);
    if (kept.length === entries.length) return false;
    writeAllowlist(paths.allowlist, kept);
    return true;
  });
}

/**
 * The key a worker running with the same `CORRAL_HOME` as its daemon uses: its file under
 * `keys/workers/`, issued on first use. Whoever can read the daemon's key folder is already
 * as trusted as the operator, so issuing here adds no privilege.
 */
export function ensureLocalWorkerKey(paths: KeyPaths, workerId: string, opts: { capacity?: number } = {}): string {
  const file = workerKeyPath(paths, workerId);
  const { keys } = ensureDaemonKey(paths);
  if (existsSync(file)) {
    const existing = readWorkerKeyFile(file);
    const listed = readAllowlist(paths.allowlist).find((e) => e.worker_id === workerId);
    if (
      existing.server_key === keys.publicKey &&
      listed &&
      listed.public_key === existing.public_key &&
      tokenMatches(existing.token, listed.token_sha256)
    ) {
      return file;
    }
  }
  const issued = addWorkerKey(paths, keys.publicKey, workerId, opts);
  writePrivateFile(file, formatWorkerKeyFile(issued));
  return file;
}

/** What the worker SDK needs from a key file: CURVE keys and the registration credentials (it adds the key proof). */
export function workerCredentials(
  k: WorkerKeyFile,
  serverKey?: string,
): {
  curve: { serverKey: string; publicKey: string; secretKey: string };
  auth: { scheme: string; credential: string };
} {
  return {
    curve: { serverKey: serverKey ?? k.server_key, publicKey: k.public_key, secretKey: k.secret_key },
    auth: { scheme: 'key', credential: k.token },
  };
}
