// The chat page of corral's HTTP API (docs/http.md): send a message to an actor, watch its reply
// stream in, read the committed transcript. Plain modern JavaScript, no framework, no build.
//
// - The token is typed by the user and kept in sessionStorage (this tab only, gone with it); it
//   never goes in a URL. `fetch` sends it as `Authorization: Bearer`. `EventSource` cannot send
//   a header, so the page first trades the token for the API's HttpOnly session cookie
//   (`POST /v1/session`), which the API takes on GET routes only: sends always carry the header.
// - Every text shown is set with `textContent`: nothing the API returns is parsed as HTML.
// - The server's Content-Security-Policy lets this script talk to its own origin only.
// - Served by an application's backend (backend.js, next to this file), the page has a
//   `<meta name="corral-token-route" content="/token">`: it asks the user's name (in a real
//   application the backend knows its signed-in user), and that route for a token for the user's
//   one conversation (`POST {"user": …}` → `{ token, actor, expiresAt }`) instead of asking for a
//   token. It keeps it as a typed one (sessionStorage), and gets a new one before `expiresAt`
//   (timed by the server's clock, its `Date` header), or when the API answers 401 (revoked,
//   expired while the tab slept). The backend passes `/v1` through to the API: same origin.

const TOKEN_KEY = 'corral.chat.token';
/** With a token route: the user the tab's token is for, its actor, and when (this clock, ms) to get the next token. */
const USER_KEY = 'corral.chat.user';
const ACTOR_KEY = 'corral.chat.actor';
const RENEW_KEY = 'corral.chat.renewAt';
/** Where a backend mints this page's token, a path of this origin (null: the user types one). */
const TOKEN_ROUTE = ((route) => (route && /^\/(?!\/)/.test(route) ? route : null))(
  document.querySelector('meta[name="corral-token-route"]')?.getAttribute('content'),
);
const ACTOR_PART = /^[A-Za-z0-9._:@-]{1,128}$/;
/** A user name, as backend.js takes it (it checks again: its word is the one that counts). */
const USER_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$/;
/** A token is renewed this long before it expires (a fifth of its life when shorter), and failed renewals retried this often. */
const RENEW_MARGIN_MS = 60_000;
const RENEW_RETRY_MS = 10_000;
/** The longest a timer waits (setTimeout fires at once past it). */
const MAX_TIMER_MS = 2 ** 31 - 1;
/** A stream refused twice within this long is not opened again by itself (a loop, else). */
const REFUSALS_APART_MS = 10_000;

const $ = (id) => document.getElementById(id);
const ui = {
  session: $('session'),
  user: $('user'),
  actor: $('actor'),
  token: $('token'),
  connect: $('connect'),
  disconnect: $('disconnect'),
  status: $('status'),
  transcript: $('transcript'),
  notices: $('notices'),
  composer: $('composer'),
  message: $('message'),
  send: $('send'),
};

const state = {
  /** @type {{ agent: string, session: string, text: string } | null} */
  actor: null,
  /** @type {EventSource | null} */
  source: null,
  /** Reply bubbles of live turns, by event id. */
  live: new Map(),
  /** User messages sent and not yet in the transcript: event id → { text, state }. */
  pending: new Map(),
  /** The events each live turn answers (more than one under the input policy coalesce), by its event id. */
  turnEvents: new Map(),
  /** Event ids whose turn is known committed (a late send answer adds no bubble for them). */
  committed: new Set(),
  /** The last send that failed, so that sending it again reuses its idempotency key. */
  lastTry: null,
  lastRefusal: 0,
  /** With a token route: the timer that gets the next token. */
  renewTimer: 0,
};

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// ---- small helpers ----------------------------------------------------------------------

function randomHex(bytes) {
  // crypto.getRandomValues works on plain http too (crypto.randomUUID needs a secure context)
  return Array.from(crypto.getRandomValues(new Uint8Array(bytes)), (b) => b.toString(16).padStart(2, '0')).join('');
}

function parseActor(text) {
  const parts = String(text).trim().split('/');
  if (parts.length !== 2 || !parts.every((p) => ACTOR_PART.test(p))) return null;
  return { agent: parts[0], session: parts[1], text: `${parts[0]}/${parts[1]}` };
}

