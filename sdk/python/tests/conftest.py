"""Real parts for the integration tests: a corral daemon started from this repository
(``node bin/corral.js daemon``, a fresh temporary CORRAL_HOME, no DATABASE_URL: an embedded real
PostgreSQL), worker keys from ``corral keys``, and workers as real processes running the console
script. Conditions are polled with deadlines (:func:`wait_for`), never slept on; every process a
test starts is stopped (SIGTERM, then waited for) when it ends."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, TypeVar

import pytest

TESTS = Path(__file__).resolve().parent
SDK_ROOT = TESTS.parent
SDK_SRC = SDK_ROOT / "src"
REPO = SDK_ROOT.parent.parent
CORRAL_JS = REPO / "bin" / "corral.js"

# the package under test is this checkout's (src/), not one installed elsewhere
sys.path.insert(0, str(SDK_SRC))

T = TypeVar("T")


def wait_for(check: Callable[[], Optional[T]], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll ``check`` until it returns something other than None/False; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last_error: Optional[BaseException] = None
    while True:
        try:
            value = check()
            if value is not None and value is not False:
                return value
        except (AssertionError, subprocess.CalledProcessError, ValueError, KeyError) as e:
            last_error = e
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what}" + (f" (last: {last_error})" if last_error else "")
            )
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: the tests start the daemon with `node bin/corral.js` (Node >= 22.12)")
    out = subprocess.run([node, "-p", "process.versions.node"], capture_output=True, text=True, check=True).stdout.strip()
    major, minor = (int(x) for x in out.split(".")[:2])
    if (major, minor) < (22, 12):
        pytest.fail(f"node {out} on PATH is older than 22.12, which corral needs")
    if not (REPO / "node_modules").is_dir():
        pytest.fail(f"{REPO}/node_modules is missing: run npm ci first")
    return node


class Corral:
    """``node bin/corral.js`` against one CORRAL_HOME (no DATABASE_URL: its embedded PostgreSQL)."""

    def __init__(self, home: Path, env: Optional[dict[str, str]] = None) -> None:
        self.home = home
        self.node = _node()
        self.env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith("CORRAL_")}
        self.env.update({"CORRAL_HOME": str(home), "CORRAL_LOG_LEVEL": "info", **(env or {})})

    def run(
        self, *args: str, check: bool = True, timeout: float = 60, input: Optional[str] = None
    ) -> "subprocess.CompletedProcess[str]":
        p = subprocess.run(
            [self.node, str(CORRAL_JS), *args],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
        )
        if check and p.returncode != 0:
            raise AssertionError(f"corral {' '.join(args)} exited {p.returncode}: {p.stderr.strip()[:2000]}")
        return p

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "--json").stdout)

    def send(self, actor: str, data: Any) -> str:
        return self.run("send", actor, json.dumps(data)).stdout.strip()

    def add_worker_key(self, worker_id: str, **opts: str) -> Path:
        path = self.home / f"{worker_id}.key"
        extra = [x for k, v in opts.items() for x in (f"--{k}", v)]
        self.run("keys", "add-worker", worker_id, "--out", str(path), "--force", *extra)
        return path

    def turns(self, actor: str) -> list[dict[str, Any]]:
        turns: list[dict[str, Any]] = self.json("transcript", actor)["turns"]
        return turns

    def turn_of(self, actor: str, event_id: str, status: str = "succeeded") -> Optional[dict[str, Any]]:
        """The turn of ``event_id`` once it has ``status``, else None."""
        for t in self.turns(actor):
            if t["eventId"] == event_id and t["status"] == status:
                return t
        return None

    def reply(self, actor: str, event_id: str, timeout: float = 30) -> dict[str, Any]:
        """The assistant content of ``event_id``'s committed turn (waits for it)."""
        turn = wait_for(
            lambda: self.turn_of(actor, event_id), timeout, f"the turn of {event_id} to commit on {actor}", interval=0.3
        )
        content: dict[str, Any] = [m for m in turn["messages"] if m["role"] == "assistant"][-1]["content"]
        return content


