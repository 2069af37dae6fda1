"""An echo agent: answers each event with the text it was sent.

    corral keys add-worker py-echo --out py-echo.key
    corral-worker --key-file py-echo.key echo_agent:handle
    corral send demo/s1 '{"text": "hi"}'      # the transcript gets: echo: hi

Or run this file: python echo_agent.py py-echo.key [tcp://127.0.0.1:5555]
"""

from __future__ import annotations

import sys

from corral_worker import TurnContext, TurnOutcome, Worker


async def handle(ctx: TurnContext) -> TurnOutcome:
    data = ctx.event.data
    text = data.get("text", data) if isinstance(data, dict) else data
    ctx.logger.info("echoing", extra={"seen": len(ctx.history)})
    return {"messages": [{"role": "assistant", "content": {"text": f"echo: {text}", "seen": len(ctx.history)}}]}


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.INFO)
    if len(sys.argv) < 2:
        sys.exit("usage: python echo_agent.py KEY_FILE [ENDPOINT]")
    endpoint = sys.argv[2] if len(sys.argv) > 2 else "tcp://127.0.0.1:5555"
    Worker(handle, endpoint=endpoint, key_file=sys.argv[1], capacity=8).run()
