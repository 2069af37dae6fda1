"""In-process tests: the key proof, message validation, and the worker against a scripted
ROUTER (real ZeroMQ) for what a daemon of today does not send: ``stream_turn_bytes`` in the
welcome, ``turn_stream_closed``, bad frames, unknown message types."""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Coroutine, TypeVar

import pytest

from corral_worker import NonRetryableError, StartTimeoutError, TurnContext, TurnOutcome, Worker
from corral_worker._json import encode, unstorable_reason
from corral_worker.keys import curve_shared_secret, registration_proof
from corral_worker.log import sdk_logger
from corral_worker.protocol import (
    ProtocolViolation,
    TraceCarrier,
    TurnStart,
    TurnStreamClosed,
    UnknownMessageType,
    WorkerWelcome,
    parse_daemon_message,
)
from corral_worker._handshake import backoff_delay_s
from fake_daemon import FakeDaemon, turn_ref, turn_start

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


# ---- the key proof ------------------------------------------------------------------------------


def test_the_key_proof_matches_the_protocol_test_vector() -> None:
    shared = curve_shared_secret("D:)Q[IlAW!ahhC2ac:9*A}h:p?([4%wOTJ%JR%cs", "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7")
    assert shared.hex() == "535e8ec77a336a164c2484095d83b7e5f902a695c27482af6e07e09e31611b1c"
    assert (
        registration_proof(shared, "gpu-box-1", "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8")
        == "Nx176iIb1F4YfY5UyNc0-1M4wkQrLT8h2Mw9TbhCtWM"
    )


# ---- validation of daemon messages ----------------------------------------------------------------


def frame(msg: Any) -> bytes:
    return json.dumps(msg).encode()


def test_a_welcome_with_the_new_optional_fields_parses() -> None:
    m = parse_daemon_message(
        frame(
            {
                "v": 1,
                "type": "worker_welcome",
                "worker_id": "w",
                "heartbeat_interval_ms": 2000,
                "progress_interval_ms": 10000,
                "stream_turn_bytes": 100,
                "x": 1,
            }
        )
    )
    assert isinstance(m, WorkerWelcome) and m.stream_turn_bytes == 100 and m.stream_chunk_bytes is None and m.capacity is None


def test_turn_stream_closed_parses() -> None:
    ref = turn_ref()
    m = parse_daemon_message(
        frame({"v": 1, "type": "turn_stream_closed", "turn_ref": ref, "reason": "turn_limit", "limit_bytes": 8388608})
    )
    assert isinstance(m, TurnStreamClosed) and m.turn_ref == ref and m.limit_bytes == 8388608


def test_turn_ref_keeps_unknown_fields_verbatim() -> None:
    ref = turn_ref(fence_v2={"a": [1, 2]})
    m = parse_daemon_message(frame({"v": 1, "type": "turn_committed", "turn_ref": ref}))
    assert m.turn_ref == ref  # type: ignore[union-attr]


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_turn_start_trace_parses_and_is_optional() -> None:
    m = parse_daemon_message(frame({**turn_start(turn_ref(), 1), "trace": {"traceparent": TRACEPARENT, "tracestate": "a=1"}}))
    assert isinstance(m, TurnStart) and m.trace == TraceCarrier(traceparent=TRACEPARENT, tracestate="a=1")
    plain = parse_daemon_message(frame(turn_start(turn_ref(), 1)))
    assert isinstance(plain, TurnStart) and plain.trace is None


WELCOME = {"v": 1, "type": "worker_welcome", "worker_id": "w", "heartbeat_interval_ms": 2000, "progress_interval_ms": 10000}


