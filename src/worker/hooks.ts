/** The worker SDK's fault points for tests (no-ops in production), and how outgoing messages pass them. */
import { toError } from '../base/errors.ts';
import type { Logger } from '../base/logger.ts';
import type { DaemonMessage, TurnResult, WorkerMessage } from '../fabric/protocol.ts';

/**
 * Named fault points for tests (no-ops in production). Each `beforeSend*` maps one outgoing
 * message to the list actually sent: return `[msg, msg]` to duplicate, `[]` to drop.
 */
export interface WorkerHooks {
  beforeSend?(msg: WorkerMessage): WorkerMessage[];
  beforeSendResult?(msg: TurnResult): WorkerMessage[];
  onReceive?(msg: DaemonMessage): void;
}

/** What `msg` becomes after the hooks; undefined when no hook applies to it. A throwing hook leaves it unchanged. */
export function applySendHooks(hooks: WorkerHooks | undefined, msg: WorkerMessage, log: Logger): WorkerMessage[] | undefined {
  const resultHooked = msg.type === 'turn_result' && hooks?.beforeSendResult !== undefined;
  const sendHooked = hooks?.beforeSend !== undefined;
  if (!resultHooked && !sendHooked) return undefined;
  try {
    let out = resultHooked ? hooks!.beforeSendResult!(msg as TurnResult) : [msg];
    if (sendHooked) out = out.flatMap((m) => hooks!.beforeSend!(m));
    return out;
  } catch (e) {
    log.error({ err: toError(e), type: msg.type }, 'send hook threw; sending unchanged');
    return [msg];
  }
}
