/** How the runtime reaches workers: the broker's serial send queue (it never touches the socket). */
import type { SendResult } from '../fabric/broker.ts';
import type { DaemonMessage } from '../fabric/protocol.ts';

export interface Transport {
  send(workerId: string, msg: DaemonMessage): Promise<SendResult>;
  /** Drops a worker's session: it must register again before it is used. */
  forget?(workerId: string): void;
}