@pytest.mark.parametrize(
    "payload, says",
    [
        (b"\xff\xfe", "UTF-8"),
        (b"not json", "not JSON"),
        (b"[1]", "not a JSON object"),
        (frame({"type": "worker_welcome"}), '"v"'),
        (frame({**WELCOME, "v": 2}), "unsupported protocol version"),
        (frame({**WELCOME, "v": True}), '"v"'),
        (frame({**WELCOME, "heartbeat_interval_ms": 0}), "heartbeat_interval_ms"),
        (frame({**WELCOME, "heartbeat_interval_ms": True}), "heartbeat_interval_ms"),
        (frame({**WELCOME, "capacity": 5000}), "capacity"),
        (frame({**WELCOME, "stream_turn_bytes": 0}), "stream_turn_bytes"),
        (frame({**WELCOME, "worker_id": "bad id"}), "worker_id"),
        (b'{"v":1,"type":"worker_welcome","worker_id":"w","heartbeat_interval_ms":NaN,"progress_interval_ms":1}', "NaN"),
        (frame({"v": 1, "type": "worker_challenge", "worker_id": "w", "nonce": "short"}), "nonce"),
        (frame({"v": 1, "type": "turn_committed", "turn_ref": {**turn_ref(), "delivery_id": "x"}}), "delivery_id"),
        (frame({"v": 1, "type": "turn_committed", "turn_ref": {**turn_ref(), "actor_epoch": 0}}), "actor_epoch"),
        (frame({"v": 1, "type": "turn_committed", "turn_ref": {**turn_ref(), "pad": "x" * 3000}}), "2048"),
        (frame({**turn_start(turn_ref(), 1), "attempt": 0}), "attempt"),
        (frame({**turn_start(turn_ref(), 1), "lease_expires_at": "tomorrow"}), "lease_expires_at"),
        (frame({**turn_start(turn_ref(), 1), "trace": {"traceparent": "00-zz"}}), "traceparent"),
        (frame({**turn_start(turn_ref(), 1), "trace": {"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"}}), "traceparent"),
        (frame({**turn_start(turn_ref(), 1), "trace": {"traceparent": TRACEPARENT, "tracestate": "x" * 513}}), "tracestate"),
        (frame({**turn_start(turn_ref(), 1), "trace": {"traceparent": TRACEPARENT, "tracestate": "a=\u00e9"}}), "tracestate"),
        (frame({**turn_start(turn_ref(), 1), "trace": TRACEPARENT}), "trace"),
        (
            frame({**turn_start(turn_ref(), 1), "events": [{"id": "e", "data": 1, "enqueued_at": "2026-01-01T00:00:00Z"}]}),
            "events",
        ),
        (
            frame(
                {
                    **turn_start(turn_ref(), 1),
                    "context": {"conversation_id": "x", "messages": [], "has_more": False, "current_seq": 1},
                }
            ),
            "conversation_id",
        ),
        (frame({"v": 1, "type": "turn_steer", "turn_ref": turn_ref()}), "input"),
        (frame({"v": 1, "type": "turn_stream_closed", "turn_ref": turn_ref()}), "reason"),
        (frame({"v": 1, "type": "rpc_response", "id": "", "result": 1}), "id"),
        (frame({"v": 1, "type": "error", "code": "", "message": "m"}), "code"),
        (b"{" + b'"a":' * 0 + b'"v":1,"type":"error","code":"x","message":' + b"[" * 5000 + b"]" * 5000 + b"}", "deep"),
    ],
)
def test_a_bad_frame_is_refused_with_the_reason(payload: bytes, says: str) -> None:
    with pytest.raises(ProtocolViolation) as e:
        parse_daemon_message(payload)
    assert says in str(e.value)


def test_a_frame_above_the_limit_is_refused() -> None:
    with pytest.raises(ProtocolViolation, match="above the limit"):
        parse_daemon_message(frame({**WELCOME, "pad": "x" * 2000}), max_bytes=1024)


def test_an_unknown_type_is_its_own_error() -> None:
    with pytest.raises(UnknownMessageType):
        parse_daemon_message(frame({"v": 1, "type": "turn_future"}))


def test_unstorable_values_are_named() -> None:
    deep: Any = 1
    for _ in range(101):
        deep = [deep]
    assert unstorable_reason(deep) is not None and "deeper than 100" in str(unstorable_reason(deep))
    assert "NUL" in str(unstorable_reason({"a": "x\x00"}))
    assert "surrogate" in str(unstorable_reason(["\ud800"]))
    assert unstorable_reason({"ok": [1, 2.5, None, True, "é"]}) is None
    assert encode({"t": "é"}) == '{"t":"é"}'.encode()


def test_backoff_is_jittered_and_capped() -> None:
    assert 0.05 <= backoff_delay_s(1) <= 0.1
    assert backoff_delay_s(1, rand=0.0) == 0.05 and backoff_delay_s(1, rand=1.0) == 0.1
    assert 2.5 <= backoff_delay_s(50) <= 5.0


