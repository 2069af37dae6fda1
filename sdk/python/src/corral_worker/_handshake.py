"""A failed CURVE handshake reaches the worker as a socket event only, never as a message
(docs/protocol.md section 13, "When the handshake fails"). :class:`HandshakeWatch` logs each and
says when a refusal is certain:

- ``HANDSHAKE_FAILED_AUTH``: the daemon's ZAP handler refused the key (not on the allow-list, or
  at a connection limit). libzmq does not retry it; the worker does, after its backoff. Certain at
  the third in a row: a daemon reads its allow-list again at most every 50 ms for unknown keys,
  so a key issued a moment ago may be refused once.
- ``HANDSHAKE_FAILED_PROTOCOL``: one side runs CURVE, the other not. Certain at once.
- ``HANDSHAKE_FAILED_NO_DETAIL``: what a wrong daemon public key (``server_key``) looks like;
  libzmq retries it forever. A CURVE mismatch shows a few of them before its protocol error, so
  only five in a row over at least two seconds count.
A handshake that succeeds starts every count again. Also the reconnect backoff and routing ids.
"""

from __future__ import annotations

import random
import secrets
import time
from typing import Optional

import zmq

from .errors import RefusedError
from .log import FieldsAdapter

KEY_REFUSALS = 3
SERVER_KEY_FAILURES = 5
SERVER_KEY_WINDOW_S = 2.0

MONITORED_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_DISCONNECTED
)


def backoff_delay_s(attempt: int, base_s: float = 0.1, max_s: float = 5.0, rand: Optional[float] = None) -> float:
    """Equal jitter: uniform in [c/2, c], c = min(max, base * 2^(attempt-1))."""
    n = max(1, attempt)
    ceiling = min(max_s, base_s * float(1 << min(n - 1, 30)))
    r = random.random() if rand is None else rand
    return ceiling / 2 + ceiling / 2 * r


def fresh_routing_id() -> bytes:
    """128 random bits as hex, never starting with the zero byte libzmq reserves."""
    return b"c" + secrets.token_hex(16).encode("ascii")


class HandshakeWatch:
    def __init__(self, log: FieldsAdapter, worker_id: str, endpoint: str) -> None:
        self.log = log
        self.worker_id = worker_id
        self.endpoint = endpoint
        self.succeeded()

    def succeeded(self) -> None:
        self.key_refusals = 0
        self.no_detail = 0
        self.no_detail_since = 0.0
        self.logged = False
        self.server_key_reported = False

    def failed(self, event: int, value: int) -> Optional[RefusedError]:
        """Log one failed handshake; the refusal when it is certain now."""
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            self.key_refusals += 1
            self.log.error(
                "the daemon refused this worker's key (not on its allow-list, or at its connection limit per key or in all?)",
                extra={"status": value, "refusals": self.key_refusals},
            )
            if self.key_refusals != KEY_REFUSALS:
                return None
            return RefusedError(
                f"the daemon at {self.endpoint} refused the key of worker {self.worker_id}: it is not on the daemon's "
                "allow-list (unknown, or revoked), or the key is at its connection limit",
                code="key_refused",
            )
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            self.no_detail = 0  # the failures before it were this mismatch's greetings crossing
            if not self.logged:
                self.log.error("handshake failed: the daemon and this worker disagree on CURVE (one of them insecure?)")
            self.logged = True
            return RefusedError(
                f"the daemon at {self.endpoint} and worker {self.worker_id} disagree on CURVE: "
                "one of them runs without it (--insecure)",
                code="curve_mismatch",
            )
        if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            if not self.logged:
                self.log.error("handshake failed without detail (the daemon's public key, server_key, wrong?); retrying")
            self.logged = True
            now = time.monotonic()
            if self.no_detail == 0:
                self.no_detail_since = now
            self.no_detail += 1
            if (
                self.server_key_reported
                or self.no_detail < SERVER_KEY_FAILURES
                or now - self.no_detail_since < SERVER_KEY_WINDOW_S
            ):
                return None
            self.server_key_reported = True
            message = (
                f"the CURVE handshake of worker {self.worker_id} with {self.endpoint} failed {self.no_detail} times in a "
                "row without detail: the daemon's public key (server_key) is not the key of the daemon there"
            )
            self.log.error(message)
            return RefusedError(message, code="server_key_mismatch")
        return None
