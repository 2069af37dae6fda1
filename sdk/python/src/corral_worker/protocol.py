"""corral worker protocol, version 1 (docs/protocol.md): every daemon message, validated before
use, as a typed value; and the constants the worker side needs.

Rules:
1. A frame is one UTF-8 JSON object with ``"v": 1`` and a string ``type``; anything else is a
   :class:`ProtocolViolation` (logged and skipped by the worker, never acted on).
2. Every field the SDK reads is checked against the shapes and sizes of section 5 (types,
   ranges, patterns, ``turn_ref`` at most 2048 characters). Unknown fields are ignored.
3. ``turn_ref`` is kept as the object received, unknown fields included, and echoed verbatim
   (section 8).
4. A daemon message type this version does not know is :class:`UnknownMessageType`: the worker
   logs and ignores it (section 12).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal, Optional, TypedDict, Union

from ._json import JsonObject, JsonValue, decode_object, is_int

PROTOCOL_VERSION = 1
DEFAULT_HEARTBEAT_INTERVAL_MS = 2_000
DEFAULT_PROGRESS_INTERVAL_MS = 10_000
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024
DEFAULT_STREAM_CHUNK_BYTES = 64 * 1024
MAX_CAPACITY = 1024
MAX_TURN_REF_CHARS = 2048
MAX_RESULT_MESSAGES = 1000
MAX_EMITS = 32
MAX_EMIT_DELAY_MS = 30 * 24 * 3600 * 1000
MAX_DELIVERIES = 16
MAX_BATCH_EVENTS = 100
MAX_CHUNK_SEQ = 2_147_483_647
MAX_ERROR_MESSAGE = 4096
MAX_NOTE = 4096

WORKER_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
ACTOR_PART_RE = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
ACTOR_KEY_RE = re.compile(r"[A-Za-z0-9._:@-]{1,128}/[A-Za-z0-9._:@-]{1,128}")
SINK_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
DELIVER_KEY_RE = re.compile(r"[\x21-\x7e]{1,256}")
NONCE_RE = re.compile(r"[A-Za-z0-9_-]{43}")
UUID_RE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
ISO_TIME_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")
#: A W3C traceparent as the daemon sends it (version 00; section 5.3, ``trace``).
TRACEPARENT_RE = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
MAX_TRACESTATE_LENGTH = 512
TRACESTATE_RE = re.compile(r"[\x20-\x7e]*")


class TurnRef(TypedDict):
    """The fence of one delivery (section 5.1). Echo the object you got, never a copy you built."""

    agent_uid: str
    session_id: str
    activation_uid: str
    actor_epoch: int
    event_id: str
    revision: int
    delivery_id: str


class ConversationMessage(TypedDict):
    """One committed message of the actor's conversation (context, ``history.read``)."""

    seq: int
    role: Literal["user", "assistant", "tool"]
    content: JsonValue


class ProtocolViolation(ValueError):
    """A daemon frame that breaks the protocol: not JSON, a wrong version, a bad field."""


class UnknownMessageType(ProtocolViolation):
    """A well-formed message of a type this SDK does not know (a newer daemon): ignore it."""

    def __init__(self, message_type: str) -> None:
        super().__init__(f"unknown daemon message type {message_type[:80]!r}")
        self.message_type = message_type


# ---- daemon -> worker messages ---------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    limit: int
    delay_s: int
    delay_max_s: int
    backoff: bool


@dataclass(frozen=True)
class WorkerWelcome:
    worker_id: str
    heartbeat_interval_ms: int
    progress_interval_ms: int
    capacity: Optional[int]
    lease_ms: Optional[int]
    stale_ms: Optional[int]
    retry: Optional[RetryPolicy]
    stream_chunk_bytes: Optional[int]
    stream_turn_bytes: Optional[int]
    type: Literal["worker_welcome"] = "worker_welcome"


@dataclass(frozen=True)
class WorkerChallenge:
    worker_id: str
    nonce: str
    type: Literal["worker_challenge"] = "worker_challenge"


@dataclass(frozen=True)
class TurnEvent:
    """One event a turn answers: its id, its payload (the handler's input), when it was enqueued."""

    id: str
    data: JsonValue
    enqueued_at: str


@dataclass(frozen=True)
class Conversation:
    """The conversation a turn continues, as sent with ``turn_start`` (section 5.3)."""

    conversation_id: str
    messages: tuple[ConversationMessage, ...]
    first_seq: Optional[int]
    has_more: bool
    current_seq: int


