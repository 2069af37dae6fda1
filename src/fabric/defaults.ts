// Protocol defaults the configuration needs too. No imports: the configuration loads this on
// every command, and the protocol module's schemas are ~15 ms of start-up that only the daemon
// and the workers use.

/** The daemon's default too (`CORRAL_PROGRESS_INTERVAL_MS`): one value, so doc, SDK and daemon agree. */
export const DEFAULT_PROGRESS_INTERVAL_MS = 10_000;