const actorPath = (actor, tail) => `/v1/actors/${encodeURIComponent(actor.agent)}/${encodeURIComponent(actor.session)}/${tail}`;
const storedToken = () => sessionStorage.getItem(TOKEN_KEY);

/** `fetch` on the API with the token; a failure is an ApiError with the API's code and message. */
async function api(path, init = {}) {
  const headers = new Headers(init.headers);
  const token = storedToken();
  if (token) headers.set('authorization', `Bearer ${token}`);
  const res = await fetch(path, { ...init, headers, cache: 'no-store', credentials: 'same-origin', redirect: 'error' });
  if (!res.ok) {
    const body = await res.json().catch(() => null);
    throw new ApiError(res.status, body?.error?.code ?? 'http_error', body?.error?.message ?? `HTTP ${res.status}`);
  }
  return res;
}

function setStatus(text) {
  ui.status.textContent = text;
}

/** A visible notice (announced by screen readers), with a button to dismiss it. */
function notice(text, kind = 'error') {
  const li = document.createElement('li');
  li.className = `notice notice-${kind}`;
  const p = document.createElement('span');
  p.textContent = text;
  const close = document.createElement('button');
  close.type = 'button';
  close.textContent = 'Dismiss';
  close.setAttribute('aria-label', `Dismiss: ${text}`);
  close.addEventListener('click', () => li.remove());
  li.append(p, close);
  ui.notices.append(li);
  while (ui.notices.children.length > 5) ui.notices.firstElementChild.remove();
}

function describe(e) {
  if (!(e instanceof ApiError)) return 'the server cannot be reached';
  if (e.status === 401) return `${e.message}: sign in again`;
  return `${e.code}: ${e.message}`;
}

// ---- the conversation ---------------------------------------------------------------------

/** What a message shows: its `text`, else its content as JSON. */
function textOf(content) {
  if (content !== null && typeof content === 'object' && typeof content.text === 'string') return content.text;
  return JSON.stringify(content);
}

function bubble(role, text, bubbleState) {
  const li = document.createElement('li');
  li.className = `msg msg-${role === 'user' ? 'user' : 'assistant'}`;
  li.dataset.state = bubbleState;
  const who = document.createElement('span');
  who.className = 'who';
  who.textContent = role === 'user' ? 'You' : role === 'assistant' ? 'Assistant' : role;
  const body = document.createElement('p');
  body.className = 'text';
  body.textContent = text;
  li.append(who, body);
  return li;
}

const textNode = (li) => li.querySelector('.text');

function scrollDown() {
  ui.transcript.lastElementChild?.scrollIntoView({ block: 'end' });
}

/** The committed transcript, then what is not in it yet: messages sent, replies streaming. */
function renderTranscript(turns) {
  const committed = new Set();
  const items = [];
  for (const turn of turns) {
    committed.add(turn.event_id);
    state.committed.add(turn.event_id);
    for (const m of turn.messages) {
      const li = bubble(m.role, textOf(m.content), 'committed');
      if (turn.status !== 'succeeded') li.dataset.turn = turn.status;
      items.push(li);
    }
  }
  for (const id of [...state.pending.keys()]) if (committed.has(id)) state.pending.delete(id);
  for (const p of state.pending.values()) items.push(bubble('user', p.text, p.state));
  for (const [id, li] of state.live) {
    if (committed.has(id)) state.live.delete(id);
    else items.push(li);
  }
  ui.transcript.replaceChildren(...items);
  scrollDown();
}

async function loadTranscript() {
  const actor = state.actor;
  const res = await api(actorPath(actor, 'transcript'));
  const body = await res.json();
  if (state.actor === actor) renderTranscript(body.turns);
}

// ---- the live stream ----------------------------------------------------------------------

function replyBubble(eventId) {
  let li = state.live.get(eventId);
  if (!li) {
    li = bubble('assistant', '', 'streaming');
    li.dataset.eventId = eventId;
    li.setAttribute('aria-busy', 'true');
    state.live.set(eventId, li);
    ui.transcript.append(li);
  }
  return li;
}

