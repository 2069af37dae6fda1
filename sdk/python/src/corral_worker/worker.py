"""The worker: one DEALER to the daemon, registration with the key proof, heartbeats, turns
through a handler, reconnects, graceful drain (docs/protocol.md sections 1, 6, 7, 13, 14).

Invariants:
1. One DEALER per worker, a fresh random routing id per connection; on a dropped connection the
   SDK reconnects after a jittered, capped backoff (50-100 ms, doubling, up to 2.5-5 s), so a
   refusing daemon is never hammered.
2. Every frame goes out through one writer task, in order. Heartbeats, progress and chunks are
   dropped (not queued) while the backlog is large: the daemon recovers them, and a dead daemon
   must not grow the worker's memory.
3. Registration is re-established by the worker, never assumed: ``worker_ready`` on start, on
   every handshake after the first, on ``error{not_registered}``, and on the heartbeat tick while
   unregistered (at most once per heartbeat interval). Each challenge nonce is answered once.
4. At most ``capacity`` handlers run at once, or the lower capacity the welcome says; a further
   ``turn_start`` is answered ``over_capacity`` (a hand-back), never queued.
5. Final messages are kept until the daemon answers them and are re-sent after every welcome.
6. Every frame from the daemon is validated before use; a bad one is logged and skipped. Nothing
   a frame, a timer or a handler does can end the receive loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import time
import uuid
from typing import Literal, Mapping, Optional, Union

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from . import __version__
from ._handshake import MONITORED_EVENTS, HandshakeWatch, backoff_delay_s, fresh_routing_id
from ._json import JsonObject, JsonValue, encode, is_json
from .errors import ConfigError, CorralWorkerError, RefusedError, RpcError, StartTimeoutError
from .keys import KeySource, WorkerKey, parse_worker_key, read_worker_key
from .log import FieldsAdapter, sdk_logger
from .protocol import (
    DEFAULT_HEARTBEAT_INTERVAL_MS,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_PROGRESS_INTERVAL_MS,
    DEFAULT_STREAM_CHUNK_BYTES,
    MAX_CAPACITY,
    PROTOCOL_VERSION,
    WORKER_ID_RE,
    DaemonMessage,
    ProtocolError,
    ProtocolViolation,
    RpcResponse,
    TurnCancel,
    TurnCommitted,
    TurnFailed,
    TurnRef,
    TurnRejected,
    TurnStart,
    TurnSteer,
    TurnStreamClosed,
    UnknownMessageType,
    WorkerChallenge,
    WorkerWelcome,
    parse_daemon_message,
)
from .turn import Handler, RunningTurn

SDK_NAME = f"corral-python/{__version__}"
MAX_UNSETTLED = 1000
MAX_BACKLOG = 1000
BAD_FRAME_LOGS_PER_S = 10

State = Literal["idle", "starting", "running", "draining", "stopped"]
_DROPPABLE = frozenset({"worker_heartbeat", "turn_progress", "turn_chunk"})
_PASSING_REFUSAL = re.compile(r"try again later|nonce", re.IGNORECASE)


class Worker:
    """A corral worker: runs ``handler`` for each turn the daemon at ``endpoint`` gives it.

    ``Worker(handler=..., endpoint=..., key_file=...).run()`` blocks until SIGINT/SIGTERM (the
    first drains, a second forces) and raises :class:`RefusedError` / :class:`StartTimeoutError`
    when the daemon refuses the worker or never answers. Options are checked here, at once:
    :class:`ConfigError` for a bad one, :class:`KeyFileError` for a key file that cannot be used.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        endpoint: str,
        key_file: Union[str, "os.PathLike[str]", None] = None,
        key: Optional[KeySource] = None,
        worker_id: Optional[str] = None,
        insecure: bool = False,
        capacity: int = 1,
        drain_timeout_s: float = 10.0,
        start_timeout_s: Optional[float] = 30.0,
        rpc_timeout_s: float = 15.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        sdk: Optional[str] = None,
        logger: Optional[logging.Logger] = None,
    ) -> None:
        if not callable(handler):
            raise ConfigError("handler must be an async function taking a TurnContext")
        if not isinstance(endpoint, str) or not re.fullmatch(r"(tcp|ipc|inproc)://.+", endpoint):
            raise ConfigError(f"endpoint must be a ZeroMQ endpoint like tcp://host:5555, not {endpoint!r}")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or not 1 <= capacity <= MAX_CAPACITY:
            raise ConfigError(f"capacity must be an integer in 1..{MAX_CAPACITY}")
        for name, value in (("drain_timeout_s", drain_timeout_s), ("rpc_timeout_s", rpc_timeout_s)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be a number of seconds >= 0")
        if start_timeout_s is not None and (not isinstance(start_timeout_s, (int, float)) or start_timeout_s <= 0):
            raise ConfigError("start_timeout_s must be a positive number of seconds, or None to wait as long as it takes")
        if isinstance(max_message_bytes, bool) or not isinstance(max_message_bytes, int) or max_message_bytes < 1024:
            raise ConfigError("max_message_bytes must be an integer >= 1024")
        self.key: Optional[WorkerKey] = None
        if insecure:
            if key is not None or key_file is not None:
                raise ConfigError("an insecure worker uses no key: give insecure or a key, not both")
            if worker_id is None:
                raise ConfigError("an insecure worker needs a worker_id")
            wid = worker_id
        else:
            if key is not None and key_file is not None:
                raise ConfigError("give a key or a key file, not both")
            if key is None and key_file is None:
                raise ConfigError("give key_file (from corral keys add-worker ID --out FILE), key, or insecure=True")
            self.key = parse_worker_key(key) if key is not None else read_worker_key(key_file)  # type: ignore[arg-type]
            if worker_id is not None and worker_id != self.key.worker_id:
                raise ConfigError(f"worker id {worker_id} differs from the key file's worker id {self.key.worker_id}")
            wid = self.key.worker_id
        if not WORKER_ID_RE.fullmatch(wid):
            raise ConfigError(f"invalid worker id {wid!r}: 1..64 characters of [A-Za-z0-9._:-]")
        self.worker_id: str = wid
        self.endpoint = endpoint
        self.handler: Handler = handler
        self.max_message_bytes = max_message_bytes
        self.requested_capacity = capacity
        self.drain_timeout_s = float(drain_timeout_s)
        self.start_timeout_s = start_timeout_s
        self.rpc_timeout_s = float(rpc_timeout_s)
        self.sdk = sdk or SDK_NAME
        self.instance = str(uuid.uuid4())
        """One per run of this worker: a reconnect keeps its turns, a restart does not."""
        self.log: FieldsAdapter = sdk_logger(logger, worker_id=wid)
        self._reset()

    def _reset(self) -> None:
        self.state: State = "idle"
        self.effective_capacity = self.requested_capacity
        self.registered = False
        self.connected = False
        self._heartbeat_s = DEFAULT_HEARTBEAT_INTERVAL_MS / 1000
        self._progress_s = DEFAULT_PROGRESS_INTERVAL_MS / 1000
        self._stream_chunk_bytes = DEFAULT_STREAM_CHUNK_BYTES
        self._stream_turn_bytes: Optional[int] = None
        self.turns: dict[str, RunningTurn] = {}
        self.unsettled: dict[str, bytes] = {}
        self._rpc: dict[str, asyncio.Future[JsonValue]] = {}
        self._rpc_seq = 0
        self._answered_nonce: Optional[str] = None
        self._ready_sent_at: Optional[float] = None
        self._heartbeat_queued = False
        self._handshakes = 0
        self._reconnects = 0
        self._reconnect_handle: Optional[asyncio.TimerHandle] = None
        self._handshake = HandshakeWatch(self.log, self.worker_id, self.endpoint)
        self._bad_frames_window = (0.0, 0)
        self._unknown_types: set[str] = set()
        self._welcomed: Optional[asyncio.Future[None]] = None
        self._stopped: Optional[asyncio.Event] = None
        self._stop_task: Optional[asyncio.Task[None]] = None
        self._force = False
        self._signals = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._outbox: Optional[asyncio.Queue[tuple[bytes, str]]] = None
        self._ctx: Optional[zmq.asyncio.Context] = None
        self._sock: Optional[zmq.asyncio.Socket] = None
        self._monitor: Optional[zmq.asyncio.Socket] = None

    # ---- public surface --------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Turns whose handler is running now."""
        return len(self.turns)

    @property
    def capacity(self) -> int:
        """The capacity the daemon registered (its welcome's), at most the one asked for."""
        return self.effective_capacity

    def run(self) -> None:
        """Run until SIGINT/SIGTERM (graceful drain; a second signal forces). Blocks."""
        asyncio.run(self.serve())

    async def serve(self, *, handle_signals: bool = True) -> None:
        """:meth:`start`, then run until :meth:`stop` or a signal; the coroutine form of :meth:`run`."""
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    installed.append(sig)
                except (NotImplementedError, RuntimeError, ValueError):  # pragma: no cover - not the main thread, Windows
                    pass
        try:
            try:
                await self.start()
            except CorralWorkerError as err:
                if err.code == "shutdown":  # stopped (a signal, say) before the daemon's welcome
                    return
                raise
            assert self._stopped is not None
            await self._stopped.wait()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            await self.stop()

    async def start(self) -> None:
        """Connect and register; returns on the daemon's welcome. Raises :class:`RefusedError`
        as soon as the refusal is certain, :class:`StartTimeoutError` after ``start_timeout_s``."""
        if self.state != "idle":
            raise CorralWorkerError(f"worker {self.worker_id} was started already", code="invalid_state")
        loop = asyncio.get_running_loop()
        self.state = "starting"
        self._welcomed = loop.create_future()
        self._stopped = asyncio.Event()
        self._outbox = asyncio.Queue()
        self._open_socket()
        for coro, name in (
            (self._reader(), "reader"),
            (self._writer(), "writer"),
            (self._monitor_loop(), "monitor"),
            (self._heartbeat_loop(), "heartbeat"),
        ):
            self._tasks.append(loop.create_task(coro, name=f"corral-worker-{name}"))
        self.log.info(
            "worker starting",
            extra={"endpoint": self.endpoint, "capacity": self.requested_capacity, "curve": self.key is not None},
        )
        self._send_ready(force=True)
        try:
            if self.start_timeout_s is None:
                await asyncio.shield(self._welcomed)
            else:
                await asyncio.wait_for(asyncio.shield(self._welcomed), self.start_timeout_s)
        except asyncio.TimeoutError:
            err = StartTimeoutError(
                f"no welcome from the daemon at {self.endpoint} within {self.start_timeout_s:g} s: is it running, and is this its endpoint?"
            )
            self.log.error(f"worker did not start: {err}", extra={"code": err.code})
            await self._close()
            raise err from None
        except CorralWorkerError as err:
            (self.log.info if err.code == "shutdown" else self.log.error)(
                f"worker did not start: {err}", extra={"code": err.code}
            )
            await self._close()
            raise
        except asyncio.CancelledError:
            await self._close()
            raise
        if self.state == "starting":
            self.state = "running"

    async def stop(self, *, drain: bool = True) -> None:
        """Stop: with ``drain``, take no new turns and let running ones finish for up to
        ``drain_timeout_s`` (then abort them, handed back ``worker_stopping``); wait briefly for
        the daemon to answer their results; close. Idempotent."""
        if self.state in ("idle", "stopped"):
            self.state = "stopped"
            return
        if not drain:
            self._force = True
            for t in list(self.turns.values()):
                t.abort_for_stop()
        if self._stop_task is None:
            self._stop_task = asyncio.get_running_loop().create_task(self._drain_and_close(drain))
        await asyncio.shield(self._stop_task)

    # ---- lifecycle ---------------------------------------------------------------------------

    def _on_signal(self, sig: int) -> None:
        self._signals += 1
        name = signal.Signals(sig).name
        if self._signals == 1:
            self.log.info(f"{name}: draining (a second signal forces)", extra={"in_flight": len(self.turns)})
            self._stop_task = asyncio.get_running_loop().create_task(self._drain_and_close(True))
        else:
            self.log.warning(f"{name} again: stopping now, aborting running turns", extra={"in_flight": len(self.turns)})
            self._force = True
            for t in list(self.turns.values()):
                t.abort_for_stop()

    async def _drain_and_close(self, drain: bool) -> None:
        self.state = "draining"
        try:
            if drain and self.turns and not self._force:
                await self._wait_turns(self.drain_timeout_s)
            if self.turns:
                if not self._force:
                    self.log.warning("drain time is up; aborting running turns", extra={"in_flight": len(self.turns)})
                for t in list(self.turns.values()):
                    t.abort_for_stop()
                await self._wait_turns(5.0)
            if self.turns:
                self.log.warning("handlers ignored cancellation; closing anyway", extra={"in_flight": len(self.turns)})
            # the daemon answers each final message; wait for the answers a little, so a drained
            # turn is known committed before the process goes (and re-sent if the daemon restarted)
            deadline = time.monotonic() + (0.5 if self._force else 2.0)
            while self.unsettled and self.connected and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if self.unsettled:
                self.log.warning("stopping with results the daemon has not answered", extra={"unanswered": len(self.unsettled)})
        finally:
            await self._close()

    async def _wait_turns(self, timeout_s: float) -> None:
        pending = [t.done for t in self.turns.values()]
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)

    async def _close(self) -> None:
        if self.state == "stopped":
            return
        self.state = "stopped"
        if self._reconnect_handle is not None:
            self._reconnect_handle.cancel()
            self._reconnect_handle = None
        for fut in self._rpc.values():
            if not fut.done():
                fut.set_exception(RpcError("worker stopped", code="worker_stopping"))
        self._rpc.clear()
        # let the last frames leave the writer (bounded: a daemon that is gone takes nothing)
        if self._outbox is not None and self.connected:
            deadline = time.monotonic() + 0.5
            while not self._outbox.empty() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for t in list(self.turns.values()):
            t.done.cancel()
        if self._sock is not None:
            try:
                self._sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self._sock.close(linger=200 if self.connected else 0)
        if self._monitor is not None:
            self._monitor.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()
        self._sock = self._monitor = self._ctx = None
        self.registered = False
        self.connected = False
        if self._welcomed is not None and not self._welcomed.done():
            self._welcomed.set_exception(
                CorralWorkerError(f"worker {self.worker_id} was stopped before it started", code="shutdown")
            )
            self._welcomed.exception()  # mark retrieved
        if self._stopped is not None:
            self._stopped.set()
        self.log.info("worker stopped")

    def _open_socket(self) -> None:
        self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, fresh_routing_id())
        # a frame above twice the limit drops the connection (libzmq); one above it is skipped here
        sock.setsockopt(zmq.MAXMSGSIZE, 2 * self.max_message_bytes)
        # ZMTP pings turn a dead daemon host (half-open TCP) into a reconnect
        sock.setsockopt(zmq.HEARTBEAT_IVL, int(self._heartbeat_s * 1000))
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(self._heartbeat_s * 3000))
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)
        if self.key is not None:
            sock.curve_secretkey = self.key.secret_key.encode("ascii")
            sock.curve_publickey = self.key.public_key.encode("ascii")
            sock.curve_serverkey = self.key.server_key.encode("ascii")
        self._monitor = sock.get_monitor_socket(MONITORED_EVENTS)
        sock.connect(self.endpoint)
        self._sock = sock

    # ---- reconnects and handshakes ------------------------------------------------------------

    def _schedule_reconnect(self) -> None:
        if self.state not in ("starting", "running", "draining") or self._reconnect_handle is not None:
            return
        self._reconnects += 1
        delay = backoff_delay_s(self._reconnects)
        self._reconnect_handle = asyncio.get_running_loop().call_later(delay, self._reconnect)

    def _reconnect(self) -> None:
        self._reconnect_handle = None
        sock = self._sock
        if sock is None or self.state not in ("starting", "running", "draining"):
            return
        try:
            sock.disconnect(self.endpoint)
        except zmq.ZMQError:
            pass  # already disconnected
        try:
            sock.setsockopt(zmq.ROUTING_ID, fresh_routing_id())
            sock.connect(self.endpoint)
            self.registered = False
            self._send_ready(force=True)
        except zmq.ZMQError as e:
            self.log.error("reconnect failed", extra={"err": str(e)})
            self._schedule_reconnect()

    async def _monitor_loop(self) -> None:
        assert self._monitor is not None
        mon = self._monitor
        while True:
            try:
                frames = await mon.recv_multipart()
                ev = parse_monitor_message(frames)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the monitor must not die
                if self.state == "stopped":
                    return
                self.log.warning("bad socket monitor message", extra={"err": str(e)})
                await asyncio.sleep(0.1)
                continue
            try:
                self._on_socket_event(int(ev["event"]), int(ev["value"]))
            except Exception:  # noqa: BLE001
                self.log.exception("socket event handling failed")

    def _on_socket_event(self, event: int, value: int) -> None:
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.connected = True
            self._reconnects = 0
            self._handshake.succeeded()
            self._handshakes += 1
            if self._handshakes > 1:
                self.log.info("reconnected to daemon; registering again")
                self._send_ready(force=True)
        elif event == zmq.EVENT_DISCONNECTED:
            if self.connected:
                self.log.warning("disconnected from daemon")
            self.connected = False
            self.registered = False
            self._schedule_reconnect()
        else:
            refusal = self._handshake.failed(event, value)
            if refusal is not None:
                self._refused(refusal)
            if event in (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
                self._schedule_reconnect()  # libzmq does not retry these itself

    def _refused(self, err: RefusedError) -> None:
        """A refusal before the first welcome fails the start; afterwards it is only logged
        (the worker keeps trying: a key put back on the allow-list lets it in again)."""
        if self._welcomed is not None and not self._welcomed.done():
            self._welcomed.set_exception(err)

    # ---- receive path ---------------------------------------------------------------------------

    async def _reader(self) -> None:
        assert self._sock is not None
        sock = self._sock
        while True:
            try:
                frames = await sock.recv_multipart(copy=True)
            except asyncio.CancelledError:
                raise
            except zmq.ZMQError as e:
                if self.state == "stopped":
                    return
                self.log.warning("receive failed", extra={"err": str(e)})
                await asyncio.sleep(0.05)
                continue
            try:
                self._on_frames([bytes(f) for f in frames])
            except Exception:  # noqa: BLE001 - invariant 6
                self.log.exception("handling a daemon message failed")

    def _bad_frame(self, why: str, level: str = "warning") -> None:
        now = time.monotonic()
        start, count = self._bad_frames_window
        if now - start >= 1.0:
            start, count = now, 0
        count += 1
        self._bad_frames_window = (start, count)
        if count <= BAD_FRAME_LOGS_PER_S:
            getattr(self.log, level)("ignoring daemon message", extra={"why": why[:300]})

    def _on_frames(self, frames: list[bytes]) -> None:
        if len(frames) != 1:
            self._bad_frame(f"{len(frames)} frames, expected one")
            return
        try:
            msg = parse_daemon_message(frames[0], self.max_message_bytes)
        except UnknownMessageType as e:
            # a newer daemon may send types this SDK does not know: skip them (protocol section 12)
            first = e.message_type not in self._unknown_types
            self._unknown_types.add(e.message_type[:80])
            (self.log.warning if first else self.log.debug)(
                "ignoring daemon message of unknown type", extra={"type": e.message_type[:80]}
            )
            return
        except ProtocolViolation as e:
            self._bad_frame(str(e))
            return
        self._dispatch(msg)

    def _dispatch(self, msg: DaemonMessage) -> None:
        if isinstance(msg, WorkerWelcome):
            self._on_welcome(msg)
        elif isinstance(msg, WorkerChallenge):
            self._on_challenge(msg)
        elif isinstance(msg, TurnStart):
            self._on_turn_start(msg)
        elif isinstance(msg, TurnSteer):
            turn = self.turns.get(msg.turn_ref["delivery_id"])
            if turn is not None:
                turn.steer(msg.turn_ref, msg.input)
            else:
                self.log.debug("steer for a turn not running here", extra={"delivery_id": msg.turn_ref["delivery_id"]})
        elif isinstance(msg, TurnCancel):
            turn = self.turns.get(msg.turn_ref["delivery_id"])
            if turn is not None:
                turn.cancel(msg.reason)
            self.unsettled.pop(msg.turn_ref["delivery_id"], None)
        elif isinstance(msg, TurnCommitted):
            self.unsettled.pop(msg.turn_ref["delivery_id"], None)
            self.log.debug(
                "turn committed", extra={"delivery_id": msg.turn_ref["delivery_id"], "revision": msg.turn_ref["revision"]}
            )
        elif isinstance(msg, TurnFailed):
            self.unsettled.pop(msg.turn_ref["delivery_id"], None)
            self.log.debug(
                "turn failed",
                extra={
                    "delivery_id": msg.turn_ref["delivery_id"],
                    "retry": msg.retry,
                    "dead_lettered": msg.dead_lettered,
                    "handed_back": msg.handed_back,
                },
            )
        elif isinstance(msg, TurnRejected):
            self._on_rejected(msg)
        elif isinstance(msg, TurnStreamClosed):
            turn = self.turns.get(msg.turn_ref["delivery_id"])
            if turn is not None and turn.start.turn_ref["event_id"] == msg.turn_ref["event_id"]:
                turn.stream_closed_by_daemon(msg.reason, msg.limit_bytes)
        elif isinstance(msg, RpcResponse):
            fut = self._rpc.pop(msg.id, None)
            if fut is not None and not fut.done():
                if msg.error is not None:
                    fut.set_exception(RpcError(f"rpc {msg.error.code}: {msg.error.message}", code=msg.error.code))
                else:
                    fut.set_result(msg.result)
        elif isinstance(msg, ProtocolError):
            self._on_protocol_error(msg)

    def _on_welcome(self, msg: WorkerWelcome) -> None:
        if msg.worker_id != self.worker_id:
            self._bad_frame(f"welcome for another worker id {msg.worker_id}")
            return
        if msg.lease_ms is not None and msg.progress_interval_ms * 2 > msg.lease_ms:
            # one lost progress message would then cost the lease: say so, the daemon's config is off
            self.log.warning(
                "progress interval is more than half the lease",
                extra={"progress_ms": msg.progress_interval_ms, "lease_ms": msg.lease_ms},
            )
        effective = min(self.requested_capacity, msg.capacity if msg.capacity is not None else self.requested_capacity)
        if effective < self.requested_capacity and effective != self.effective_capacity:
            self.log.warning(
                "the daemon registered a lower capacity (allow-list cap)",
                extra={"requested": self.requested_capacity, "registered": effective},
            )
        was_registered = self.registered
        self.effective_capacity = effective
        self.registered = True
        self._ready_sent_at = None
        self._heartbeat_s = msg.heartbeat_interval_ms / 1000
        self._progress_s = msg.progress_interval_ms / 1000
        self._stream_chunk_bytes = msg.stream_chunk_bytes if msg.stream_chunk_bytes is not None else DEFAULT_STREAM_CHUNK_BYTES
        self._stream_turn_bytes = msg.stream_turn_bytes
        self.log.info(
            "registered with daemon",
            extra={
                "heartbeat_ms": msg.heartbeat_interval_ms,
                "progress_ms": msg.progress_interval_ms,
                "capacity": effective,
                "was_registered": was_registered,
                "stream_chunk_bytes": self._stream_chunk_bytes,
                "stream_turn_bytes": self._stream_turn_bytes,
            },
        )
        if self._welcomed is not None and not self._welcomed.done():
            self._welcomed.set_result(None)
        # invariant 5: results the daemon has not answered may have been lost with the old session
        for frame in list(self.unsettled.values()):
            self._enqueue(frame, "final")

    def _on_challenge(self, msg: WorkerChallenge) -> None:
        if (
            msg.worker_id != self.worker_id
            or msg.nonce == self._answered_nonce
            or self.state not in ("starting", "running", "draining")
        ):
            return
        if self.key is None:
            self.log.error("the daemon asks for a key proof, but this worker has no key file (it runs insecure)")
            return
        try:
            proof = self.key.proof(msg.nonce)
        except ValueError as e:
            self.log.error("cannot compute the key proof", extra={"err": str(e)})
            return
        self._answered_nonce = msg.nonce
        self._send_ready(force=True, nonce=msg.nonce, proof=proof)

    def _on_turn_start(self, msg: TurnStart) -> None:
        ref = msg.turn_ref
        did = ref["delivery_id"]
        existing = self.turns.get(did)
        if existing is not None:
            # a re-sent turn_start (our accept was lost): accept again, never run twice
            self._send_msg({"v": PROTOCOL_VERSION, "type": "turn_accepted", "turn_ref": existing.ref}, "turn_accepted")
            return

        def refuse(code: str, message: str) -> None:
            err = {"code": code, "message": message, "retryable": True}
            self._send_msg({"v": PROTOCOL_VERSION, "type": "turn_error", "turn_ref": ref, "error": err}, "turn_error")

        if self.state != "running" and self.state != "starting":
            refuse("worker_stopping", "worker is stopping")
            return
        if len(self.turns) >= self.effective_capacity:
            self.log.warning("turn_start over capacity", extra={"delivery_id": did, "capacity": self.effective_capacity})
            refuse("over_capacity", f"worker {self.worker_id} is at capacity {self.effective_capacity}")
            return
        turn = RunningTurn(msg, self, self.log)
        self.turns[did] = turn

        # accept once this round of the loop is over, unless the handler has finished by then: its
        # final message implies the accept (protocol section 7 rule 1)
        def accept() -> None:
            if self.turns.get(did) is turn:
                self._send_msg({"v": PROTOCOL_VERSION, "type": "turn_accepted", "turn_ref": turn.ref}, "turn_accepted")

        asyncio.get_running_loop().call_soon(accept)

    def _on_rejected(self, msg: TurnRejected) -> None:
        did = msg.turn_ref["delivery_id"]
        self.unsettled.pop(did, None)
        self.log.info(
            "turn rejected by daemon",
            extra={"delivery_id": did, "revision": msg.turn_ref["revision"], "reason": msg.reason, "detail": msg.detail},
        )
        turn = self.turns.get(did)
        # stale_revision while running: a steer is on its way. Any other rejection of the current
        # ref means the daemon will never take this turn's result
        if turn is not None and msg.reason != "stale_revision" and turn.ref["revision"] == msg.turn_ref["revision"]:
            turn.cancel(f"rejected: {msg.reason}")

    def _on_protocol_error(self, msg: ProtocolError) -> None:
        if msg.code == "not_registered":
            self.log.info("daemon does not know this worker; registering again", extra={"message": msg.message[:200]})
            self.registered = False
            self._send_ready(force=False)
            return
        if msg.code == "rate_limited":
            # without a registration, the heartbeat tick asks again once per interval
            self.log.warning(
                "the daemon refused a registration for now: too many of this key", extra={"message": msg.message[:200]}
            )
            return
        if msg.code in ("unauthorized", "identity_mismatch"):
            self.registered = False
        self.log.error("daemon reported a protocol error", extra={"code": msg.code, "message": msg.message[:500]})
        if msg.code in ("unauthorized", "identity_mismatch") and not _PASSING_REFUSAL.search(msg.message):
            self._refused(
                RefusedError(
                    f"the daemon at {self.endpoint} refused to register worker {self.worker_id}: {msg.message[:500]}",
                    code="registration_refused",
                )
            )

    # ---- what turns call (TurnHost) ----------------------------------------------------------

    def progress_interval_s(self) -> float:
        return self._progress_s

    def stream_chunk_bytes(self) -> int:
        return min(self._stream_chunk_bytes, self.max_message_bytes)

    def stream_turn_bytes(self) -> Optional[int]:
        return self._stream_turn_bytes

    def send(self, frame: bytes, kind: str) -> None:
        self._enqueue(frame, kind)

    def send_final(self, delivery_id: str, frame: bytes) -> None:
        if len(self.unsettled) >= MAX_UNSETTLED:
            self.unsettled.pop(next(iter(self.unsettled)))
        self.unsettled[delivery_id] = frame
        self._enqueue(frame, "final")

    def finished(self, turn: RunningTurn) -> None:
        if self.turns.get(turn.delivery_id) is turn:
            del self.turns[turn.delivery_id]

    async def call_rpc(self, ref: TurnRef, method: str, params: JsonValue) -> JsonValue:
        if self.state not in ("starting", "running", "draining"):
            raise RpcError("worker is stopping", code="worker_stopping")
        if not isinstance(method, str) or not 1 <= len(method) <= 64:
            raise RpcError("rpc method must be 1..64 characters", code="invalid_params")
        if not is_json(params):
            raise RpcError("rpc params must be a JSON value", code="invalid_params")
        self._rpc_seq += 1
        rid = f"{self.instance[:8]}-{self._rpc_seq}"
        fut: asyncio.Future[JsonValue] = asyncio.get_running_loop().create_future()
        self._rpc[rid] = fut
        try:
            self._send_msg(
                {"v": PROTOCOL_VERSION, "type": "rpc_request", "id": rid, "method": method, "params": params, "turn_ref": ref},
                "rpc_request",
            )
            return await asyncio.wait_for(fut, self.rpc_timeout_s)
        except asyncio.TimeoutError:
            raise RpcError(f"no rpc_response within {self.rpc_timeout_s:g} s", code="timeout") from None
        finally:
            self._rpc.pop(rid, None)

    # ---- send path ------------------------------------------------------------------------------

    def _send_ready(self, *, force: bool, nonce: Optional[str] = None, proof: Optional[str] = None) -> None:
        if self.state not in ("starting", "running", "draining"):
            return
        now = time.monotonic()
        if not force and self._ready_sent_at is not None and now - self._ready_sent_at < self._heartbeat_s:
            return
        self._ready_sent_at = now
        msg: JsonObject = {
            "v": PROTOCOL_VERSION,
            "type": "worker_ready",
            "worker_id": self.worker_id,
            "capacity": self.requested_capacity,
            "sdk": self.sdk[:256],
            "instance": self.instance,
        }
        if self.key is not None:
            auth: JsonObject = {"scheme": "key", "credential": self.key.token}
            if nonce is not None and proof is not None:
                auth["nonce"], auth["proof"] = nonce, proof
            msg["auth"] = auth
        self._send_msg(msg, "worker_ready")

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_s)
            try:
                if self.state not in ("starting", "running", "draining"):
                    continue
                if not self.registered:
                    self._send_ready(force=False)
                    continue
                if self._heartbeat_queued:
                    continue  # the last one has not left yet (daemon unreachable): don't pile them up
                self._heartbeat_queued = True
                self._send_msg(
                    {
                        "v": PROTOCOL_VERSION,
                        "type": "worker_heartbeat",
                        "worker_id": self.worker_id,
                        "in_flight": len(self.turns),
                    },
                    "worker_heartbeat",
                )
            except Exception:  # noqa: BLE001
                self.log.exception("heartbeat tick failed")

    def _send_msg(self, msg: Mapping[str, object], kind: str) -> None:
        try:
            frame = encode(msg)
        except (TypeError, ValueError) as e:
            self.log.error("cannot encode a message; not sent", extra={"type": kind, "err": str(e)})
            return
        self._enqueue(frame, kind)

    def _enqueue(self, frame: bytes, kind: str) -> None:
        q = self._outbox
        if q is None or self.state == "stopped":
            return
        if kind in _DROPPABLE and q.qsize() >= MAX_BACKLOG:
            if kind == "worker_heartbeat":
                self._heartbeat_queued = False
            return
        q.put_nowait((frame, kind))

    async def _writer(self) -> None:
        assert self._outbox is not None
        q = self._outbox
        while True:
            frame, kind = await q.get()
            try:
                sock = self._sock
                if sock is not None:
                    await sock.send(frame, copy=len(frame) < 65536)
            except asyncio.CancelledError:
                raise
            except zmq.ZMQError as e:
                if self.state != "stopped":
                    self.log.warning("send to daemon failed", extra={"type": kind, "err": str(e)})
            finally:
                if kind == "worker_heartbeat":
                    self._heartbeat_queued = False
