"""The handler the integration tests run in real worker processes (``corral-worker agents:handle``).

Driven by the event's data, like the TypeScript example worker. What the handler saw that the
daemon cannot show (it started, it got a CancelledError) it writes as marker files
``<event_id>.<what>`` under ``$CORRAL_PY_TEST_MARKS``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from corral_worker import JsonValue, NonRetryableError, TurnContext, TurnOutcome


def mark(ctx: TurnContext, what: str, text: str = "") -> None:
    folder = os.environ.get("CORRAL_PY_TEST_MARKS")
    if folder:
        Path(folder, f"{ctx.event.id}.{what}").write_text(text)


async def handle(ctx: TurnContext) -> TurnOutcome:
    data = ctx.event.data
    rec: dict[str, Any] = data if isinstance(data, dict) else {}
    mark(ctx, "started", str(ctx.attempt))
    content: dict[str, JsonValue] = {"text": f"echo: {rec.get('text', data)}", "attempt": ctx.attempt}

    if "stream" in rec:
        sent: list[JsonValue] = []
        for i in range(int(rec["stream"])):
            sent.append(ctx.stream({"delta": f"w{i + 1} "}))
            await asyncio.sleep(float(rec.get("stream_ms", 20)) / 1000)
        content["stream_sent"] = sent
    if rec.get("wait_steer"):
        async for steer in ctx.steer:
            content["steered"] = steer
            break
    if rec.get("wait_cancel"):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            mark(ctx, "cancelled", ctx.signal.reason or "")
            raise
    if "sleep_ms" in rec:
        await asyncio.sleep(float(rec["sleep_ms"]) / 1000)
    if rec.get("history"):
        whole = await ctx.all_history(page_size=2)
        status = await ctx.actor_status()
        content["history_total"] = len(whole)
        content["history_seqs"] = [m["seq"] for m in whole]
        content["context_count"] = len(ctx.history)
        content["status_messages"] = status.get("messages")
    if "emit" in rec:
        ctx.emit(str(rec["emit"]["actor"]), rec["emit"]["data"])
    if "deliver" in rec:
        ctx.deliver(str(rec["deliver"]["sink"]), {"text": content["text"], "actor": ctx.actor}, key=rec["deliver"].get("key"))
    if rec.get("fail") == "fatal":
        raise NonRetryableError("asked to fail for good", code="py_fatal")
    if rec.get("fail") == "retry":
        raise RuntimeError("asked to fail, retryable")
    content["revision"] = ctx.turn_ref["revision"]
    return {"messages": [{"role": "assistant", "content": content}]}
