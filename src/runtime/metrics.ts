/** The runtime's metric hooks; the daemon binds them to Prometheus counters. */
export interface RuntimeMetrics {
  dispatched(): void;
  committed(): void;
  duplicate(): void;
  failed(deadLettered: boolean): void;
  rejected(reason: string): void;
  invalidMessage(): void;
}

export const noopMetrics: RuntimeMetrics = {
  dispatched: () => undefined,
  committed: () => undefined,
  duplicate: () => undefined,
  failed: () => undefined,
  rejected: () => undefined,
  invalidMessage: () => undefined,
};
