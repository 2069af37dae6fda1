"""The worker's life with a real daemon: refusals of a wrong key (clear errors, exit codes),
graceful drain on SIGTERM, reconnecting to a restarted daemon. Each test runs its own worker
process; the module's daemon is restarted by the last test."""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path

from conftest import Stack, wait_for

EXIT_REFUSED = 5


def _edited_key(src: Path, dst: Path, **fields: str) -> Path:
    data = json.loads(src.read_text())
    data.update(fields)
    dst.write_text(json.dumps(data))
    return dst


def test_a_revoked_key_is_refused_with_a_clear_error(stack: Stack) -> None:
    key = stack.corral.add_worker_key("py-revoked")
    stack.corral.run("keys", "revoke", "py-revoked")
    w = stack.worker(key, name="py-revoked")
    assert w.wait_exit(30) == EXIT_REFUSED
    out = w.log()
    assert "key_refused" in out and "not on the daemon's allow-list" in out, out[-2000:]


def test_a_wrong_token_is_refused_registration(stack: Stack) -> None:
    good = stack.corral.add_worker_key("py-token")
    key = _edited_key(good, stack.home / "py-token-bad.key", token="A" * 43)
    w = stack.worker(key, name="py-token")
    assert w.wait_exit(30) == EXIT_REFUSED
    out = w.log()
    assert "registration_refused" in out and "py-token" in out, out[-2000:]


def test_another_daemons_server_key_is_reported(stack: Stack) -> None:
    good = stack.corral.add_worker_key("py-server")
    # a valid CURVE public key that is not this daemon's: the worker's own public key
    other = json.loads(good.read_text())["public_key"]
    key = _edited_key(good, stack.home / "py-server-bad.key", server_key=other)
    w = stack.worker(key, name="py-server")
    assert w.wait_exit(30) == EXIT_REFUSED
    out = w.log()
    assert "server_key_mismatch" in out and "server_key" in out, out[-2000:]


def test_sigterm_drains_a_running_turn_then_exits_0(stack: Stack) -> None:
    key = stack.corral.add_worker_key("py-drain")
    w = stack.worker(key, name="py-drain")
    w.wait_registered()
    actor = f"py-drain/{uuid.uuid4().hex[:12]}"
    event = stack.corral.send(actor, {"text": "finish me", "sleep_ms": 2500})
    wait_for(lambda: w.mark(event, "started"), 30, "the turn to start")
    w.proc.send_signal(signal.SIGTERM)
    assert w.wait_exit(30) == 0, w.log()[-3000:]
    # it committed before the process went: no retry, no second attempt
    turn = stack.corral.turn_of(actor, event)
    assert turn is not None, stack.corral.turns(actor)
    assert len(stack.corral.turns(actor)) == 1
    assert '"msg": "SIGTERM: draining' in w.log()


def test_the_worker_reconnects_to_a_restarted_daemon(stack: Stack) -> None:
    key = stack.corral.add_worker_key("py-reconnect")
    w = stack.worker(key, name="py-reconnect")
    w.wait_registered()
    actor = f"py-reconnect/{uuid.uuid4().hex[:12]}"
    assert stack.corral.reply(actor, stack.corral.send(actor, {"text": "before"}))["text"] == "echo: before"
    assert stack.daemon.stop() == 0
    stack.daemon.start()
    # the same process, not restarted, registers again (a new challenge, a new proof)
    w.wait_registered(count=2, timeout=60)
    assert w.proc.poll() is None
    assert stack.corral.reply(actor, stack.corral.send(actor, {"text": "after"}))["text"] == "echo: after"
    assert "disconnected from daemon" in w.log()