def test_log_fields_named_like_record_attributes_do_not_break_logging(caplog: pytest.LogCaptureFixture) -> None:
    log = sdk_logger(logging.getLogger("corral_worker.test"), worker_id="w")
    with caplog.at_level(logging.INFO, logger="corral_worker.test"):
        log.info("hello", extra={"message": "m", "args": 1, "delivery_id": "d"})
    rec = caplog.records[-1]
    assert rec.corral == {"worker_id": "w", "message": "m", "args": 1, "delivery_id": "d"}  # type: ignore[attr-defined]
    assert rec.delivery_id == "d"  # type: ignore[attr-defined]


# ---- the worker against a scripted ROUTER --------------------------------------------------------


@asynccontextmanager
async def worker_with(
    handler: Callable[[TurnContext], Coroutine[Any, Any, TurnOutcome]], *, capacity: int = 1, **welcome: Any
) -> AsyncIterator[tuple[Worker, FakeDaemon]]:
    daemon = FakeDaemon()
    worker = Worker(handler, endpoint=daemon.endpoint, insecure=True, worker_id="fake-1", capacity=capacity, start_timeout_s=5)
    started = asyncio.ensure_future(worker.start())
    try:
        await daemon.welcome(**welcome)
        await started
        yield worker, daemon
    finally:
        await worker.stop(drain=False)
        daemon.close()


def chunk_bytes(data: Any, ref: dict[str, Any], seq: int) -> int:
    return len(encode({"v": 1, "type": "turn_chunk", "turn_ref": ref, "seq": seq, "data": data}))


