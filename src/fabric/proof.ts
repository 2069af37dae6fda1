/**
 * The key proof of a registration (docs/protocol.md §13): a worker shows that it holds the CURVE
 * secret key allow-listed for its worker id by a MAC over a fresh nonce the daemon sent to its
 * connection, keyed by the X25519 shared secret of the worker's and the daemon's CURVE keys:
 *
 *   key   = X25519(worker secret key, daemon public key)  (= X25519(daemon secret, worker public))
 *   proof = base64url(HMAC-SHA256(key, "corral-worker-proof/1\n" + worker_id + "\n" + nonce))
 *
 * Only the worker's secret key, or the daemon's, computes `key`; the nonce makes each proof good
 * for one registration attempt on one connection. Pure functions, no state.
 */
import { createHmac, createPrivateKey, createPublicKey, diffieHellman, randomBytes, timingSafeEqual } from 'node:crypto';
import { CorralError, toError } from '../base/errors.ts';
import { z85Decode } from './keys.ts';
import { PROOF_TEXT_PATTERN } from './protocol.ts';

export const PROOF_LABEL = 'corral-worker-proof/1';

// DER wrappers of a raw X25519 key (RFC 8410): Node imports raw keys only inside them
const PKCS8_X25519 = Buffer.from('302e020100300506032b656e04220420', 'hex');
const SPKI_X25519 = Buffer.from('302a300506032b656e032100', 'hex');

function rawKey(z85: string, what: string): Buffer {
  const raw = z85.length === 40 ? z85Decode(z85) : undefined;
  if (raw?.length !== 32) throw new CorralError('invalid_argument', `${what} is not a 40-character Z85 CURVE key`);
  return raw;
}

/** X25519(secret, public) of two Z85 CURVE keys: the 32-byte secret both ends of a pair can compute. */
export function curveSharedSecret(secretKeyZ85: string, publicKeyZ85: string): Buffer {
  const privateKey = createPrivateKey({
    key: Buffer.concat([PKCS8_X25519, rawKey(secretKeyZ85, 'the secret key')]),
    format: 'der',
    type: 'pkcs8',
  });
  const publicKey = createPublicKey({
    key: Buffer.concat([SPKI_X25519, rawKey(publicKeyZ85, 'the public key')]),
    format: 'der',
    type: 'spki',
  });
  try {
    // OpenSSL refuses a low-order public key (an all-zero result): no proof can be made with it
    return diffieHellman({ privateKey, publicKey });
  } catch (e) {
    throw new CorralError('invalid_argument', `no X25519 secret for this key pair: ${toError(e).message}`, { cause: e });
  }
}

/** The proof for `workerId` and `nonce`, given the shared secret. */
export function registrationProof(sharedSecret: Buffer, workerId: string, nonce: string): string {
  return createHmac('sha256', sharedSecret).update(`${PROOF_LABEL}\n${workerId}\n${nonce}`, 'utf8').digest('base64url');
}

/** What a worker sends: the proof from its own secret key and the daemon's public key (`server_key`). */
export function workerProof(workerSecretKey: string, serverKey: string, workerId: string, nonce: string): string {
  return registrationProof(curveSharedSecret(workerSecretKey, serverKey), workerId, nonce);
}

/** Constant-time check of a presented proof. */
export function proofMatches(sharedSecret: Buffer, workerId: string, nonce: string, proof: string): boolean {
  if (!PROOF_TEXT_PATTERN.test(proof)) return false;
  const expected = Buffer.from(registrationProof(sharedSecret, workerId, nonce), 'base64url');
  const presented = Buffer.from(proof, 'base64url');
  return presented.length === expected.length && timingSafeEqual(presented, expected);
}

/** A fresh nonce: 32 random bytes, base64url. */
export function newNonce(): string {
  return randomBytes(32).toString('base64url');
}
