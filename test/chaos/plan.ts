/** The event plan of a scenario: which actors get which payloads, reproducible from a seed. */
/** Deterministic PRNG (mulberry32) so a run can be reproduced from its seed. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export interface ActorRef {
  agentUid: string;
  sessionId: string;
}

export interface PlannedEvent {
  /** Set when enqueued (UUIDv7 from the event queue). */
  id?: string;
  actor: ActorRef;
  /** Position within its actor (0-based, enqueue order). */
  ordinal: number;
  payload: { text: string; delayMs?: number; fail?: true };
}

export interface PlanOptions {
  events: number;
  actors: number;
  /** How many `{"fail": true}` events (they exhaust their retries and dead-letter). */
  failures: number;
  seed: number;
  /** Range of `delayMs` for slow events. */
  delayMs?: [number, number];
  /** Fraction of events that carry a delay. */
  slowFraction?: number;
  /**
   * `[min, max]`: after each actor's first event, events come in runs of min–max consecutive
   * events of one actor (a burst: what a batching input policy coalesces). Absent: every event
   * picks its actor at random.
   */
  burst?: [number, number];
}

export function planEvents(o: PlanOptions): PlannedEvent[] {
  const rand = rng(o.seed);
  const [dmin, dmax] = o.delayMs ?? [50, 400];
  const actors: ActorRef[] = Array.from({ length: o.actors }, (_, i) => ({
    agentUid: `chaos-agent-${i % 7}`,
    sessionId: `s${String(i).padStart(3, '0')}`,
  }));
  const failAt = new Set<number>();
  while (failAt.size < Math.min(o.failures, o.events)) failAt.add(Math.floor(rand() * o.events));
  const ordinals = new Map<ActorRef, number>();
  const plan: PlannedEvent[] = [];
  let current = actors[0]!;
  let run = 0;
  for (let i = 0; i < o.events; i++) {
    // Every actor gets its share; the order across actors is shuffled (in bursts, with `burst`).
    let actor: ActorRef;
    if (i < o.actors) actor = actors[i]!;
    else {
      if (run <= 0) {
        current = actors[Math.floor(rand() * o.actors)]!;
        run = o.burst ? o.burst[0] + Math.floor(rand() * (o.burst[1] - o.burst[0] + 1)) : 1;
      }
      actor = current;
      run--;
    }
    const ordinal = ordinals.get(actor) ?? 0;
    ordinals.set(actor, ordinal + 1);
    const payload: PlannedEvent['payload'] = { text: `${actor.agentUid}/${actor.sessionId}#${ordinal}` };
    if (rand() < (o.slowFraction ?? 0.45)) payload.delayMs = Math.round(dmin + rand() * (dmax - dmin));
    if (failAt.has(i)) payload.fail = true;
    plan.push({ actor, ordinal, payload });
  }
  return plan;
}