def test_stream_stops_at_the_welcomes_stream_turn_bytes(caplog: pytest.LogCaptureFixture) -> None:
    ref = turn_ref()
    one = chunk_bytes({"delta": "abcdefghij"}, ref, 1)

    async def handler(ctx: TurnContext) -> TurnOutcome:
        sent = [ctx.stream({"delta": "abcdefghij"}) for _ in range(5)]
        return {"messages": [{"role": "assistant", "content": {"sent": sent}}]}

    async def scenario() -> None:
        # room for three chunks and a half: the fourth would pass the budget
        async with worker_with(handler, stream_turn_bytes=one * 3 + one // 2) as (_, daemon):
            await daemon.send(turn_start(ref, {"x": 1}))
            result = await daemon.recv("turn_result")
            assert result["messages"][0]["content"]["sent"] == [True, True, True, False, False]
            chunks = daemon.of_type("turn_chunk")
            assert [c["seq"] for c in chunks] == [1, 2, 3]
            assert sum(len(f) for f in daemon.frames if b'"turn_chunk"' in f) <= one * 3 + one // 2

    with caplog.at_level(logging.WARNING, logger="corral_worker"):
        run(scenario())
    assert sum("stream budget spent" in r.getMessage() for r in caplog.records) == 1


def test_without_stream_turn_bytes_there_is_no_budget() -> None:
    async def handler(ctx: TurnContext) -> TurnOutcome:
        sent = [ctx.stream({"delta": "abcdefghij"}) for _ in range(50)]
        return {"messages": [{"role": "assistant", "content": {"sent": sent}}]}

    async def scenario() -> None:
        async with worker_with(handler) as (_, daemon):  # an older daemon: no stream_turn_bytes
            await daemon.send(turn_start(turn_ref(), 1))
            result = await daemon.recv("turn_result")
            assert result["messages"][0]["content"]["sent"] == [True] * 50

    run(scenario())


def test_turn_stream_closed_stops_the_turns_stream(caplog: pytest.LogCaptureFixture) -> None:
    ref, other = turn_ref(), turn_ref()

    async def handler(ctx: TurnContext) -> TurnOutcome:
        sent = [ctx.stream("a")]
        async for _ in ctx.steer:  # the test steers once turn_stream_closed is out
            break
        sent += [ctx.stream("b"), ctx.stream("c")]
        return {"messages": [{"role": "assistant", "content": {"sent": sent}}]}

    async def scenario() -> None:
        async with worker_with(handler, capacity=2) as (_, daemon):
            await daemon.send(turn_start(ref, 1))
            await daemon.send(turn_start(other, 2))
            await daemon.recv("turn_chunk")
            await daemon.recv("turn_chunk")
            # for the first turn only; a closing for an unknown delivery changes nothing
            await daemon.send({"v": 1, "type": "turn_stream_closed", "turn_ref": ref, "reason": "turn_limit", "limit_bytes": 10})
            await daemon.send(
                {"v": 1, "type": "turn_stream_closed", "turn_ref": turn_ref(), "reason": "turn_limit", "limit_bytes": 10}
            )
            for r in (ref, other):
                await daemon.send({"v": 1, "type": "turn_steer", "turn_ref": {**r, "revision": 1}, "input": "go"})
            results = {}
            for _ in range(2):
                m = await daemon.recv("turn_result")
                results[m["turn_ref"]["delivery_id"]] = m["messages"][0]["content"]["sent"]
            assert results[ref["delivery_id"]] == [True, False, False]
            assert results[other["delivery_id"]] == [True, True, True]

    with caplog.at_level(logging.WARNING, logger="corral_worker"):
        run(scenario())
    assert sum("stream budget spent" in r.getMessage() for r in caplog.records) == 1


def test_a_chunk_above_stream_chunk_bytes_is_not_sent() -> None:
    async def handler(ctx: TurnContext) -> TurnOutcome:
        sent = [ctx.stream("x" * 600), ctx.stream("small")]
        return {"messages": [{"role": "assistant", "content": {"sent": sent}}]}

    async def scenario() -> None:
        async with worker_with(handler, stream_chunk_bytes=500) as (_, daemon):
            await daemon.send(turn_start(turn_ref(), 1))
            result = await daemon.recv("turn_result")
            assert result["messages"][0]["content"]["sent"] == [False, True]
            assert [c["seq"] for c in daemon.of_type("turn_chunk")] == [1]

    run(scenario())


def test_bad_frames_and_unknown_types_are_logged_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    async def handler(ctx: TurnContext) -> TurnOutcome:
        return {"messages": [{"role": "assistant", "content": "fine"}]}

    async def scenario() -> None:
        async with worker_with(handler) as (worker, daemon):
            for bad in (b"\xff", b"[]", b'{"v":2,"type":"turn_start"}', frame({"v": 1, "type": "turn_future", "x": 1})):
                await daemon.send(bad)
            await daemon.send(frame({**turn_start(turn_ref(), 1), "attempt": "one"}))  # a bad turn_start is not run
            assert daemon.peer is not None
            await daemon.sock.send_multipart([daemon.peer, b"{}", b"{}"])  # two frames
            ref = turn_ref()
            await daemon.send(turn_start(ref, 1))
            result = await daemon.recv("turn_result")
            assert result["turn_ref"] == ref and worker.in_flight == 0
            assert len(daemon.of_type("turn_result")) + len(daemon.of_type("turn_error")) == 1

    with caplog.at_level(logging.DEBUG, logger="corral_worker"):
        run(scenario())
    text = "\n".join(f"{r.getMessage()} {getattr(r, 'corral', '')}" for r in caplog.records)
    assert "ignoring daemon message of unknown type" in text and "turn_future" in text
    assert "not valid UTF-8" in text and "unsupported protocol version" in text and "2 frames" in text and "attempt" in text


def test_over_capacity_is_handed_back_and_a_resent_start_accepted_again() -> None:
    release = asyncio.Event()

    async def handler(ctx: TurnContext) -> TurnOutcome:
        await release.wait()
        return {"messages": [{"role": "assistant", "content": "done"}]}

    async def scenario() -> None:
        async with worker_with(handler, capacity=1) as (_, daemon):
            ref, extra = turn_ref(), turn_ref()
            await daemon.send(turn_start(ref, 1))
            assert (await daemon.recv("turn_accepted"))["turn_ref"] == ref
            await daemon.send(turn_start(ref, 1))  # a re-send: accepted again, not run twice
            assert (await daemon.recv("turn_accepted"))["turn_ref"] == ref
            await daemon.send(turn_start(extra, 1))
            err = await daemon.recv("turn_error")
            assert err["turn_ref"] == extra and err["error"]["code"] == "over_capacity" and err["error"]["retryable"] is True
            release.set()
            assert (await daemon.recv("turn_result"))["turn_ref"] == ref

    run(scenario())


def test_the_welcomes_lower_capacity_is_the_one_run() -> None:
    async def handler(ctx: TurnContext) -> TurnOutcome:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def scenario() -> None:
        daemon2 = FakeDaemon()
        w = Worker(handler, endpoint=daemon2.endpoint, insecure=True, worker_id="fake-2", capacity=4, start_timeout_s=5)
        started = asyncio.ensure_future(w.start())
        try:
            await daemon2.welcome(capacity=1)
            await started
            assert w.capacity == 1
            await daemon2.send(turn_start(turn_ref(), 1))
            await daemon2.recv("turn_accepted")
            await daemon2.send(turn_start(turn_ref(), 2))
            assert (await daemon2.recv("turn_error"))["error"]["code"] == "over_capacity"
        finally:
            await w.stop(drain=False)
            daemon2.close()

    run(scenario())


def test_outcomes_the_daemon_would_refuse_become_turn_errors() -> None:
    async def handler(ctx: TurnContext) -> TurnOutcome:
        kind = ctx.event.data
        if kind == "no messages":
            return {"output": 1}  # type: ignore[typeddict-item]
        if kind == "nul":
            return {"messages": [{"role": "assistant", "content": "a\x00b"}]}
        if kind == "role":
            return {"messages": [{"role": "user", "content": "x"}]}
        if kind == "huge":
            return {"messages": [{"role": "assistant", "content": "x" * 2_000_000}]}
        if kind == "emit":
            return {"messages": [], "emit": [{"actor": "not-a-key", "data": 1}]}
        if kind == "fatal":
            raise NonRetryableError("no", code="my_code")
        raise ValueError("plain failure")

    expected = {
        "no messages": ("invalid_result", False),
        "nul": ("unstorable_result", True),
        "role": ("invalid_result", False),
        "huge": ("result_too_large", False),
        "emit": ("emit_limit", True),
        "fatal": ("my_code", False),
        "plain": ("handler_error", True),
    }

    async def scenario() -> None:
        async with worker_with(handler, capacity=8) as (_, daemon):
            refs = {}
            for kind in expected:
                ref = turn_ref()
                refs[ref["delivery_id"]] = kind
                await daemon.send(turn_start(ref, kind))
            got = {}
            for _ in expected:
                err = await daemon.recv("turn_error")
                got[refs[err["turn_ref"]["delivery_id"]]] = (err["error"]["code"], err["error"]["retryable"])
            assert got == expected

    run(scenario())


def test_ctx_emit_and_deliver_check_their_arguments() -> None:
    async def handler(ctx: TurnContext) -> TurnOutcome:
        errors = []
        for call in (
            lambda: ctx.emit("no-slash", 1),
            lambda: ctx.emit("a/b", 1, delay_ms=-1),
            lambda: ctx.deliver("bad sink!", 1),
            lambda: ctx.deliver("s", 1, key="has space"),
        ):
            try:
                call()
            except ValueError as e:
                errors.append(str(e))
        ctx.emit("a/b", {"n": 1}, delay_ms=5)
        ctx.deliver("s", {"n": 2}, key="k1")
        try:
            ctx.deliver("s", {"n": 3}, key="k1")
        except ValueError as e:
            errors.append(str(e))
        return {"messages": [{"role": "assistant", "content": errors}]}

    async def scenario() -> None:
        async with worker_with(handler) as (_, daemon):
            await daemon.send(turn_start(turn_ref(), 1))
            result = await daemon.recv("turn_result")
            assert len(result["messages"][0]["content"]) == 5
            assert result["emit"] == [{"actor": "a/b", "data": {"n": 1}, "delay_ms": 5}]
            assert result["deliver"] == [{"sink": "s", "body": {"n": 2}, "key": "k1"}]

    run(scenario())


def test_a_stop_before_the_welcome_ends_serve_quietly() -> None:
    async def handler(ctx: TurnContext) -> TurnOutcome:
        return {"messages": []}

    async def scenario() -> None:
        daemon = FakeDaemon()  # it never welcomes
        worker = Worker(handler, endpoint=daemon.endpoint, insecure=True, worker_id="fake-3", start_timeout_s=None)
        try:
            serving = asyncio.ensure_future(worker.serve(handle_signals=False))
            await daemon.recv("worker_ready")
            await worker.stop()
            await asyncio.wait_for(serving, 5)  # returns, does not raise
            assert worker.state == "stopped"
        finally:
            daemon.close()

    run(scenario())


def test_start_times_out_without_a_welcome() -> None:
    async def handler(ctx: TurnContext) -> TurnOutcome:
        return {"messages": []}

    async def scenario() -> None:
        daemon = FakeDaemon()
        worker = Worker(handler, endpoint=daemon.endpoint, insecure=True, worker_id="fake-4", start_timeout_s=0.3)
        try:
            with pytest.raises(StartTimeoutError, match="no welcome from the daemon"):
                await worker.start()
            assert worker.state == "stopped"
        finally:
            daemon.close()

    run(scenario())
