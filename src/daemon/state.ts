/**
 * Where a daemon is in its life: the composed one (src/daemon/daemon.ts) and `CorralDaemon.state`
 * (src/host/daemon.ts). A file of its own, with no imports, because the public types name it: the
 * package's declarations must not reach the daemon's internals (pg-boss, drizzle).
 */
export type DaemonState = 'idle' | 'starting' | 'running' | 'stopping' | 'stopped';
