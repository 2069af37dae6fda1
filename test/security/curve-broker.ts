/**
 * A Broker with CURVE on and an in-memory allow-list (no files, no database), and worker keys
 * issued for it: the containment tests drive it with raw peers on real sockets.
 */
import { Writable } from 'node:stream';
import { pino, type Logger } from 'pino';
import { curveKeyPair } from 'zeromq';
import { KeyAuthenticator } from '../../src/fabric/auth.ts';
import { Broker, type BrokerEvent, type BrokerOptions } from '../../src/fabric/broker.ts';
import { newToken, tokenHash, type AllowEntry } from '../../src/fabric/keys.ts';
import { RawPeer } from '../helpers/raw-peer.ts';

/** What a key file holds (src/fabric/keys.ts), plus the entry the allow-list gets for it. */
export interface IssuedKey {
  worker_id: string;
  public_key: string;
  secret_key: string;
  server_key: string;
  token: string;
  entry: AllowEntry;
}

export interface CurveBroker {
  broker: Broker;
  events: BrokerEvent[];
  authenticator: KeyAuthenticator;
  /** Every log line the broker wrote, parsed. */
  logs: Array<Record<string, unknown> & { msg: string }>;
  issue(workerId: string, extra?: Partial<AllowEntry>): IssuedKey;
  /** A raw peer connecting with `key`'s CURVE keypair (closed after the test). */
  peer(key: IssuedKey, routingId?: string): RawPeer;
  /** A peer that records its socket events from before it connects. */
  watched(key: IssuedKey, routingId?: string): { peer: RawPeer; events: string[] };
  stop(): Promise<void>;
}

/** A logger keeping every line, for tests that count what the broker logs. */
export function capturingLogger(lines: Array<Record<string, unknown> & { msg: string }>): Logger {
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const line of chunk.toString('utf8').split('\n')) if (line) lines.push(JSON.parse(line) as { msg: string });
      done();
    },
  });
  return pino({ level: 'info' }, sink);
}

export async function startCurveBroker(over: Partial<BrokerOptions> = {}): Promise<CurveBroker> {
  const daemon = curveKeyPair();
  const authenticator = new KeyAuthenticator({ daemonSecretKey: daemon.secretKey });
  const entries: AllowEntry[] = [];
  const events: BrokerEvent[] = [];
  const logs: CurveBroker['logs'] = [];
  const peers: RawPeer[] = [];
  const broker = new Broker({
    endpoint: 'tcp://127.0.0.1:0',
    logger: capturingLogger(logs),
    heartbeatIntervalMs: 200,
    authenticator,
    curve: {
      publicKey: daemon.publicKey,
      secretKey: daemon.secretKey,
      isKeyAllowed: (k) => authenticator.isKeyAllowed(k),
      describeKey: (k) => authenticator.idsOfKey(k).join(','),
    },
    onEvent: (e) => events.push(e),
    ...over,
  });
  await broker.start();
  const issue = (workerId: string, extra: Partial<AllowEntry> = {}): IssuedKey => {
    const pair = curveKeyPair();
    const token = newToken();
    const entry: AllowEntry = { worker_id: workerId, public_key: pair.publicKey, token_sha256: tokenHash(token), ...extra };
    entries.push(entry);
    authenticator.update(entries);
    return { worker_id: workerId, public_key: pair.publicKey, secret_key: pair.secretKey, server_key: daemon.publicKey, token, entry };
  };
  const peer = (key: IssuedKey, routingId?: string): RawPeer => {
    const p = new RawPeer(broker.endpoint, routingId, { serverKey: key.server_key, publicKey: key.public_key, secretKey: key.secret_key });
    peers.push(p);
    return p;
  };
  const watched = (key: IssuedKey, routingId?: string): { peer: RawPeer; events: string[] } => {
    const p = peer(key, routingId);
    const seen: string[] = [];
    // subscribed in the tick the socket was made: no event of its first attempt is missed
    for (const type of ['handshake', 'handshake:error:auth', 'disconnect'] as const) p.dealer.events.on(type, () => void seen.push(type));
    return { peer: p, events: seen };
  };
  return {
    broker,
    events,
    authenticator,
    logs,
    issue,
    peer,
    watched,
    stop: async () => {
      await Promise.all(peers.map((p) => p.close()));
      await broker.stop();
    },
  };
}
