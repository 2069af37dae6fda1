/**
 * The console's two static files, kept in this module (no disk read at run time, nothing fetched
 * from anywhere else): its style sheet and its one small script, which does only what a page
 * cannot do without one: ask before a destructive action, take a sign-in code from the link's
 * fragment (never sent to the server in a URL), and show a live turn as it streams.
 */

export const CONSOLE_CSS = `
:root { --fg: #1d2430; --muted: #5b6576; --line: #d9dee7; --bg: #f6f7f9; --accent: #2456c7; --bad: #b3261e; --ok: #1b7a3a; --warn: #9a6700; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg); }
header { display: flex; align-items: center; gap: 1.5rem; padding: .6rem 1.2rem; background: #fff; border-bottom: 1px solid var(--line); }
header .brand { font-weight: 700; }
header nav a { margin-right: 1rem; color: var(--muted); text-decoration: none; }
header nav a.here { color: var(--fg); font-weight: 600; border-bottom: 2px solid var(--accent); }
header .who { margin-left: auto; color: var(--muted); display: flex; gap: .6rem; align-items: center; }
main { padding: 1rem 1.2rem 3rem; max-width: 1280px; }
h1 { font-size: 1.3rem; margin: .2rem 0 1rem; }
h2 { font-size: 1.05rem; margin: 1.4rem 0 .5rem; }
table { border-collapse: collapse; width: 100%; background: #fff; border: 1px solid var(--line); }
th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-weight: 600; color: var(--muted); background: #fafbfc; }
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; }
pre { background: #fff; border: 1px solid var(--line); padding: .5rem; overflow: auto; max-height: 24rem; white-space: pre-wrap; word-break: break-word; margin: 0; }
form.inline { display: inline; }
form.filters, form.panel { display: flex; flex-wrap: wrap; gap: .5rem; align-items: end; background: #fff; border: 1px solid var(--line); padding: .6rem; margin-bottom: .8rem; }
form.panel { flex-direction: column; align-items: stretch; }
label { display: flex; flex-direction: column; gap: .15rem; color: var(--muted); font-size: 12px; }
input, select, textarea, button { font: inherit; padding: .3rem .45rem; border: 1px solid var(--line); border-radius: 4px; background: #fff; color: var(--fg); }
textarea { min-height: 4rem; font-family: ui-monospace, monospace; }
button { cursor: pointer; background: var(--accent); color: #fff; border-color: var(--accent); }
button.danger { background: var(--bad); border-color: var(--bad); }
button.quiet { background: #fff; color: var(--fg); border-color: var(--line); }
.state { display: inline-block; padding: 0 .45rem; border-radius: 9px; font-size: 12px; border: 1px solid var(--line); }
.state-running { color: var(--accent); border-color: var(--accent); }
.state-blocked, .state-dead_lettered, .state-dead, .state-failed { color: var(--bad); border-color: var(--bad); }
.state-idle, .state-ready, .state-succeeded, .state-delivered { color: var(--ok); border-color: var(--ok); }
.state-stale, .state-pending, .state-cancelled, .state-gone { color: var(--warn); border-color: var(--warn); }
.notice { background: #eaf2ff; border: 1px solid #b9cff7; padding: .5rem .7rem; margin-bottom: .8rem; }
.error { background: #fdecea; border: 1px solid #f3b8b3; padding: .5rem .7rem; margin-bottom: .8rem; }
.muted { color: var(--muted); }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(280px, 1fr)); gap: .8rem; }
.card { background: #fff; border: 1px solid var(--line); padding: .6rem .8rem; }
.card .big { font-size: 1.6rem; font-weight: 600; }
.card svg { width: 100%; height: 60px; display: block; }
.pager { margin: .6rem 0; display: flex; gap: 1rem; }
.live { border: 1px solid var(--accent); background: #fff; padding: .5rem; margin-bottom: .8rem; }
.live pre { border: 0; padding: 0; min-height: 1.5rem; }
.msg-user td:first-child { color: var(--accent); }
.actions { display: flex; flex-wrap: wrap; gap: .8rem; }
.actions form.panel { flex: 1 1 260px; }
`;

export const CONSOLE_JS = `'use strict';
// Asks before a destructive action: a form with data-confirm is sent only once confirmed.
document.addEventListener('submit', (ev) => {
  const form = ev.target;
  const question = form instanceof HTMLFormElement ? form.dataset.confirm : undefined;
  if (question && !window.confirm(question)) ev.preventDefault();
});

// The sign-in link carries its one-time code in the fragment (#code=...), which no server log sees.
const signIn = document.getElementById('sign-in-code');
if (signIn && location.hash.startsWith('#code=')) {
  const code = decodeURIComponent(location.hash.slice('#code='.length));
  history.replaceState(null, '', location.pathname);
  signIn.querySelector('input[name=code]').value = code;
  signIn.submit();
}

// The live turn of an actor page, from the same stream as GET /v1/actors/.../stream.
const live = document.getElementById('live');
if (live && live.dataset.stream) {
  const text = document.getElementById('live-text');
  const state = document.getElementById('live-state');
  const say = (s) => { state.textContent = s; live.dataset.state = s; };
  const source = new EventSource(live.dataset.stream);
  source.addEventListener('open', () => { if (!live.dataset.state || live.dataset.state === 'connecting') say('waiting for a turn'); });
  const on = (type, handle) => source.addEventListener(type, (ev) => {
    if (typeof ev.data !== 'string') return;
    try { handle(JSON.parse(ev.data)); } catch (e) { say('could not show an event: ' + e.message); }
  });
  on('turn_started', (d) => { text.textContent = ''; say('turn running (event ' + d.event_id + ', attempt ' + d.attempt + ')'); });
  on('chunk', (d) => {
    const v = d.data;
    text.textContent += v && typeof v === 'object' && typeof v.delta === 'string' ? v.delta : JSON.stringify(v);
  });
  on('reset', () => { text.textContent = ''; say('retrying'); });
  on('turn_committed', (d) => say('turn committed (event ' + d.event_id + '): reload for the transcript'));
  on('turn_failed', (d) => say('turn ' + (d.reason || 'failed') + ' (event ' + d.event_id + ')'));
  on('error', (d) => say('stream ended: ' + (d && d.code ? d.code : 'error')));
  source.addEventListener('error', () => { if (source.readyState === EventSource.CONNECTING) say('reconnecting'); });
}
`;

/** The tab's icon (a browser asks for one; without it every page logs a 404). */
export const CONSOLE_ICON = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" fill="#2456c7"/><path d="M4 11V5h3a2 2 0 0 1 0 4H4m4 0 3 2" stroke="#fff" stroke-width="1.6" fill="none"/></svg>`;