/** The reply bubble of `eventId`, streaming (again, after a failed attempt) and empty. */
function freshReply(eventId) {
  const li = replyBubble(eventId);
  li.dataset.state = 'streaming';
  li.setAttribute('aria-busy', 'true');
  textNode(li).textContent = '';
  return li;
}

const handlers = {
  turn_started(data) {
    for (const e of data.events) {
      // a message another tab or client sent shows as well
      if (!state.pending.has(e.id)) {
        state.pending.set(e.id, { text: textOf(e.data), state: 'pending' });
        ui.transcript.append(bubble('user', textOf(e.data), 'pending'));
      }
    }
    state.turnEvents.set(
      data.event_id,
      data.events.map((e) => e.id),
    );
    freshReply(data.event_id);
    scrollDown();
  },
  chunk(data) {
    const delta = data.data?.delta;
    if (typeof delta !== 'string') return;
    textNode(replyBubble(data.event_id)).textContent += delta;
    scrollDown();
  },
  reset(data) {
    // the attempt that streamed it failed: its retry starts over
    freshReply(data.event_id);
  },
  turn_committed(data) {
    const li = replyBubble(data.event_id);
    const replies = data.messages.filter((m) => m.role !== 'user');
    li.replaceWith(...replies.map((m) => bubble(m.role, textOf(m.content), 'committed')));
    state.live.delete(data.event_id);
    // its user messages are in the transcript now, each one it answered
    for (const id of state.turnEvents.get(data.event_id) ?? [data.event_id]) {
      state.pending.delete(id);
      state.committed.add(id);
    }
    state.turnEvents.delete(data.event_id);
    loadTranscript().catch((e) => notice(`The transcript could not be read: ${describe(e)}`));
  },
  turn_failed(data) {
    const li = replyBubble(data.event_id);
    li.dataset.state = 'failed';
    li.removeAttribute('aria-busy');
    const why = {
      failed: 'the turn failed; it will be tried again',
      dead_lettered: 'the turn failed for good (dead-lettered)',
      cancelled: 'the turn was cancelled',
      interrupted: 'the turn was interrupted: the next turn answers its messages',
    };
    notice(`Reply: ${why[data.reason] ?? data.reason}.`);
    if (data.reason === 'failed') return;
    state.live.delete(data.event_id);
    if (data.reason === 'dead_lettered') {
      // no turn will commit these: keep them in sight, marked
      for (const id of state.turnEvents.get(data.event_id) ?? [data.event_id]) {
        const p = state.pending.get(id);
        if (p) p.state = 'failed';
      }
    }
    state.turnEvents.delete(data.event_id);
    // what the transcript holds now (a cancelled turn's message), and those marked
    loadTranscript().catch((e) => notice(`The transcript could not be read: ${describe(e)}`));
  },
};

function openStream() {
  closeStream();
  const actor = state.actor;
  // same origin: the session cookie goes with it (EventSource sends no Authorization header)
  const source = new EventSource(actorPath(actor, 'stream'));
  state.source = source;
  for (const [type, handle] of Object.entries(handlers)) {
    source.addEventListener(type, (ev) => {
      try {
        handle(JSON.parse(ev.data));
      } catch (e) {
        notice(`A stream event could not be shown: ${e.message}`);
      }
    });
  }
  source.addEventListener('open', () => {
    setStatus(`Connected to ${actor.text}.`);
    // what committed before the stream (re)opened; a live turn is streamed from its start
    loadTranscript().catch((e) => notice(`The transcript could not be read: ${describe(e)}`));
  });
  source.addEventListener('error', (ev) => {
    if (source !== state.source) return;
    if (ev instanceof MessageEvent && ev.data) {
      // the server's own `error` event: it ends the response, and EventSource resumes after it
      const err = JSON.parse(ev.data);
      notice(`The stream ended (${err.code}: ${err.message}); resuming.`, 'warning');
      return;
    }
    if (source.readyState === EventSource.CONNECTING) {
      setStatus('Connection lost; reconnecting…');
      return;
    }
    // closed for good: refused (401 once the cookie lapsed or the token was revoked; 429; 503)
    void relogin();
  });
}

