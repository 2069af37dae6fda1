"""Turns end to end: a real daemon, a Python worker process over CURVE (key proof included), the
daemon's own CLI as the judge of what committed. One daemon and one worker for the module."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import subprocess
import threading
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Iterator

import pytest

from conftest import CORRAL_JS, FAST_DAEMON_ENV, REPO, Stack, WorkerProcess, wait_for


# small stream limits, for the stream budget (chunks at most 4 KiB, 8 KiB of them per attempt)
STREAM_BUDGET_ENV = {"CORRAL_STREAM_CHUNK_BYTES": "4096", "CORRAL_STREAM_TURN_BYTES": "8192"}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    s = Stack({**FAST_DAEMON_ENV, **STREAM_BUDGET_ENV})
    try:
        s.daemon.start()
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def worker(stack: Stack) -> Iterator[WorkerProcess]:
    key = stack.corral.add_worker_key("py-main")
    w = stack.worker(key, "--capacity", "8", name="py-main")
    w.wait_registered()
    yield w
    assert w.stop() == 0


def actor(name: str) -> str:
    return f"py-{name}/{uuid.uuid4().hex[:12]}"


def test_registers_with_the_key_proof(stack: Stack, worker: WorkerProcess) -> None:
    # the daemon registers a CURVE worker only after a right key proof (protocol section 13)
    status = stack.corral.json("status")
    ours = [w for w in status["workers"] if w["workerId"] == "py-main"]
    assert ours, status["workers"]
    assert '"msg": "registered with daemon"' in worker.log()


def test_a_turn_commits(stack: Stack, worker: WorkerProcess) -> None:
    a = actor("echo")
    event = stack.corral.send(a, {"text": "hello"})
    reply = stack.corral.reply(a, event)
    assert reply["text"] == "echo: hello"
    assert reply["attempt"] == 1
    turn = stack.corral.turn_of(a, event)
    assert turn is not None and [m["role"] for m in turn["messages"]] == ["user", "assistant"]


def test_streaming_is_seen_by_a_watcher(stack: Stack, worker: WorkerProcess) -> None:
    a = actor("stream")
    watch = subprocess.Popen(
        [stack.corral.node, str(CORRAL_JS), "watch", a, "--json", "--once"],
        env=stack.corral.env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # held past the watcher's start, so it sees the turn live however slowly node starts
        event = stack.corral.send(a, {"text": "s", "stream": 5, "stream_ms": 300})
        out, err = watch.communicate(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert watch.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    chunks = [e["data"] for e in events if e["type"] == "chunk"]
    assert [c["seq"] for c in chunks] == [1, 2, 3, 4, 5]
    deltas = [c["data"]["delta"] for c in chunks]
    assert deltas == ["w1 ", "w2 ", "w3 ", "w4 ", "w5 "], events
    assert events[-1]["type"] == "turn_committed"
    reply = stack.corral.reply(a, event)
    assert reply["stream_sent"] == [True] * 5


def test_stream_stops_at_the_daemons_stream_budget(stack: Stack, worker: WorkerProcess) -> None:
    # the module's daemon relays at most 8192 bytes of chunk frames per attempt (STREAM_BUDGET_ENV)
    welcomes = [json.loads(line) for line in worker.log().splitlines() if '"msg": "registered with daemon"' in line]
    if not welcomes or welcomes[-1].get("stream_turn_bytes") is None:
        pytest.skip("this daemon's worker_welcome has no stream_turn_bytes yet (the SDK side is tested in test_unit.py)")
    assert welcomes[-1]["stream_turn_bytes"] == 8192
    a = actor("budget")
    event = stack.corral.send(a, {"text": "b", "stream": 60, "stream_ms": 0})
    sent = stack.corral.reply(a, event)["stream_sent"]
    k = sent.index(False)
    assert 0 < k < 60 and sent == [True] * k + [False] * (60 - k), sent
    assert worker.log().count("stream budget spent") == 1


def test_steering_reaches_the_handler(stack: Stack, worker: WorkerProcess) -> None:
    a = actor("steer")
    event = stack.corral.send(a, {"text": "wait", "wait_steer": True})
    wait_for(lambda: worker.mark(event, "started"), 30, "the turn to start")
    stack.corral.run("steer", a, json.dumps({"more": "context"}))
    reply = stack.corral.reply(a, event)
    assert reply["steered"] == {"more": "context"}
    assert reply["revision"] == 1  # the result carried the steered turn_ref
    turn = stack.corral.turn_of(a, event)
    assert turn is not None and turn["revision"] == 1


def test_cancellation_raises_cancelled_error_in_the_handler(stack: Stack, worker: WorkerProcess) -> None:
    a = actor("cancel")
    event = stack.corral.send(a, {"text": "long", "wait_cancel": True})
    wait_for(lambda: worker.mark(event, "started"), 30, "the turn to start")
    stack.corral.run("cancel", a, "--reason", "changed my mind")
    reason = wait_for(lambda: worker.mark(event, "cancelled"), 30, "the handler to get CancelledError")
    assert reason  # ctx.signal.reason, set before the CancelledError
    turn = wait_for(lambda: stack.corral.turn_of(a, event, "cancelled"), 30, "the turn to be recorded cancelled", interval=0.3)
    assert [m["role"] for m in turn["messages"]] == ["user"]
    # the worker took another turn after it: the slot was freed
    nxt = stack.corral.send(a, {"text": "after"})
    assert stack.corral.reply(a, nxt)["text"] == "echo: after"


def test_rpc_reads_the_whole_history(stack: Stack, worker: WorkerProcess) -> None:
    a = actor("history")
    for i in range(3):
        stack.corral.reply(a, stack.corral.send(a, {"text": f"m{i}"}))
    event = stack.corral.send(a, {"text": "h", "history": True})
    reply = stack.corral.reply(a, event)
    # three committed turns of two messages each, paged back two at a time over history.read
    assert reply["history_total"] == 6
    assert reply["history_seqs"] == [1, 2, 3, 4, 5, 6]
    assert reply["context_count"] == 6  # ctx.history: the context sent with turn_start
    assert reply["status_messages"] == 6  # actor.status


def test_emit_enqueues_an_event_with_the_commit(stack: Stack, worker: WorkerProcess) -> None:
    a, target = actor("emit"), actor("emit-target")
    event = stack.corral.send(a, {"text": "e", "emit": {"actor": target, "data": {"text": "emitted"}}})
    stack.corral.reply(a, event)
    turn = stack.corral.turn_of(a, event)
    assert turn is not None and len(turn["emitted"]) == 1
    assert turn["emitted"][0]["actor"] == target
    emitted_id = turn["emitted"][0]["event_id"]
    assert stack.corral.reply(target, emitted_id)["text"] == "echo: emitted"


class _Receiver(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        self.received.append({"headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_deliver_posts_a_signed_webhook_after_the_commit(stack: Stack, worker: WorkerProcess) -> None:
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        # a receiver on this host: the sink must allow private addresses
        secret = stack.corral.run("sinks", "add", "pyhooks", "--url", url, "--allow-private").stdout.strip()
        a = actor("deliver")
        key = f"py-{uuid.uuid4().hex}"
        event = stack.corral.send(a, {"text": "d", "deliver": {"sink": "pyhooks", "key": key}})
        stack.corral.reply(a, event)
        # the webhook-id names the actor: <agent_uid>/<session_id>/<key>
        webhook_id = f"{a}/{key}"
        got = wait_for(lambda: [r for r in _Receiver.received if r["headers"].get("webhook-id") == webhook_id], 30, "the webhook")
        req = got[0]
        assert json.loads(req["body"]) == {"text": "echo: d", "actor": a}
        assert req["headers"].get("corral-actor") == a
        assert req["headers"].get("corral-key") == key
        # Standard Webhooks: v1,<base64 HMAC-SHA256 of id.timestamp.body>, keyed by the secret's bytes
        raw = base64.b64decode(secret.removeprefix("whsec_"))
        signed = f"{webhook_id}.{req['headers']['webhook-timestamp']}.".encode() + req["body"]
        expected = base64.b64encode(hmac.new(raw, signed, hashlib.sha256).digest()).decode()
        assert f"v1,{expected}" in req["headers"]["webhook-signature"].split(" ")
    finally:
        server.shutdown()
        server.server_close()


def test_a_non_retryable_error_dead_letters_at_once(stack: Stack, worker: WorkerProcess) -> None:
    a = actor("fatal")
    event = stack.corral.send(a, {"text": "x", "fail": "fatal"})

    def dead() -> Any:
        letters = stack.corral.json("dlq", "list", "--actor", a)["deadLetters"]
        return letters or None

    letters = wait_for(dead, 30, "the event to be dead-lettered", interval=0.3)
    assert len(letters) == 1 and letters[0]["eventId"] == event
    # one attempt, with the handler's code: dead-lettered on it, not retried (retries are left)
    assert letters[0]["attempts"] == 1, letters[0]
    assert letters[0]["lastError"]["error"]["code"] == "py_fatal", letters[0]
    attempts = stack.corral.json("dlq", "show", letters[0]["id"])["attempts"]
    assert [(t["attempt"], t["status"]) for t in attempts] == [(1, "failed")], attempts
    assert worker.mark(event, "started") == "1"


def test_progress_extends_the_lease_of_a_long_turn(stack: Stack, worker: WorkerProcess) -> None:
    # the daemon's lease is 1.5 s; the turn takes 4 s and commits on its first attempt only
    # because turn_progress (every 300 ms) extends it
    a = actor("long")
    event = stack.corral.send(a, {"text": "slow", "sleep_ms": 4000})
    reply = stack.corral.reply(a, event, timeout=60)
    assert reply["attempt"] == 1
    turns = stack.corral.turns(a)
    assert [t["status"] for t in turns] == ["succeeded"], turns
