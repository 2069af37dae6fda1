/**
 * How the runtime reaches workers (the broker's serial send queue: it never touches the socket),
 * and the parts the steps of the event path share.
 */
import type { Clock } from '../base/clock.ts';
import type { SendResult } from '../fabric/broker.ts';
import type { DaemonMessage } from '../fabric/protocol.ts';
import type { Logger } from '../base/logger.ts';
import type { BackgroundWork } from './background.ts';
import type { DatabaseRetry } from '../base/db-retry.ts';
import type { ActorDirectory } from './directory.ts';
import type { RuntimeMetrics } from './metrics.ts';
import type { AttemptFailures } from './attempt-failure.ts';
import type { TurnBeginner } from './turn-begin.ts';
import type { TurnCommits } from './turn-commit.ts';
import type { WorkerRegistry } from './worker-registry.ts';
import type { TurnTracer } from '../base/turn-tracer.ts';

export interface Transport {
  send(workerId: string, msg: DaemonMessage): Promise<SendResult>;
  /** Drops a worker's session: it must register again before it is used. */
  forget?(workerId: string): void;
}

/** What the dispatcher and the reply pipeline both work with (wired by the Runtime). */
export interface RuntimeParts {
  /** The begin step (T2) and its re-dispatch. */
  begin: TurnBeginner;
  /** The commit step (T5, T5'). */
  commits: TurnCommits;
  /** The attempt-failure step. */
  failures: AttemptFailures;
  transport: Transport;
  workers: WorkerRegistry;
  directory: ActorDirectory;
  background: BackgroundWork;
  retry: DatabaseRetry;
  clock: Clock;
  logger: Logger;
  metrics: RuntimeMetrics;
  /** Spans of the turns' attempts (docs/observability.md); undefined: the daemon does not trace. */
  tracer?: TurnTracer | undefined;
}