class Daemon:
    """``corral daemon`` as a real process; SIGTERM stops it and the PostgreSQL it started."""

    READY = "corral daemon running"

    def __init__(self, corral: Corral, port: int, env: dict[str, str]) -> None:
        self.corral = corral
        self.port = port
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.env = env
        self.proc: Optional["subprocess.Popen[bytes]"] = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.corral.home / f"daemon-{self.starts}.log"

    def start(self, timeout: float = 120) -> None:
        self.starts += 1
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [self.corral.node, str(CORRAL_JS), "daemon", "--endpoint", self.endpoint],
            env={**self.corral.env, **self.env},
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        proc = self.proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"the daemon exited {proc.returncode}: {self.log_path.read_text()[-3000:]}")
            return self.READY in self.log_path.read_text(errors="replace")

        try:
            wait_for(ready, timeout, "the daemon to start", interval=0.2)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 60) -> Optional[int]:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return proc.returncode if proc else None
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            raise AssertionError(f"the daemon did not stop within {timeout} s of SIGTERM; killed")


class WorkerProcess:
    """``python -m corral_worker ... agents:handle``: the console script, a real process."""

    def __init__(
        self, home: Path, key_file: Path, endpoint: str, *extra: str, name: str = "worker", handler: str = "agents:handle"
    ) -> None:
        self.log_path = home / f"{name}.log"
        self.marks = home / "marks"
        self.marks.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        env["PYTHONPATH"] = os.pathsep.join([str(SDK_SRC), str(TESTS)])
        env["CORRAL_PY_TEST_MARKS"] = str(self.marks)
        log = open(self.log_path, "ab")
        self.args = [
            sys.executable,
            "-m",
            "corral_worker",
            "--key-file",
            str(key_file),
            "--endpoint",
            endpoint,
            "--log-level",
            "debug",
            *extra,
            handler,
        ]
        self.proc = subprocess.Popen(self.args, env=env, cwd=TESTS, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def registrations(self) -> int:
        return self.log().count('"msg": "registered with daemon"')

    def wait_registered(self, count: int = 1, timeout: float = 30) -> None:
        def ok() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the worker exited {self.proc.returncode}: {self.log()[-3000:]}")
            return self.registrations() >= count

        wait_for(ok, timeout, f"the worker to register ({count})")

    def mark(self, event_id: str, what: str) -> Optional[str]:
        p = self.marks / f"{event_id}.{what}"
        return p.read_text() if p.exists() else None

    def wait_exit(self, timeout: float) -> int:
        """The exit code; fails with the log's tail when the process is still running after ``timeout``."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the worker still runs after {timeout:g} s: {self.log()[-3000:]}") from None

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
                raise AssertionError(f"the worker did not stop within {timeout} s of SIGTERM; killed")
        return self.proc.returncode


class Stack:
    """A daemon on a fresh CORRAL_HOME, and the processes tests start against it."""

    def __init__(self, daemon_env: dict[str, str]) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="corral-py-"))
        self.corral = Corral(self.home)
        self.daemon = Daemon(self.corral, free_port(), daemon_env)
        self.workers: list[WorkerProcess] = []

    @property
    def endpoint(self) -> str:
        return self.daemon.endpoint

    def worker(self, key_file: Path, *extra: str, name: str = "worker", handler: str = "agents:handle") -> WorkerProcess:
        w = WorkerProcess(self.home, key_file, self.endpoint, *extra, name=name, handler=handler)
        self.workers.append(w)
        return w

    def close(self) -> None:
        errors: list[str] = []
        for w in self.workers:
            try:
                w.stop()
            except AssertionError as e:
                errors.append(str(e))
        try:
            self.daemon.stop()
        except AssertionError as e:
            errors.append(str(e))
        # the daemon stops the embedded PostgreSQL it started; one left running is a leak
        pid_file = self.home / "pg" / "data" / "postmaster.pid"
        if pid_file.exists():
            self.corral.run("db", "stop", check=False)
            errors.append("the embedded PostgreSQL was still running after the daemon stopped")
        shutil.rmtree(self.home, ignore_errors=True)
        if errors:
            raise AssertionError("; ".join(errors))


# A short lease, so that a turn longer than it commits only if progress extends it; progress
# well within it, as the SDK warns otherwise.
FAST_DAEMON_ENV = {
    "CORRAL_LEASE_MS": "1500",
    "CORRAL_PROGRESS_INTERVAL_MS": "300",
    "CORRAL_WORKER_HEARTBEAT_MS": "500",
    "CORRAL_RETRY_DELAY_S": "1",
    "CORRAL_POLL_INTERVAL_MS": "200",
}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    s = Stack(FAST_DAEMON_ENV)
    try:
        s.daemon.start()
        yield s
    finally:
        s.close()