function forgetConversation() {
  state.pending.clear();
  state.turnEvents.clear();
  state.committed.clear();
}

function closeStream() {
  state.source?.close();
  state.source = null;
  // a stream opened again sends a live turn from its start: drop what the old one showed
  for (const li of state.live.values()) li.remove();
  state.live.clear();
}

/**
 * The stream was refused (401 once the cookie lapsed or the token was revoked; 429; 503): sign
 * in again, which tells a token that is no longer valid (signed out) from one that is (the
 * stream is opened again, unless it was refused moments ago too).
 */
async function relogin() {
  closeStream();
  const last = state.lastRefusal;
  state.lastRefusal = Date.now();
  try {
    await login();
  } catch (e) {
    if (e instanceof ApiError && e.status === 401 && TOKEN_ROUTE) {
      // the tab's token expired or was revoked: the backend makes a new one
      await connect(true);
    } else if (e instanceof ApiError && e.status === 401) signedOut(`The stream was refused: ${describe(e)}`);
    else {
      setStatus('Disconnected: the stream was refused.');
      notice(`The stream was refused and signing in again failed (${describe(e)}): press Connect to try again.`);
    }
    return;
  }
  if (state.lastRefusal - last < REFUSALS_APART_MS) {
    setStatus('Disconnected: the stream was refused.');
    notice('The stream was refused again (too many streams, or the server is busy): press Connect to try again.');
    return;
  }
  openStream();
}

// ---- signing in and out, sending ------------------------------------------------------------

async function login() {
  await api('/v1/session', { method: 'POST' });
}

function signedIn(on) {
  ui.token.disabled = on;
  ui.token.placeholder = on ? 'signed in' : 'crl_…';
  // with a token route, a sign-in is one user's: sign out to be another
  ui.user.disabled = on;
  ui.connect.hidden = on && TOKEN_ROUTE !== null;
  ui.disconnect.hidden = !on;
  ui.connect.textContent = on ? 'Switch actor' : 'Connect';
  ui.message.disabled = !on;
  ui.message.placeholder = on
    ? 'Write a message (Enter sends, Shift+Enter: a new line)'
    : 'Connect first, then write a message (Enter sends, Shift+Enter: a new line)';
  ui.send.disabled = !on;
}

function forgetToken() {
  clearTimeout(state.renewTimer);
  for (const key of [TOKEN_KEY, USER_KEY, ACTOR_KEY, RENEW_KEY]) sessionStorage.removeItem(key);
}

function signedOut(why) {
  closeStream();
  forgetToken();
  signedIn(false);
  setStatus('Not connected.');
  if (why) notice(why);
}

// ---- a token from the page's backend (a token route) --------------------------------------------

/** When to renew a token that lives `lifetimeMs` more: a margin before, at least a second from now. */
const renewAfter = (lifetimeMs) => Math.max(1000, lifetimeMs - Math.min(RENEW_MARGIN_MS, lifetimeMs / 5));

/**
 * A new token for `user` from the backend's token route, kept in the tab; resolves to its actor
 * (the backend's choice: the page follows it). An ApiError when the backend refused.
 */
async function tokenFromBackend(user) {
  let res;
  try {
    res = await fetch(TOKEN_ROUTE, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ user }),
      cache: 'no-store',
      credentials: 'same-origin',
      redirect: 'error',
    });
  } catch {
    throw new ApiError(0, 'unreachable', 'the backend cannot be reached');
  }
  const body = await res.json().catch(() => null);
  const actor = parseActor(typeof body?.actor === 'string' ? body.actor : '');
  if (!res.ok || typeof body?.token !== 'string' || !actor) {
    throw new ApiError(res.status, body?.error?.code ?? 'http_error', body?.error?.message ?? `HTTP ${res.status}`);
  }
  // how long it lives by the server's clock (its Date header, to the second below: one second
  // less), so that a browser clock that is off renews neither late nor in a loop
  const expires = Date.parse(body.expiresAt ?? '');
  const serverNow = Date.parse(res.headers.get('date') ?? '');
  const lifetime = Number.isFinite(serverNow) ? expires - serverNow - 1000 : expires - Date.now();
  sessionStorage.setItem(TOKEN_KEY, body.token);
  sessionStorage.setItem(USER_KEY, user);
  sessionStorage.setItem(ACTOR_KEY, actor.text);
  if (Number.isFinite(lifetime)) sessionStorage.setItem(RENEW_KEY, String(Date.now() + renewAfter(lifetime)));
  else sessionStorage.removeItem(RENEW_KEY);
  return actor;
}

