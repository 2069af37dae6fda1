"""A scripted daemon for in-process tests: a real ZeroMQ ROUTER (no CURVE) that the test drives
message by message, to send what a real daemon does not (yet) send: bad frames, unknown types,
``turn_stream_closed``, a welcome with ``stream_turn_bytes``."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any, Optional, Union

import zmq
import zmq.asyncio


def turn_ref(**over: Any) -> dict[str, Any]:
    ref: dict[str, Any] = {
        "agent_uid": "fake",
        "session_id": "s1",
        "activation_uid": str(uuid.uuid4()),
        "actor_epoch": 1,
        "event_id": str(uuid.uuid4()),
        "revision": 0,
        "delivery_id": str(uuid.uuid4()),
    }
    ref.update(over)
    return ref


def turn_start(ref: dict[str, Any], data: Any) -> dict[str, Any]:
    return {
        "v": 1,
        "type": "turn_start",
        "turn_ref": ref,
        "event": {"id": ref["event_id"], "data": data, "enqueued_at": "2026-01-01T12:00:00.000Z"},
        "attempt": 1,
        "lease_expires_at": "2026-01-01T12:01:00.000Z",
    }


class FakeDaemon:
    def __init__(self) -> None:
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.peer: Optional[bytes] = None
        self.seen: list[dict[str, Any]] = []
        self.frames: list[bytes] = []

    async def recv(self, type_: Optional[str] = None, timeout: float = 5.0) -> dict[str, Any]:
        """The next message (of ``type_``, skipping others, which stay in ``seen``)."""

        async def loop() -> dict[str, Any]:
            while True:
                rid, payload = await self.sock.recv_multipart()
                self.peer = rid
                self.frames.append(payload)
                msg: dict[str, Any] = json.loads(payload)
                self.seen.append(msg)
                if type_ is None or msg["type"] == type_:
                    return msg

        return await asyncio.wait_for(loop(), timeout)

    async def send(self, msg: Union[dict[str, Any], bytes]) -> None:
        assert self.peer is not None, "no worker has spoken yet"
        frame = msg if isinstance(msg, bytes) else json.dumps(msg).encode()
        await self.sock.send_multipart([self.peer, frame])

    async def welcome(self, **extra: Any) -> dict[str, Any]:
        ready = await self.recv("worker_ready")
        await self.send(
            {
                "v": 1,
                "type": "worker_welcome",
                "worker_id": ready["worker_id"],
                "heartbeat_interval_ms": 2000,
                "progress_interval_ms": 10000,
                **extra,
            }
        )
        return ready

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        return [m for m in self.seen if m["type"] == type_]

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()
