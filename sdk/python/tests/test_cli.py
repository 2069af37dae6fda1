"""The ``corral-worker`` console script as a subprocess: stdout, stderr and exit codes for bad
arguments, key files and handlers (no daemon needed: each fails before connecting)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SDK_SRC, TESTS

# a key file of the right shape (the zmq_curve(7) example keys); no daemon is asked
KEY = {
    "format": "corral-worker-key/1",
    "worker_id": "gpu-box-1",
    "public_key": "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID",
    "secret_key": "D:)Q[IlAW!ahhC2ac:9*A}h:p?([4%wOTJ%JR%cs",
    "server_key": "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7",
    "token": "WrOWxlgGgs9Nih_111IiTPnNwnos0g41Tsij_CDglQ8",
}


def run(*args: str, cwd: Path = TESTS) -> "subprocess.CompletedProcess[str]":
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(SDK_SRC), str(TESTS)])
    return subprocess.run(
        [sys.executable, "-m", "corral_worker", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=30
    )


@pytest.fixture()
def key_file(tmp_path: Path) -> Path:
    p = tmp_path / "w.key"
    p.write_text(json.dumps(KEY))
    return p


def test_help_lists_the_options() -> None:
    p = run("--help")
    assert p.returncode == 0
    for opt in ("--key-file", "--endpoint", "--capacity", "--id", "module:handler", "exit codes"):
        assert opt in p.stdout


def test_no_handler_is_a_usage_error() -> None:
    p = run("--key-file", "x.key")
    assert p.returncode == 2 and "module:handler" in p.stderr


@pytest.mark.parametrize("capacity", ["0", "2000", "many"])
def test_a_bad_capacity_is_a_usage_error(key_file: Path, capacity: str) -> None:
    p = run("--key-file", str(key_file), "--capacity", capacity, "agents:handle")
    assert p.returncode == 2 and "--capacity" in p.stderr


def test_no_key_file_is_a_usage_error() -> None:
    p = run("agents:handle")
    assert p.returncode == 2 and "--key-file" in p.stderr


def test_a_missing_key_file_exits_3(tmp_path: Path) -> None:
    p = run("--key-file", str(tmp_path / "nope.key"), "agents:handle")
    assert p.returncode == 3
    assert "does not exist" in p.stderr and "corral keys add-worker" in p.stderr


@pytest.mark.parametrize(
    "content, says",
    [
        ("not json", "not valid JSON"),
        (json.dumps({**KEY, "format": "x"}), "not a worker key file"),
        (json.dumps({**KEY, "secret_key": "short"}), "secret_key"),
        (json.dumps({**KEY, "worker_id": "bad id!"}), "worker_id"),
    ],
)
def test_a_bad_key_file_exits_3_without_showing_secrets(tmp_path: Path, content: str, says: str) -> None:
    p = tmp_path / "bad.key"
    p.write_text(content)
    r = run("--key-file", str(p), "agents:handle")
    assert r.returncode == 3 and says in r.stderr, r.stderr
    assert KEY["secret_key"] not in r.stderr and KEY["token"] not in r.stderr


def test_an_id_other_than_the_keys_is_a_usage_error(key_file: Path) -> None:
    p = run("--key-file", str(key_file), "--id", "someone-else", "agents:handle")
    assert p.returncode == 2 and "differs from the key file's worker id gpu-box-1" in p.stderr


@pytest.mark.parametrize(
    "spec, says",
    [
        ("no_such_module_xyz:handle", "cannot import module 'no_such_module_xyz'"),
        ("agents:no_such_handler", "has no attribute 'no_such_handler'"),
        ("agents", "not of the form module:handler"),
        ("agents:mark", "not an async function"),
        ("broken_agent:handle", "importing module 'broken_agent' failed: ZeroDivisionError"),
    ],
)
def test_a_handler_that_cannot_be_imported_exits_4(key_file: Path, tmp_path: Path, spec: str, says: str) -> None:
    (tmp_path / "broken_agent.py").write_text("1 / 0\n")
    r = run("--key-file", str(key_file), spec, cwd=tmp_path)
    assert r.returncode == 4 and says in r.stderr, r.stderr


def test_an_unreachable_daemon_times_out_with_exit_6(key_file: Path) -> None:
    # nothing listens there: no handshake ever, so no refusal, only the start timeout
    r = run("--key-file", str(key_file), "--endpoint", "tcp://127.0.0.1:9", "--start-timeout", "1", "agents:handle")
    assert r.returncode == 6 and "no welcome from the daemon at tcp://127.0.0.1:9 within 1 s" in r.stderr, r.stderr