@dataclass(frozen=True)
class TraceCarrier:
    """The W3C Trace Context of the event a turn answers (``turn_start.trace``)."""

    traceparent: str
    tracestate: Optional[str] = None


@dataclass(frozen=True)
class TurnStart:
    turn_ref: TurnRef
    event: TurnEvent
    events: tuple[TurnEvent, ...]
    attempt: int
    lease_expires_at: str
    context: Optional[Conversation]
    #: The W3C trace context the turn continues (``traceparent``, optionally ``tracestate``).
    trace: Optional[TraceCarrier] = None
    type: Literal["turn_start"] = "turn_start"


@dataclass(frozen=True)
class TurnSteer:
    turn_ref: TurnRef
    input: JsonValue
    type: Literal["turn_steer"] = "turn_steer"


@dataclass(frozen=True)
class TurnCancel:
    turn_ref: TurnRef
    reason: str
    type: Literal["turn_cancel"] = "turn_cancel"


@dataclass(frozen=True)
class TurnCommitted:
    turn_ref: TurnRef
    type: Literal["turn_committed"] = "turn_committed"


@dataclass(frozen=True)
class TurnRejected:
    turn_ref: TurnRef
    reason: str
    detail: Optional[str]
    type: Literal["turn_rejected"] = "turn_rejected"


@dataclass(frozen=True)
class TurnFailed:
    turn_ref: TurnRef
    retry: bool
    dead_lettered: bool
    handed_back: bool
    type: Literal["turn_failed"] = "turn_failed"


@dataclass(frozen=True)
class TurnStreamClosed:
    """The daemon dropped a chunk of this attempt for its stream budget: stop streaming."""

    turn_ref: TurnRef
    reason: str
    limit_bytes: Optional[int]
    type: Literal["turn_stream_closed"] = "turn_stream_closed"


@dataclass(frozen=True)
class RpcErrorBody:
    code: str
    message: str


@dataclass(frozen=True)
class RpcResponse:
    id: str
    result: JsonValue
    error: Optional[RpcErrorBody]
    type: Literal["rpc_response"] = "rpc_response"


@dataclass(frozen=True)
class ProtocolError:
    code: str
    message: str
    type: Literal["error"] = "error"


DaemonMessage = Union[
    WorkerWelcome,
    WorkerChallenge,
    TurnStart,
    TurnSteer,
    TurnCancel,
    TurnCommitted,
    TurnRejected,
    TurnFailed,
    TurnStreamClosed,
    RpcResponse,
    ProtocolError,
]


# ---- field checks ------------------------------------------------------------------------------


class _Fields:
    """Typed access to one message's fields; every failure names the field."""

    def __init__(self, obj: JsonObject, where: str) -> None:
        self.obj = obj
        self.where = where

    def fail(self, name: str, what: str) -> ProtocolViolation:
        return ProtocolViolation(f"{self.where}: {name}: {what}")

    def has(self, name: str) -> bool:
        return name in self.obj and self.obj[name] is not None

    def str_(self, name: str, *, min_len: int = 0, max_len: int | None = None, pattern: re.Pattern[str] | None = None) -> str:
        v = self.obj.get(name)
        if not isinstance(v, str):
            raise self.fail(name, "expected a string")
        if len(v) < min_len or (max_len is not None and len(v) > max_len):
            raise self.fail(name, f"expected {min_len}..{max_len if max_len is not None else ''} characters")
        if pattern is not None and not pattern.fullmatch(v):
            raise self.fail(name, "does not match its pattern")
        return v

    def opt_str(self, name: str, *, max_len: int | None = None) -> str | None:
        return self.str_(name, max_len=max_len) if self.has(name) else None

    def int_(self, name: str, lo: int, hi: int = 2**53 - 1) -> int:
        v = self.obj.get(name)
        if not is_int(v, lo, hi):
            raise self.fail(name, f"expected an integer in {lo}..{hi}")
        assert isinstance(v, (int, float))
        return int(v)

    def opt_int(self, name: str, lo: int, hi: int = 2**53 - 1) -> int | None:
        return self.int_(name, lo, hi) if self.has(name) else None

    def bool_(self, name: str) -> bool:
        v = self.obj.get(name)
        if not isinstance(v, bool):
            raise self.fail(name, "expected a boolean")
        return v

    def obj_(self, name: str) -> JsonObject:
        v = self.obj.get(name)
        if not isinstance(v, dict):
            raise self.fail(name, "expected an object")
        return v

    def present(self, name: str) -> JsonValue:
        if name not in self.obj:
            raise self.fail(name, "missing")
        return self.obj[name]


