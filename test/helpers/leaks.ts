/**
 * A registry of what a test file must not leave behind: started brokers (every daemon owns one),
 * ZeroMQ sockets (workers, raw peers), child processes (test/helpers/processes.ts) and test
 * databases (test/helpers/db.ts). The setup
 * file test/setup.ts installs the hooks and fails a file that leaves any of them behind.
 *
 * The hooks wrap prototype methods (`Broker.start/stop`, the sockets' `bind/connect`) so that
 * nothing in `src` needs a test-only option.
 */
import { Dealer, Router, type Socket } from 'zeromq';
import { Broker } from '../../src/fabric/broker.ts';
import { undroppedDatabases } from './db.ts';
import { liveChildren, killAll } from './processes.ts';
import { waitFor } from './wait.ts';

const brokers = new Set<Broker>();
const sockets = new Set<Socket>();
let installed = false;

function wrap<T extends object>(proto: T, name: string, before: (self: T) => void, after?: (self: T, result: unknown) => unknown): void {
  const orig = (proto as Record<string, unknown>)[name] as (...a: unknown[]) => unknown;
  // zeromq's native methods are read-only on the base class: define own properties on the subclass.
  Object.defineProperty(proto, name, {
    configurable: true,
    writable: true,
    value(this: T, ...args: unknown[]) {
      before(this);
      const r = orig.apply(this, args);
      return after ? after(this, r) : r;
    },
  });
}

export function installLeakTracking(): void {
  if (installed) return;
  installed = true;
  wrap(
    Broker.prototype,
    'start',
    (b) => brokers.add(b),
    (b, r) =>
      (r as Promise<string>).catch((e: unknown) => {
        brokers.delete(b); // never bound (or already stopped): nothing to leak
        throw e;
      }),
  );
  wrap(
    Broker.prototype,
    'stop',
    () => undefined,
    (b, r) => (r as Promise<void>).finally(() => brokers.delete(b)),
  );
  for (const C of [Dealer, Router]) {
    for (const m of ['bind', 'connect']) wrap(C.prototype as Socket, m, (s) => sockets.add(s));
  }
}

/** What is still alive, one line each (empty: nothing leaked). */
export async function leaks(): Promise<string[]> {
  const out: string[] = [];
  for (const b of brokers) out.push(`broker ${b.endpoint || '(binding)'} not stopped (a daemon not stopped?)`);
  for (const s of sockets) {
    if (s.closed) sockets.delete(s);
    else out.push(`ZeroMQ ${s.constructor.name} socket not closed${s.lastEndpoint ? ` (${s.lastEndpoint})` : ''}`);
  }
  for (const name of undroppedDatabases()) out.push(`test database ${name} neither dropped nor kept`);
  // a child killed a moment ago (killAll sends SIGKILL and does not wait) is gone a moment later:
  // only one still running after that is left behind
  await waitFor(() => liveChildren().length === 0, { timeoutMs: 2_000, intervalMs: 20 }).catch(() => undefined);
  const tracked = liveChildren();
  for (const c of tracked) out.push(`child process ${c.pid} still running: ${c.spawnargs.slice(1).join(' ')}`);
  // Children spawned elsewhere (src, or a test's own spawn) show up as process handles. The
  // handle of a child that just exited is released on a later turn of the event loop: give it
  // that time before counting it.
  const others = () => process.getActiveResourcesInfo().filter((r) => r === 'ProcessWrap').length - tracked.length;
  const left = await waitFor(() => others() <= 0, { timeoutMs: 2_000, intervalMs: 20, what: 'child process handles released' }).then(
    () => 0,
    () => others(),
  );
  if (left > 0) out.push(`${left} other child process(es) still running`);
  return out;
}

/** Closes and kills whatever `leaks()` reported, so one leaking file does not hang the run. */
export async function releaseLeaks(): Promise<void> {
  for (const s of sockets) if (!s.closed) s.close();
  sockets.clear();
  await Promise.all([...brokers].map((b) => b.stop().catch(() => undefined)));
  brokers.clear();
  killAll();
}
