"""corral-worker: a Python worker SDK for corral, the durable actor runtime for long-lived
AI-agent sessions. See README.md; the wire protocol is docs/protocol.md of the corral repository.

::

    from corral_worker import Worker, TurnContext

    async def handle(ctx: TurnContext) -> TurnOutcome:
        ctx.stream({"delta": "thinking"})
        return {"messages": [{"role": "assistant", "content": {"text": "hello"}}]}

    Worker(handle, endpoint="tcp://daemon:5555", key_file="w1.key", capacity=8).run()
"""

__version__ = "0.1.0"

from ._json import JsonValue
from .errors import (
    ConfigError,
    CorralWorkerError,
    KeyFileError,
    NonRetryableError,
    RefusedError,
    RpcError,
    StartTimeoutError,
    TurnError,
)
from .keys import WorkerKey, parse_worker_key, read_worker_key
from .log import JsonFormatter, TextFormatter
from .protocol import Conversation, ConversationMessage, TurnEvent, TurnRef
from .turn import CancelSignal, Deliver, Emit, Handler, HistoryPage, SteerInbox, TurnContext, TurnOutcome
from .worker import SDK_NAME, Worker

__all__ = [
    "CancelSignal",
    "ConfigError",
    "Conversation",
    "ConversationMessage",
    "CorralWorkerError",
    "Deliver",
    "Emit",
    "Handler",
    "HistoryPage",
    "JsonFormatter",
    "JsonValue",
    "KeyFileError",
    "NonRetryableError",
    "RefusedError",
    "RpcError",
    "SDK_NAME",
    "StartTimeoutError",
    "SteerInbox",
    "TextFormatter",
    "TurnContext",
    "TurnError",
    "TurnEvent",
    "TurnOutcome",
    "TurnRef",
    "Worker",
    "WorkerKey",
    "__version__",
    "parse_worker_key",
    "read_worker_key",
]