/** Gets the next token when the tab's is due (RENEW_KEY), and again after each. */
function scheduleRenewal() {
  clearTimeout(state.renewTimer);
  const at = Number(sessionStorage.getItem(RENEW_KEY));
  if (!TOKEN_ROUTE || !state.actor || !at) return;
  const wait = at - Date.now();
  state.renewTimer = setTimeout(wait > MAX_TIMER_MS ? scheduleRenewal : () => void renew(), Math.min(Math.max(0, wait), MAX_TIMER_MS));
}

/** A new token before the tab's expires: the next requests send it, and the stream's cookie is its. */
async function renew() {
  const user = sessionStorage.getItem(USER_KEY);
  const actor = state.actor;
  if (!user || !actor) return;
  try {
    const given = await tokenFromBackend(user);
    if (given.text !== actor.text) {
      // the backend gives this user another conversation now: connect to that one
      await connect();
      return;
    }
    await login();
  } catch (e) {
    if (state.actor !== actor) return;
    notice(`The session could not be renewed (${describe(e)}); trying again in a few seconds.`, 'warning');
    state.renewTimer = setTimeout(() => void renew(), RENEW_RETRY_MS);
    return;
  }
  if (state.actor !== actor) return;
  // the stream runs on the old token's cookie until it expires: open it again on the new one,
  // unless a reply is streaming (then it resumes by itself, after its last event, when it ends)
  if (state.live.size === 0) openStream();
  scheduleRenewal();
}

/**
 * With a token route: signs in as the user named, with the tab's token for them (unless `fresh`)
 * or a new one; resolves to their actor, or null (said in a notice).
 */
async function signInFromBackend(fresh) {
  const user = ui.user.value.trim();
  if (!USER_NAME.test(user)) {
    notice('Your name: 1–40 of A–Z a–z 0–9 . _ -, the first a letter or a digit.');
    ui.user.focus();
    return null;
  }
  const kept =
    !fresh && storedToken() && sessionStorage.getItem(USER_KEY) === user ? parseActor(sessionStorage.getItem(ACTOR_KEY) ?? '') : null;
  for (const mint of kept ? [false, true] : [true]) {
    let actor = kept;
    if (mint) {
      setStatus('Getting a token…');
      try {
        actor = await tokenFromBackend(user);
      } catch (e) {
        setStatus('Not connected.');
        notice(`No token from the backend: ${describe(e)}`);
        return null;
      }
    }
    setStatus('Signing in…');
    try {
      await login();
      return actor;
    } catch (e) {
      // the tab's token expired or was revoked (a reload after a while): a new one
      if (e instanceof ApiError && e.status === 401 && !mint) continue;
      if (e instanceof ApiError && e.status === 401) forgetToken();
      setStatus('Not connected.');
      notice(`Could not sign in: ${describe(e)}`);
      return null;
    }
  }
  return null;
}

/** Without a token route: signs in with the token typed (or the tab's); the actor typed, or null. */
async function signInWithToken() {
  const actor = parseActor(ui.actor.value);
  if (!actor) {
    notice('The actor key must be agent/session, each 1–128 of A–Z a–z 0–9 . _ : @ -');
    ui.actor.focus();
    return null;
  }
  const typed = ui.token.value.trim();
  if (typed) sessionStorage.setItem(TOKEN_KEY, typed);
  ui.token.value = '';
  if (!storedToken()) {
    notice('Type an API token first (corral tokens create NAME --scope send --scope read).');
    ui.token.focus();
    return null;
  }
  setStatus('Signing in…');
  try {
    await login();
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) signedOut(`Could not sign in: ${describe(e)}`);
    else {
      setStatus('Not connected.');
      notice(`Could not sign in: ${describe(e)}`);
    }
    return null;
  }
  return actor;
}

