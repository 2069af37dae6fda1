/**
 * The broker's ROUTER socket, configured and bound: every option here bounds what a peer can
 * make the daemon hold or do (src/fabric/broker.ts, invariants 4, 8 and 9).
 */
import { Router, type Context } from 'zeromq';
import { CorralError, toError } from '../base/errors.ts';

export interface RouterSocketOptions {
  context: Context;
  endpoint: string;
  maxMessageBytes: number;
  receiveHighWaterMark: number;
  handshakeIntervalMs: number;
  /** ZMTP heartbeat interval; 0 is off. */
  zmtpHeartbeatMs: number;
  curve?: { secretKey: string; publicKey: string } | undefined;
  /** The 32 random bytes libzmq hands the broker when a connection ends. */
  disconnectMsg: Buffer;
}

/** The protected option setters of zeromq.js sockets, for libzmq's draft options. */
interface RawOptions {
  setInt32Option(option: number, value: number): void;
  setStringOption(option: number, value: string | Buffer | null): void;
}

/** A bound ROUTER socket; closes it and throws `invalid_config` when it cannot be made. */
export async function openRouterSocket(o: RouterSocketOptions): Promise<Router> {
  const zmtp = o.zmtpHeartbeatMs;
  const socket = new Router({
    context: o.context,
    mandatory: true,
    sendTimeout: 0,
    linger: 0,
    // Twice the limit: frames in between reach the broker, which refuses and counts them
    // (invariant 8); libzmq drops a connection that sends more.
    maxMessageSize: o.maxMessageBytes * 2,
    // invariant 8: libzmq's default (1000) let one peer flooding 1 MiB frames park up to 2 GB
    // in the daemon while the receive loop parsed them (docs/benchmarks.md, "Receive high-water mark")
    receiveHighWaterMark: o.receiveHighWaterMark,
    handshakeInterval: o.handshakeIntervalMs,
    zapDomain: 'corral',
    ...(o.curve ? { curveServer: true, curveSecretKey: o.curve.secretKey, curvePublicKey: o.curve.publicKey } : {}),
    ...(zmtp > 0 ? { heartbeatInterval: zmtp, heartbeatTimeout: zmtp * 3 } : {}),
  });
  try {
    // invariant 9 (draft options of libzmq 4.3: ZMQ_ROUTER_NOTIFY = 97, NOTIFY_CONNECT = 1;
    // ZMQ_DISCONNECT_MSG = 111); set before bind, so every connection carries them
    (socket as unknown as RawOptions).setInt32Option(97, 1);
    (socket as unknown as RawOptions).setStringOption(111, o.disconnectMsg);
  } catch (e) {
    socket.close();
    throw new CorralError('invalid_config', `this libzmq lacks the draft options the broker needs: ${toError(e).message}`, { cause: e });
  }
  try {
    await socket.bind(o.endpoint);
  } catch (e) {
    socket.close();
    throw new CorralError('invalid_config', `broker cannot bind ${o.endpoint}: ${toError(e).message}`, { cause: e });
  }
  return socket;
}
