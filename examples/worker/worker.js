// @ts-check
/**
 * A worker: a process that runs the turns a daemon hands it. It uses only corral's public exports
 * (`corral/worker`).
 *
 *   CORRAL_WORKER_KEY_FILE  its key file, from `npx corral keys add-worker <id> --out <file>`
 *   CORRAL_ENDPOINT         the daemon's endpoint (default tcp://127.0.0.1:5555)
 *
 *   node worker.js
 */
import { createWorker } from 'corral/worker';

const keyFile = process.env.CORRAL_WORKER_KEY_FILE;
if (!keyFile) throw new Error('set CORRAL_WORKER_KEY_FILE to a key file from `corral keys add-worker`');

const worker = createWorker({
  keyFile,
  endpoint: process.env.CORRAL_ENDPOINT ?? 'tcp://127.0.0.1:5555',
  capacity: 8,
  handler: async (ctx) => {
    const data = ctx.event.data;
    const said =
      data !== null && typeof data === 'object' && !Array.isArray(data) && typeof data.text === 'string' ? data.text : JSON.stringify(data);
    return { messages: [{ role: 'assistant', content: { text: `example worker: ${said}` } }] };
  },
});

// Rejects when the daemon refuses the key (unknown, revoked, another worker's id).
await worker.start();
console.log(JSON.stringify({ worker: worker.workerId, started: true }));

for (const signal of /** @type {const} */ (['SIGINT', 'SIGTERM'])) {
  process.once(signal, () => void worker.stop({ graceMs: 5_000 }));
}