/**
 * Signs in (`fresh`: with a new token from the backend, the tab's no longer valid), then opens
 * the actor's stream; whether it did.
 */
async function connect(fresh = false) {
  const actor = TOKEN_ROUTE ? await signInFromBackend(fresh) : await signInWithToken();
  if (!actor) {
    // signed in no longer: the page says so (the notice says why), and Connect tries again
    if (fresh) signedOut();
    return false;
  }
  if (actor.text !== state.actor?.text) forgetConversation();
  state.actor = actor;
  ui.actor.value = actor.text;
  history.replaceState(null, '', `?actor=${encodeURIComponent(actor.text)}`);
  signedIn(true);
  setStatus(`Connecting to ${actor.text}…`);
  ui.transcript.replaceChildren();
  openStream();
  scheduleRenewal();
  ui.message.focus();
  return true;
}

async function disconnect() {
  closeStream();
  state.actor = null;
  forgetConversation();
  ui.transcript.replaceChildren();
  await fetch('/v1/session', { method: 'DELETE', credentials: 'same-origin' }).catch(() => undefined);
  signedOut();
}

/** Sends the message written; `again`: once more after a new token (the same event: its key). */
async function send(again = false) {
  const text = ui.message.value;
  if (!text.trim() || !state.actor) return;
  // the same text sent again after a failure is the same event (Idempotency-Key)
  const key = state.lastTry?.text === text ? state.lastTry.key : randomHex(16);
  state.lastTry = { text, key };
  ui.send.disabled = true;
  try {
    const res = await api(actorPath(state.actor, 'events'), {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key },
      body: JSON.stringify({ text, stream: true }),
    });
    const { event_id: eventId } = await res.json();
    state.lastTry = null;
    ui.message.value = '';
    // its turn may have started already (the stream can be quicker than this answer)
    if (!state.pending.has(eventId) && !state.live.has(eventId) && !state.committed.has(eventId)) {
      state.pending.set(eventId, { text, state: 'pending' });
      ui.transcript.append(bubble('user', text, 'pending'));
      scrollDown();
    }
  } catch (e) {
    if (e instanceof ApiError && e.status === 401 && TOKEN_ROUTE && !again) {
      // the tab's token expired or was revoked: a new one, and the same message again (the same
      // Idempotency-Key: one event however often it is tried)
      if (await connect(true)) await send(true);
      return;
    }
    notice(`Not sent: ${describe(e)}`);
    if (e instanceof ApiError && e.status === 401) signedOut();
  } finally {
    ui.send.disabled = ui.message.disabled;
    ui.message.focus();
  }
}

// ---- wiring -------------------------------------------------------------------------------

ui.session.addEventListener('submit', (ev) => {
  ev.preventDefault();
  void connect();
});
ui.disconnect.addEventListener('click', () => void disconnect());
ui.composer.addEventListener('submit', (ev) => {
  ev.preventDefault();
  void send();
});
ui.message.addEventListener('keydown', (ev) => {
  if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) {
    ev.preventDefault();
    ui.composer.requestSubmit();
  }
});

const given = parseActor(new URLSearchParams(location.search).get('actor') ?? '');
ui.actor.value = given?.text ?? `chat/${randomHex(6)}`;
if (TOKEN_ROUTE) {
  // the backend gives the token and chooses the actor: a field for the user's name, none for those
  ui.user.closest('.field').hidden = false;
  ui.actor.closest('.field').hidden = true;
  ui.token.closest('.field').hidden = true;
  ui.actor.required = false;
  ui.user.required = true;
  ui.user.value = sessionStorage.getItem(USER_KEY) ?? (given && USER_NAME.test(given.session) ? given.session : '');
  // a tab that slept past its renewal renews as it shows again
  document.addEventListener('visibilitychange', () => {
    if (document.visibilityState === 'visible') scheduleRenewal();
  });
  if (storedToken() && sessionStorage.getItem(USER_KEY)) void connect();
  else ui.user.focus();
} else if (storedToken()) void connect();
else ui.token.focus();