def parse_turn_ref(value: JsonValue, where: str = "turn_ref") -> TurnRef:
    """``value`` as a turn_ref (section 5.1), unknown fields kept; raises :class:`ProtocolViolation`."""
    if not isinstance(value, dict):
        raise ProtocolViolation(f"{where}: expected an object")
    f = _Fields(value, where)
    f.str_("agent_uid", pattern=ACTOR_PART_RE)
    f.str_("session_id", pattern=ACTOR_PART_RE)
    f.str_("activation_uid", pattern=UUID_RE)
    f.int_("actor_epoch", 1)
    f.str_("event_id", pattern=UUID_RE)
    f.int_("revision", 0)
    f.str_("delivery_id", pattern=UUID_RE)
    if len(json.dumps(value, ensure_ascii=False, separators=(",", ":"))) > MAX_TURN_REF_CHARS:
        raise ProtocolViolation(f"{where}: longer than {MAX_TURN_REF_CHARS} characters")
    return value  # type: ignore[return-value]  # checked field by field above


def _event(value: JsonValue, where: str) -> TurnEvent:
    if not isinstance(value, dict):
        raise ProtocolViolation(f"{where}: expected an object")
    f = _Fields(value, where)
    return TurnEvent(
        id=f.str_("id", min_len=1),
        data=f.present("data"),
        enqueued_at=f.str_("enqueued_at", pattern=ISO_TIME_RE),
    )


_ROLES = ("user", "assistant", "tool")


def parse_conversation_messages(value: JsonValue, where: str) -> tuple[ConversationMessage, ...]:
    """A list of ``{seq, role, content}`` as the daemon sends in a context or a history page."""
    if not isinstance(value, list):
        raise ProtocolViolation(f"{where}: expected a list")
    out: list[ConversationMessage] = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise ProtocolViolation(f"{where}[{i}]: expected an object")
        f = _Fields(m, f"{where}[{i}]")
        seq = f.int_("seq", 1)
        role = f.str_("role")
        if role not in _ROLES:
            raise f.fail("role", "expected user, assistant or tool")
        out.append(m)  # type: ignore[arg-type]  # checked above; extra fields (truncated) kept
        del seq
    return tuple(out)


def _conversation(value: JsonValue) -> Conversation:
    if not isinstance(value, dict):
        raise ProtocolViolation("turn_start: context: expected an object")
    f = _Fields(value, "turn_start: context")
    return Conversation(
        conversation_id=f.str_("conversation_id", pattern=UUID_RE),
        messages=parse_conversation_messages(value.get("messages"), "turn_start: context.messages"),
        first_seq=f.opt_int("first_seq", 1),
        has_more=f.bool_("has_more"),
        current_seq=f.int_("current_seq", 1),
    )


def _retry(value: JsonValue) -> RetryPolicy:
    if not isinstance(value, dict):
        raise ProtocolViolation("worker_welcome: retry: expected an object")
    f = _Fields(value, "worker_welcome: retry")
    return RetryPolicy(f.int_("limit", 0), f.int_("delay_s", 0), f.int_("delay_max_s", 0), f.bool_("backoff"))


def _parse_welcome(f: _Fields) -> WorkerWelcome:
    return WorkerWelcome(
        worker_id=f.str_("worker_id", pattern=WORKER_ID_RE),
        heartbeat_interval_ms=f.int_("heartbeat_interval_ms", 1),
        progress_interval_ms=f.int_("progress_interval_ms", 1),
        capacity=f.opt_int("capacity", 1, MAX_CAPACITY),
        lease_ms=f.opt_int("lease_ms", 1),
        stale_ms=f.opt_int("stale_ms", 1),
        retry=_retry(f.obj["retry"]) if f.has("retry") else None,
        stream_chunk_bytes=f.opt_int("stream_chunk_bytes", 1),
        stream_turn_bytes=f.opt_int("stream_turn_bytes", 1),
    )


