"""Typed errors of the SDK. Each carries a stable string ``code`` (match on it, not on the class,
across processes) and, where it matters, a ``retryable`` flag."""

from __future__ import annotations


class CorralWorkerError(Exception):
    """Base class of every error this package raises on its own."""

    code: str = "internal"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class ConfigError(CorralWorkerError):
    """An option that cannot work (a bad capacity, an id that is not the key's, ...)."""

    code = "invalid_argument"


class KeyFileError(ConfigError):
    """The worker key file is missing, unreadable or not a ``corral-worker-key/1`` file.
    The message never contains the file's secret content."""

    code = "invalid_config"


class RefusedError(CorralWorkerError):
    """The daemon refused this worker (docs/protocol.md section 13, "When the handshake fails").

    ``code`` is one of ``key_refused`` (the key is not on the daemon's allow-list, or at its
    connection limit), ``server_key_mismatch`` (the key file's ``server_key`` is not that
    daemon's), ``curve_mismatch`` (one side runs without CURVE) or ``registration_refused``
    (the daemon answered ``worker_ready`` with ``unauthorized`` / ``identity_mismatch``).
    Retrying does not help: it is a configuration error."""

    code = "registration_refused"


class StartTimeoutError(CorralWorkerError):
    """No ``worker_welcome`` came within the start timeout: is the daemon running, and is this
    its endpoint?"""

    code = "timeout"


class RpcError(CorralWorkerError):
    """A worker RPC failed: ``code`` is the daemon's (``not_live``, ``busy``, ``timeout``,
    ``invalid_params``, ``unknown_method``, ``internal``) or the SDK's (``timeout`` when no
    answer came, ``worker_stopping``, ``invalid_params`` for params that are not JSON)."""

    code = "internal"


class TurnError(Exception):
    """Raise this from a handler to choose the ``turn_error`` the daemon gets.

    ``retryable=False`` dead-letters the event on this attempt (retrying cannot help);
    ``retryable=True`` (the default) lets the daemon retry it with backoff. Any other exception
    is reported as ``handler_error``, retryable, unless it has ``code`` / ``retryable``
    attributes of the right types, which are honoured the same way."""

    def __init__(self, message: str, *, code: str = "handler_error", retryable: bool = True) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable


class NonRetryableError(TurnError):
    """A :class:`TurnError` with ``retryable=False``: the event is dead-lettered at once."""

    def __init__(self, message: str, *, code: str = "handler_error") -> None:
        super().__init__(message, code=code, retryable=False)
