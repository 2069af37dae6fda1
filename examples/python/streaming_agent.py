"""A streaming agent: streams its reply word by word (as a model's tokens would come), takes
steering input between words, and commits the whole reply.

    corral keys add-worker py-stream --out py-stream.key
    corral-worker --key-file py-stream.key streaming_agent:handle
    corral watch demo/s2 &                          # see the words arrive
    corral send demo/s2 '{"text": "tell me a story"}'
    corral steer demo/s2 '{"text": "shorter, please"}'   # while it streams

A real agent puts its model call where ``fake_model`` is: each delta goes to ``ctx.stream``, and
the assistant message of the result is the whole reply (chunks are not part of the transcript).
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from corral_worker import ConversationMessage, JsonValue, TurnContext, TurnOutcome


async def fake_model(prompt: JsonValue, history: tuple[ConversationMessage, ...]) -> AsyncIterator[str]:
    words = f"you said {prompt!r}, after {len(history)} earlier messages; here is a long answer".split()
    for word in words:
        await asyncio.sleep(0.1)  # the model thinking; a cancel interrupts it here
        yield word + " "


async def handle(ctx: TurnContext) -> TurnOutcome:
    reply: list[str] = []
    async for delta in fake_model(ctx.event.data, ctx.history):
        for steer in ctx.steer.drain():  # steering input that came meanwhile
            reply.append(f"[steered: {steer}] ")
        reply.append(delta)
        if not ctx.stream({"delta": delta}):
            ctx.logger.debug("stream closed; the reply still commits whole")
    return {"messages": [{"role": "assistant", "content": {"text": "".join(reply)}}]}
