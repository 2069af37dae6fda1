"""One turn running inside a worker: the handler's :class:`TurnContext`, steering, cancellation,
periodic progress, streaming within the daemon's budgets, and exactly one final message.

Invariants:
1. The final message (``turn_result`` / ``turn_error``) carries the CURRENT ``turn_ref``: the one
   from the latest ``turn_steer`` (an older one is rejected ``stale_revision``).
2. A turn the daemon wrote off (``turn_cancel``, a terminal ``turn_rejected``) sends nothing more.
   Its handler gets an :class:`asyncio.CancelledError`.
3. At most one final message per turn; progress stops before it is sent.
4. The turn leaves the worker's in-flight set only once its handler has stopped, and before its
   final message is queued.
5. ``ctx.stream`` sends chunks in ``seq`` order; once a chunk would pass the attempt's stream
   budget (``stream_turn_bytes``) or the daemon said ``turn_stream_closed``, it sends nothing
   more for the turn and returns False (logged once).
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Optional, Protocol, Sequence, TypedDict

from ._json import JsonObject, JsonValue, encode, is_int, is_json, unstorable_reason
from .errors import RpcError, TurnError
from .log import FieldsAdapter
from .protocol import (
    ACTOR_KEY_RE,
    DELIVER_KEY_RE,
    MAX_CHUNK_SEQ,
    MAX_DELIVERIES,
    MAX_EMIT_DELAY_MS,
    MAX_EMITS,
    MAX_ERROR_MESSAGE,
    MAX_NOTE,
    MAX_RESULT_MESSAGES,
    PROTOCOL_VERSION,
    SINK_NAME_RE,
    Conversation,
    ConversationMessage,
    ProtocolViolation,
    TraceCarrier,
    TurnEvent,
    TurnRef,
    TurnStart,
    parse_conversation_messages,
)


class ResultMessage(TypedDict):
    role: str
    content: JsonValue


class _EmitBase(TypedDict):
    actor: str
    data: JsonValue


class Emit(_EmitBase, total=False):
    """An event enqueued exactly once with the commit (docs/protocol.md section 16)."""

    delay_ms: int


class _DeliverBase(TypedDict):
    sink: str
    body: JsonValue


class Deliver(_DeliverBase, total=False):
    """A message POSTed to a sink once the turn commits (docs/protocol.md section 17)."""

    key: str


class _OutcomeBase(TypedDict):
    messages: Sequence[Mapping[str, Any]]


class TurnOutcome(_OutcomeBase, total=False):
    """What a handler returns (any mapping of this shape will do)."""

    output: JsonValue
    emit: Sequence[Mapping[str, Any]]
    deliver: Sequence[Mapping[str, Any]]


class HistoryPage(TypedDict):
    """One page of ``history.read`` (docs/protocol.md section 15), oldest message first."""

    conversation_id: str
    messages: list[ConversationMessage]
    has_more: bool
    total: int


Handler = Callable[["TurnContext"], Awaitable[Mapping[str, Any]]]
"""An async function from a :class:`TurnContext` to a :class:`TurnOutcome`-shaped mapping."""


class TurnHost(Protocol):
    """What a turn needs from its worker (the narrow interface; the worker implements it)."""

    @property
    def handler(self) -> Handler:
        ...

    @property
    def max_message_bytes(self) -> int:
        ...

    def progress_interval_s(self) -> float:
        ...

    def stream_chunk_bytes(self) -> int:
        ...

    def stream_turn_bytes(self) -> Optional[int]:
        ...

    def send(self, frame: bytes, kind: str) -> None:
        ...

    def send_final(self, delivery_id: str, frame: bytes) -> None:
        ...

    def call_rpc(self, ref: TurnRef, method: str, params: JsonValue) -> Awaitable[JsonValue]:
        ...

    def finished(self, turn: "RunningTurn") -> None:
        ...


class CancelSignal:
    """Set when the daemon writes the turn off (``turn_cancel``, a terminal ``turn_rejected``)
    or the worker stops; the handler also gets an :class:`asyncio.CancelledError` then."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.reason: Optional[str] = None

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> str:
        """Wait until the turn is cancelled; returns the reason."""
        await self._event.wait()
        return self.reason or ""

    def _set(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()


class SteerInbox:
    """Steering input for the running turn, in arrival order (docs/protocol.md section 9).

    ``async for data in ctx.steer`` yields each input (steers that came before the loop started
    are kept for it) and ends when the turn ends; ``ctx.steer.drain()`` takes whatever has come
    without waiting. The turn's ``turn_ref`` is already the steered one when an input is seen."""

    def __init__(self) -> None:
        self._items: list[JsonValue] = []
        self._wake = asyncio.Event()
        self._closed = False

    def __aiter__(self) -> AsyncIterator[JsonValue]:
        return self

    async def __anext__(self) -> JsonValue:
        while not self._items:
            if self._closed:
                raise StopAsyncIteration
            self._wake.clear()
            await self._wake.wait()
        return self._items.pop(0)

    def drain(self) -> list[JsonValue]:
        """Every input received and not yet taken, oldest first; empty when none."""
        out, self._items = self._items, []
        return out

    def _put(self, data: JsonValue) -> None:
        self._items.append(data)
        self._wake.set()

    def _close(self) -> None:
        self._closed = True
        self._wake.set()


class TurnContext:
    """What a handler sees for one turn."""

    def __init__(self, turn: "RunningTurn") -> None:
        self._turn = turn
        start = turn.start
        self.event: TurnEvent = start.event
        """The event this turn answers (``events[0]``)."""
        self.events: tuple[TurnEvent, ...] = start.events
        """Every event the turn answers, in enqueue order: more than one under input policy coalesce."""
        self.attempt: int = start.attempt
        self.lease_expires_at: str = start.lease_expires_at
        self.context: Optional[Conversation] = start.context
        self.trace: Optional[TraceCarrier] = start.trace
        """The W3C trace context the turn continues (the sender's span), or None."""
        self.signal: CancelSignal = turn.signal
        self.steer: SteerInbox = turn.inbox
        self.logger: FieldsAdapter = turn.log

    @property
    def turn_ref(self) -> TurnRef:
        """The current fence; replaced by every steer."""
        return self._turn.ref

    @property
    def actor(self) -> str:
        """``agent_uid/session_id``."""
        ref = self._turn.ref
        return f"{ref['agent_uid']}/{ref['session_id']}"

    @property
    def history(self) -> tuple[ConversationMessage, ...]:
        """The conversation's latest committed messages sent with ``turn_start`` (oldest first;
        empty when the daemon sends none). Page further back with :meth:`read_history`."""
        return self.context.messages if self.context else ()

    @property
    def cancelled(self) -> bool:
        return self.signal.cancelled

    def stream(self, data: JsonValue) -> bool:
        """Stream ``data`` (any JSON value, e.g. ``{"delta": "Hel"}``) to whoever watches the actor.
        True when sent; False when the turn is over, the chunk is larger than the daemon relays
        (``stream_chunk_bytes``) or not JSON, or the turn's stream budget is spent."""
        return self._turn.send_chunk(data)

    def progress(self, note: Optional[str] = None) -> None:
        """Send a ``turn_progress`` now (extends the lease); the SDK also sends one periodically."""
        self._turn.send_progress(note)

    async def rpc(self, method: str, params: JsonValue = None) -> JsonValue:
        """A worker RPC fenced by this turn's current ``turn_ref``; raises :class:`RpcError`."""
        if not is_json(params):
            raise RpcError("rpc params must be a JSON value", code="invalid_params")
        return await self._turn.host.call_rpc(self._turn.ref, method, params)

    async def read_history(
        self, before_seq: Optional[int] = None, limit: Optional[int] = None, max_bytes: Optional[int] = None
    ) -> HistoryPage:
        """One page of ``history.read``: messages with ``seq < before_seq`` (the newest without it),
        oldest first; ``has_more`` says older ones exist (ask again with ``messages[0]["seq"]``)."""
        params: JsonObject = {}
        if before_seq is not None:
            params["before_seq"] = before_seq
        if limit is not None:
            params["limit"] = limit
        if max_bytes is not None:
            params["max_bytes"] = max_bytes
        return _history_page(await self.rpc("history.read", params))

    async def all_history(self, page_size: int = 200) -> list[ConversationMessage]:
        """Every committed message of the conversation, oldest first, paging with ``history.read``."""
        pages: list[list[ConversationMessage]] = []
        before: Optional[int] = None
        while True:
            page = await self.read_history(before_seq=before, limit=page_size)
            pages.append(page["messages"])
            if not page["has_more"] or not page["messages"]:
                break
            before = page["messages"][0]["seq"]
        return [m for p in reversed(pages) for m in p]

    async def actor_status(self) -> JsonObject:
        """``actor.status``: the actor's state (docs/protocol.md section 15)."""
        result = await self.rpc("actor.status")
        if not isinstance(result, dict):
            raise RpcError("actor.status answered something that is not an object", code="invalid_response")
        return result

    def emit(self, actor: str, data: JsonValue, *, delay_ms: Optional[int] = None) -> None:
        """Enqueue an event for ``actor`` (``agent/session``) exactly once with this turn's commit,
        ``delay_ms`` after it. Raises ``ValueError`` for what the daemon would refuse."""
        entry: JsonObject = {"actor": actor, "data": data}
        if delay_ms is not None:
            entry["delay_ms"] = delay_ms
        problem = _emit_problem(entry, len(self._turn.emits))
        if problem:
            raise ValueError(f"ctx.emit: {problem}")
        self._turn.emits.append(entry)

    def deliver(self, sink: str, body: JsonValue, *, key: Optional[str] = None) -> None:
        """POST ``body`` to the sink named ``sink`` once this turn commits (the outbox), with
        ``key`` (unique per actor and sink) ending its ``webhook-id`` (``<agent_uid>/<session_id>/<key>``) when
        given. Raises ``ValueError`` for what the daemon would refuse."""
        entry: JsonObject = {"sink": sink, "body": body}
        if key is not None:
            entry["key"] = key
        problem = _deliver_problem(entry, self._turn.delivers)
        if problem:
            raise ValueError(f"ctx.deliver: {problem}")
        self._turn.delivers.append(entry)


def _history_page(result: JsonValue) -> HistoryPage:
    try:
        if not isinstance(result, dict):
            raise ProtocolViolation("not an object")
        cid, has_more, total = result.get("conversation_id"), result.get("has_more"), result.get("total")
        if not isinstance(cid, str) or not isinstance(has_more, bool) or not is_int(total, 0):
            raise ProtocolViolation("conversation_id, has_more or total missing or of the wrong type")
        messages = list(parse_conversation_messages(result.get("messages"), "messages"))
    except ProtocolViolation as e:
        raise RpcError(f"history.read answered a page of the wrong shape: {e}", code="invalid_response") from None
    assert isinstance(total, (int, float))
    return {"conversation_id": cid, "messages": messages, "has_more": has_more, "total": int(total)}


def _emit_problem(e: object, index: int) -> Optional[str]:
    if index >= MAX_EMITS:
        return f"more than {MAX_EMITS} emit entries"
    if not isinstance(e, Mapping):
        return f"emit[{index}] is not an object"
    actor = e.get("actor")
    if not isinstance(actor, str) or not ACTOR_KEY_RE.fullmatch(actor):
        return f"emit[{index}].actor is not an actor key agent_uid/session_id"
    if "data" not in e:
        return f"emit[{index}] has no data"
    if "delay_ms" in e and not is_int(e["delay_ms"], 0, MAX_EMIT_DELAY_MS):
        return f"emit[{index}].delay_ms is not an integer in 0..{MAX_EMIT_DELAY_MS}"
    return unstorable_reason(e["data"], f"emit[{index}].data")


def _deliver_problem(d: object, before: Sequence[Mapping[str, Any]]) -> Optional[str]:
    index = len(before)
    if index >= MAX_DELIVERIES:
        return f"more than {MAX_DELIVERIES} deliver entries"
    if not isinstance(d, Mapping):
        return f"deliver[{index}] is not an object"
    sink = d.get("sink")
    if not isinstance(sink, str) or not SINK_NAME_RE.fullmatch(sink):
        return f"deliver[{index}].sink is not a sink name (1..64 of [A-Za-z0-9._-])"
    if "body" not in d:
        return f"deliver[{index}] has no body"
    if "key" in d:
        key = d["key"]
        if not isinstance(key, str) or not DELIVER_KEY_RE.fullmatch(key):
            return f"deliver[{index}].key is not 1..256 printable ASCII characters without space"
        if any(o.get("sink") == sink and o.get("key") == key for o in before):
            return f"deliver[{index}].key {key!r} is given twice for sink {sink}"
    return unstorable_reason(d["body"], f"deliver[{index}].body")


class _Refused(Exception):
    """An outcome the SDK answers with a turn_error instead of a turn_result."""

    def __init__(self, code: str, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.code, self.message, self.retryable = code, message, retryable


class RunningTurn:
    """One turn: owns its handler task, its progress loop, its stream counters and its ref."""

    def __init__(self, start: TurnStart, host: TurnHost, log: FieldsAdapter) -> None:
        self.start = start
        self.host = host
        self.ref: TurnRef = start.turn_ref
        self.delivery_id: str = start.turn_ref["delivery_id"]
        self.log = log.child(
            delivery_id=self.delivery_id,
            event_id=start.turn_ref["event_id"],
            epoch=start.turn_ref["actor_epoch"],
            attempt=start.attempt,
        )
        self.signal = CancelSignal()
        self.inbox = SteerInbox()
        self.emits: list[JsonObject] = []
        self.delivers: list[JsonObject] = []
        self.settled = False
        self.silenced = False
        self.stopping = False
        self.seq = 0
        self.stream_bytes = 0
        self.stream_closed: Optional[str] = None
        self._started = False
        self._progress: Optional[asyncio.TimerHandle] = None
        # one task per turn, running the handler itself: a cancel cancels it (invariant 2)
        self.done: asyncio.Task[None] = asyncio.get_running_loop().create_task(
            self._run(), name=f"corral-turn-{self.delivery_id}"
        )

    # ---- from the daemon ------------------------------------------------------------------

    def steer(self, ref: TurnRef, data: JsonValue) -> None:
        """Adopt the steered ref (invariant 1), acknowledge it, hand the input to the handler."""
        if self.settled:
            return
        self.ref = ref
        self.log.debug("turn steered", extra={"revision": ref["revision"]})
        self.send_progress("steered")
        self.inbox._put(data)

    def cancel(self, reason: str) -> None:
        """The daemon wrote the turn off: abort the handler, stay silent (invariant 2)."""
        if self.settled or self.silenced:
            return
        self.silenced = True
        self.log.info("turn cancelled", extra={"reason": reason})
        self.signal._set(reason)
        if self._started:  # not yet started: _run sees `silenced` and never calls the handler
            self.done.cancel(f"turn cancelled: {reason}")

    def abort_for_stop(self) -> None:
        """The worker is stopping: abort; reported ``worker_stopping`` (a hand-back)."""
        if self.settled:
            return
        self.stopping = True
        self.signal._set("worker_stopping")
        if self._started:
            self.done.cancel("worker stopping")

    def stream_closed_by_daemon(self, reason: str, limit_bytes: Optional[int]) -> None:
        self._close_stream(f"the daemon closed the stream ({reason}, limit {limit_bytes} bytes)")

    # ---- the handler's side -----------------------------------------------------------------

    def send_progress(self, note: Optional[str] = None) -> None:
        if self.settled or self.silenced:
            return
        msg: JsonObject = {"v": PROTOCOL_VERSION, "type": "turn_progress", "turn_ref": self.ref}  # type: ignore[dict-item]
        if note is not None:
            msg["note"] = str(note)[:MAX_NOTE]
        self.host.send(encode(msg), "turn_progress")

    def send_chunk(self, data: JsonValue) -> bool:
        if self.settled or self.silenced or self.stream_closed is not None:
            return False
        problem = unstorable_reason(data, "data")
        if problem:
            self.log.warning("stream chunk is not storable JSON; not sent", extra={"why": problem})
            return False
        msg = {"v": PROTOCOL_VERSION, "type": "turn_chunk", "turn_ref": self.ref, "seq": self.seq + 1, "data": data}
        try:
            frame = encode(msg)
        except (TypeError, ValueError) as e:
            self.log.warning("stream chunk is not JSON; not sent", extra={"why": str(e)})
            return False
        limit = self.host.stream_chunk_bytes()
        if len(frame) > limit:
            self.log.warning("stream chunk too large; not sent", extra={"bytes": len(frame), "limit": limit})
            return False
        budget = self.host.stream_turn_bytes()
        if budget is not None and self.stream_bytes + len(frame) > budget:
            self._close_stream(f"the stream budget of {budget} bytes per attempt is spent ({self.stream_bytes} sent)")
            return False
        if self.seq >= MAX_CHUNK_SEQ:
            self._close_stream(f"{MAX_CHUNK_SEQ} chunks sent")
            return False
        self.seq += 1
        self.stream_bytes += len(frame)
        self.host.send(frame, "turn_chunk")
        return True

    def _close_stream(self, why: str) -> None:
        if self.stream_closed is not None:
            return
        self.stream_closed = why
        self.log.warning(f"stream budget spent: ctx.stream sends nothing more for this turn ({why})")

    # ---- the turn's life ----------------------------------------------------------------------

    def _schedule_progress(self) -> None:
        self._progress = asyncio.get_running_loop().call_later(self.host.progress_interval_s(), self._progress_tick)

    def _progress_tick(self) -> None:
        # a timer, not a task: a turn costs one task (the handler's)
        if self.settled or self.silenced:
            return
        self.send_progress()
        self._schedule_progress()

    async def _run(self) -> None:
        self._started = True
        frame: Optional[bytes] = None
        try:
            try:
                if self.silenced or self.stopping:
                    raise asyncio.CancelledError()  # cancelled before its first step
                self._schedule_progress()
                outcome = await self.host.handler(TurnContext(self))
                frame = self._result_frame(outcome)
            except _Refused as r:
                self.log.error(r.message, extra={"code": r.code})
                frame = self._error_frame(r.code, r.message, r.retryable)
            except asyncio.CancelledError:
                if self.stopping:
                    frame = self._error_frame("worker_stopping", "worker stopped before the turn finished", True)
                elif not self.silenced:
                    frame = self._error_frame("handler_error", "the handler was cancelled", True)
            except Exception as e:  # noqa: BLE001 - a handler's failure becomes its turn_error
                frame = self._exception_frame(e)
        finally:
            if self._progress is not None:
                self._progress.cancel()
            self.settled = True
            self.inbox._close()
            self.host.finished(self)
        if self.silenced:
            self.log.debug("turn was cancelled; outcome not sent")
            return
        if frame is not None:
            self.host.send_final(self.delivery_id, frame)

    def _error_frame(self, code: str, message: str, retryable: bool) -> bytes:
        body = {"code": code[:128], "message": message[:MAX_ERROR_MESSAGE], "retryable": retryable}
        return encode({"v": PROTOCOL_VERSION, "type": "turn_error", "turn_ref": self.ref, "error": body})

    def _exception_frame(self, e: Exception) -> bytes:
        if self.stopping:
            return self._error_frame("worker_stopping", "worker stopped before the turn finished", True)
        code: object = getattr(e, "code", None)
        retryable: object = getattr(e, "retryable", None)
        if isinstance(e, TurnError):
            code, retryable = e.code, e.retryable
        code_s = code if isinstance(code, str) and code else "handler_error"
        message = str(e) or type(e).__name__
        self.log.info("turn failed", extra={"code": code_s, "error": message[:200]})
        return self._error_frame(code_s, message, retryable if isinstance(retryable, bool) else True)

    def _result_frame(self, outcome: object) -> bytes:
        """The turn_result for ``outcome`` (checked as the daemon would), or raises :class:`_Refused`."""
        if not isinstance(outcome, Mapping):
            raise _Refused(
                "invalid_result", f"handler outcome is not a mapping with messages (got {type(outcome).__name__})", False
            )
        messages = outcome.get("messages")
        if not isinstance(messages, (list, tuple)):
            raise _Refused("invalid_result", "handler outcome has no messages list", False)
        if len(messages) > MAX_RESULT_MESSAGES:
            raise _Refused("invalid_result", f"handler outcome has more than {MAX_RESULT_MESSAGES} messages", False)
        wire_messages: list[JsonValue] = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or m.get("role") not in ("assistant", "tool") or "content" not in m:
                raise _Refused("invalid_result", f"messages[{i}] is not {{role: assistant | tool, content}}", False)
            why = unstorable_reason(m["content"], f"messages[{i}].content")
            if why:
                raise _Refused("unstorable_result", why, True)
            wire_messages.append({"role": m["role"], "content": m["content"]})
        result: JsonObject = {"v": PROTOCOL_VERSION, "type": "turn_result", "turn_ref": self.ref, "messages": wire_messages}  # type: ignore[dict-item]
        if outcome.get("output") is not None:
            why = unstorable_reason(outcome["output"], "output")
            if why:
                raise _Refused("unstorable_result", why, True)
            result["output"] = outcome["output"]
        emits = list(self.emits) + list(outcome.get("emit") or [])
        for i, e in enumerate(emits):
            why = _emit_problem(e, i)
            if why:
                raise _Refused("emit_limit", why, True)
        if emits:
            result["emit"] = [dict(e) for e in emits]
        delivers: list[Mapping[str, Any]] = []
        for d in list(self.delivers) + list(outcome.get("deliver") or []):
            why = _deliver_problem(d, delivers)
            if why:
                raise _Refused("deliver_limit", why, True)
            delivers.append(d)
        if delivers:
            result["deliver"] = [dict(d) for d in delivers]
        try:
            frame = encode(result)
        except (TypeError, ValueError) as e:
            raise _Refused("invalid_result", f"handler outcome is not JSON: {e}", False) from None
        if len(frame) > self.host.max_message_bytes:
            raise _Refused("result_too_large", f"turn_result is {len(frame)} bytes, limit {self.host.max_message_bytes}", False)
        return frame
