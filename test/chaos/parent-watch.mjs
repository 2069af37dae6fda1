// Preloaded (`node --import`) into every process the chaos harness spawns: if the harness dies
// without cleaning up (SIGKILL, a test runner killing its fork), its children must not run on
// against a database that is about to be dropped. Polls the parent pid; when this process is
// re-parented, it kills itself. Test-only; the runtime never loads this.
const parent = process.ppid;
const timer = setInterval(() => {
  if (process.ppid !== parent) process.kill(process.pid, 'SIGKILL');
}, 1000);
timer.unref();