def _parse_turn_start(f: _Fields) -> TurnStart:
    ref = parse_turn_ref(f.obj.get("turn_ref"), "turn_start: turn_ref")
    event = _event(f.obj.get("event"), "turn_start: event")
    events: tuple[TurnEvent, ...] = (event,)
    if f.has("events"):
        raw = f.obj["events"]
        if not isinstance(raw, list) or not 2 <= len(raw) <= MAX_BATCH_EVENTS:
            raise f.fail("events", f"expected a list of 2..{MAX_BATCH_EVENTS} events")
        events = tuple(_event(e, f"turn_start: events[{i}]") for i, e in enumerate(raw))
    return TurnStart(
        turn_ref=ref,
        event=event,
        events=events,
        attempt=f.int_("attempt", 1),
        lease_expires_at=f.str_("lease_expires_at", pattern=ISO_TIME_RE),
        context=_conversation(f.obj["context"]) if f.has("context") else None,
        trace=_trace(f.obj_("trace")) if f.has("trace") else None,
    )


def _tracestate(v: Optional[str], t: _Fields) -> Optional[str]:
    if v is not None and not TRACESTATE_RE.fullmatch(v):
        raise t.fail("tracestate", "expected printable ASCII")
    return v


def _trace(obj: JsonObject) -> TraceCarrier:
    t = _Fields(obj, "turn_start: trace")
    return TraceCarrier(
        traceparent=t.str_("traceparent", max_len=55, pattern=TRACEPARENT_RE),
        tracestate=_tracestate(t.opt_str("tracestate", max_len=MAX_TRACESTATE_LENGTH), t),
    )


def _parse_rpc_response(f: _Fields) -> RpcResponse:
    error: RpcErrorBody | None = None
    if f.has("error"):
        e = _Fields(f.obj_("error"), "rpc_response: error")
        error = RpcErrorBody(code=e.str_("code", min_len=1), message=e.str_("message"))
    return RpcResponse(id=f.str_("id", min_len=1, max_len=128), result=f.obj.get("result"), error=error)


def _ref(f: _Fields) -> TurnRef:
    return parse_turn_ref(f.obj.get("turn_ref"), f"{f.where}: turn_ref")


def parse_daemon_message(frame: bytes, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> DaemonMessage:
    """Decode and validate one frame from the daemon. Raises :class:`ProtocolViolation` (or its
    subclass :class:`UnknownMessageType`) and nothing else."""
    if len(frame) > max_bytes:
        raise ProtocolViolation(f"frame of {len(frame)} bytes is above the limit of {max_bytes}")
    try:
        obj = decode_object(frame)
    except ValueError as e:
        raise ProtocolViolation(str(e)) from None
    v = obj.get("v")
    if v != PROTOCOL_VERSION or isinstance(v, bool):
        raise ProtocolViolation(f"unsupported protocol version {str(v)[:20]}" if is_int(v) else 'missing or invalid "v"')
    t = obj.get("type")
    if not isinstance(t, str):
        raise ProtocolViolation('missing or invalid "type"')
    f = _Fields(obj, t)
    if t == "worker_welcome":
        return _parse_welcome(f)
    if t == "worker_challenge":
        return WorkerChallenge(worker_id=f.str_("worker_id", pattern=WORKER_ID_RE), nonce=f.str_("nonce", pattern=NONCE_RE))
    if t == "turn_start":
        return _parse_turn_start(f)
    if t == "turn_steer":
        return TurnSteer(turn_ref=_ref(f), input=f.present("input"))
    if t == "turn_cancel":
        return TurnCancel(turn_ref=_ref(f), reason=f.str_("reason"))
    if t == "turn_committed":
        return TurnCommitted(turn_ref=_ref(f))
    if t == "turn_rejected":
        return TurnRejected(turn_ref=_ref(f), reason=f.str_("reason", min_len=1), detail=f.opt_str("detail"))
    if t == "turn_failed":
        handed_back = f.bool_("handed_back") if f.has("handed_back") else False
        return TurnFailed(
            turn_ref=_ref(f), retry=f.bool_("retry"), dead_lettered=f.bool_("dead_lettered"), handed_back=handed_back
        )
    if t == "turn_stream_closed":
        return TurnStreamClosed(turn_ref=_ref(f), reason=f.str_("reason", min_len=1), limit_bytes=f.opt_int("limit_bytes", 0))
    if t == "rpc_response":
        return _parse_rpc_response(f)
    if t == "error":
        return ProtocolError(code=f.str_("code", min_len=1), message=f.str_("message"))
    raise UnknownMessageType(t)
