/**
 * Standard Webhooks signatures (https://www.standardwebhooks.com), as corral's outbox sends them
 * and as a receiver checks them:
 *
 *  W1 A secret is `whsec_` and the base64 of the key (24 to 64 random bytes when corral makes one);
 *     the HMAC key is the decoded bytes, not the text.
 *  W2 The signed content is `<webhook-id>.<webhook-timestamp>.<body>`, the body exactly as sent.
 *  W3 `webhook-signature` is `v1,` and the base64 of its HMAC-SHA256. During a secret's rotation
 *     (`corral sinks rotate-secret`) it holds two, space-separated, the new secret's first: a
 *     receiver that knows either secret finds a match, and one match is enough.
 *  W4 A receiver refuses a timestamp too far from its own clock (5 minutes by default), so an old
 *     message cannot be replayed, and de-duplicates by `webhook-id`, which stays the same on every
 *     retry of one message.
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { CorralError } from '../base/errors.ts';

export const SECRET_PREFIX = 'whsec_';
const SECRET_TEXT = /^whsec_[A-Za-z0-9+/]+={0,2}$/;
/** W4: how far a timestamp may be from the receiver's clock. */
export const DEFAULT_TOLERANCE_S = 5 * 60;

/** W1: a new secret of 32 random bytes. */
export function generateSecret(): string {
  return `${SECRET_PREFIX}${randomBytes(32).toString('base64')}`;
}

/** W1: the key of `secret`; `invalid_argument` when it is not a Standard Webhooks secret of at least 16 bytes. */
export function secretKey(secret: string): Buffer {
  const text = secret.trim();
  if (!SECRET_TEXT.test(text)) {
    throw new CorralError(
      'invalid_argument',
      'a webhook secret is whsec_ followed by base64 (e.g. from corral sinks add, or openssl rand -base64 32)',
    );
  }
  const key = Buffer.from(text.slice(SECRET_PREFIX.length), 'base64');
  if (key.length < 16 || key.length > 128)
    throw new CorralError('invalid_argument', `a webhook secret's key is 16 to 128 bytes, not ${key.length}`);
  return key;
}

/** W2, W3: the `webhook-signature` header of one message. */
export function signWebhook(secret: string, id: string, timestampS: number, body: string): string {
  const mac = createHmac('sha256', secretKey(secret)).update(`${id}.${timestampS}.${body}`).digest('base64');
  return `v1,${mac}`;
}

/**
 * W3: the `webhook-signature` header signed by each of `secrets`, space-separated, in order (a
 * rotation's overlap: the new secret first, then the previous one).
 */
export function signatureHeader(secrets: readonly string[], id: string, timestampS: number, body: string): string {
  return secrets.map((s) => signWebhook(s, id, timestampS, body)).join(' ');
}

export type VerifyResult = { ok: true } | { ok: false; reason: 'bad_timestamp' | 'stale' | 'no_match' };

/** W3, W4: whether `headers` sign `body` with `secret`, as a receiver checks it. */
export function verifyWebhook(
  secret: string,
  headers: { id: string; timestamp: string; signature: string },
  body: string,
  opts: { nowS?: number; toleranceS?: number } = {},
): VerifyResult {
  if (!/^\d{1,12}$/.test(headers.timestamp)) return { ok: false, reason: 'bad_timestamp' };
  const ts = Number(headers.timestamp);
  const now = opts.nowS ?? Math.floor(Date.now() / 1000);
  if (Math.abs(now - ts) > (opts.toleranceS ?? DEFAULT_TOLERANCE_S)) return { ok: false, reason: 'stale' };
  const expected = Buffer.from(signWebhook(secret, headers.id, ts, body).slice(3), 'base64');
  for (const candidate of headers.signature.split(' ')) {
    const [version, mac] = candidate.split(',', 2);
    if (version !== 'v1' || mac === undefined) continue;
    const given = Buffer.from(mac, 'base64');
    if (given.length === expected.length && timingSafeEqual(given, expected)) return { ok: true };
  }
  return { ok: false, reason: 'no_match' };
}
