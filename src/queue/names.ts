/**
 * The names of corral's queues. Apart from src/queue/boss.ts so that commands that only read
 * (`corral status`, `corral dlq list`) can name the queues without loading pg-boss.
 */
import type { Config } from '../config.ts';
import type { Queues } from '../db/boss/jobs.ts';

/** The one place queue names are made: the actor queue and `<queue>-dlq`, in pg-boss's schema. */
export function queuesOf(config: Pick<Config, 'queueName' | 'bossSchema'>): Queues {
  return { schema: config.bossSchema, events: config.queueName, deadLetter: `${config.queueName}-dlq` };
}
