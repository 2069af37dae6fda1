"""The ``corral-worker`` console script: run an async handler as a corral worker.

    corral-worker --key-file w1.key [--endpoint tcp://daemon:5555] [--capacity 32] [--id ID] module:handler

Exit codes: 0 stopped (drained after SIGINT/SIGTERM), 1 unexpected error, 2 bad arguments,
3 key file missing or invalid, 4 handler cannot be imported or is not an async function,
5 refused by the daemon (key, registration, CURVE), 6 no welcome within --start-timeout.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import logging
import os
import sys
from typing import Any, Optional, Sequence, cast

from . import __version__
from .errors import ConfigError, KeyFileError, RefusedError, StartTimeoutError
from .log import LOGGER_NAME, JsonFormatter, TextFormatter
from .turn import Handler
from .worker import Worker

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_KEY = 3
EXIT_HANDLER = 4
EXIT_REFUSED = 5
EXIT_TIMEOUT = 6

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"
DEFAULT_CAPACITY = 32

EPILOG = """\
environment (flags win): CORRAL_ENDPOINT, CORRAL_WORKER_KEY_FILE.

exit codes: 0 stopped after SIGINT/SIGTERM (the first drains: running turns finish and
commit; a second forces), 1 unexpected error, 2 bad arguments, 3 key file missing or
invalid, 4 handler cannot be imported, 5 refused by the daemon, 6 no welcome in time.

examples:
  corral-worker --key-file w1.key agent:handle
  corral-worker --key-file w1.key --endpoint tcp://daemon:5555 --capacity 8 my_pkg.agents:support
"""


class HandlerImportError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own exits 2 too; say where help is
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"corral-worker: error: {message}\n(see corral-worker --help)\n")


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 1 <= n <= 1024:
        raise argparse.ArgumentTypeError(f"expected an integer in 1..1024, got {n}")
    return n


def _seconds(text: str) -> float:
    try:
        s = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not s >= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text}")
    return s


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="corral-worker",
        description="Run an async Python handler as a corral worker: each turn the daemon gives it runs handler(ctx).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "handler", metavar="module:handler", help="the handler to run, e.g. agent:handle (the current folder is importable)"
    )
    p.add_argument(
        "--key-file",
        metavar="FILE",
        help="the key file from `corral keys add-worker ID --out FILE` (default CORRAL_WORKER_KEY_FILE)",
    )
    p.add_argument("--endpoint", metavar="URL", help=f"the daemon's endpoint (default CORRAL_ENDPOINT or {DEFAULT_ENDPOINT})")
    p.add_argument(
        "--capacity",
        type=_positive_int,
        default=DEFAULT_CAPACITY,
        metavar="N",
        help=f"turns run at once, 1..1024 (default {DEFAULT_CAPACITY})",
    )
    p.add_argument(
        "--id",
        dest="worker_id",
        metavar="ID",
        help="the worker id: with a key file it may only repeat the file's; required with --insecure",
    )
    p.add_argument("--insecure", action="store_true", help="no CURVE and no key: only for a daemon started with --insecure")
    p.add_argument(
        "--drain-timeout",
        type=_seconds,
        default=10.0,
        metavar="S",
        help="on SIGINT/SIGTERM, how long running turns may finish (default 10)",
    )
    p.add_argument(
        "--start-timeout",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="how long to wait for the daemon's welcome, 0 = forever (default 30)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="default info")
    p.add_argument("--log-format", default="json", choices=["json", "text"], help="JSON lines (default) or text, on stderr")
    p.add_argument("--version", action="version", version=f"corral-worker {__version__}")
    return p


def load_handler(spec: str) -> Handler:
    """``module:attr`` (attr may be dotted) as an async callable; raises :class:`HandlerImportError`."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise HandlerImportError(f"handler {spec!r} is not of the form module:handler (e.g. agent:handle)")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: object = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise HandlerImportError(f"cannot import module {module_name!r}: {e}") from None
    except BaseException as e:  # noqa: BLE001 - the module's own code failed at import time
        raise HandlerImportError(f"importing module {module_name!r} failed: {type(e).__name__}: {e}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise HandlerImportError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise HandlerImportError(f"{spec} is not callable (it is a {type(obj).__name__})")
    if not (inspect.iscoroutinefunction(obj) or inspect.iscoroutinefunction(getattr(obj, "__call__", None))):
        raise HandlerImportError(f"{spec} is not an async function: define it with `async def handler(ctx)`")
    return cast(Handler, obj)


def _setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    log = logging.getLogger(LOGGER_NAME)
    log.handlers[:] = [handler]
    log.setLevel(level.upper())
    log.propagate = False


def _fail(code: int, message: str) -> int:
    print(f"corral-worker: {message}", file=sys.stderr)
    return code


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level, args.log_format)
    endpoint = args.endpoint or os.environ.get("CORRAL_ENDPOINT") or DEFAULT_ENDPOINT
    key_file = args.key_file or os.environ.get("CORRAL_WORKER_KEY_FILE") or None
    if args.insecure and args.key_file:
        return _fail(EXIT_USAGE, "--insecure uses no key: give --insecure or --key-file, not both")
    if not args.insecure and key_file is None:
        return _fail(
            EXIT_USAGE,
            "no key file: give --key-file FILE (from `corral keys add-worker ID --out FILE`) or set CORRAL_WORKER_KEY_FILE",
        )
    try:
        handler = load_handler(args.handler)
    except HandlerImportError as e:
        return _fail(EXIT_HANDLER, str(e))
    try:
        worker = Worker(
            handler,
            endpoint=endpoint,
            key_file=None if args.insecure else key_file,
            worker_id=args.worker_id,
            insecure=args.insecure,
            capacity=args.capacity,
            drain_timeout_s=args.drain_timeout,
            start_timeout_s=args.start_timeout or None,
        )
    except KeyFileError as e:
        return _fail(EXIT_KEY, str(e))
    except ConfigError as e:
        return _fail(EXIT_USAGE, str(e))
    try:
        worker.run()
    except RefusedError as e:
        return _fail(EXIT_REFUSED, f"{e.code}: {e}")
    except StartTimeoutError as e:
        return _fail(EXIT_TIMEOUT, str(e))
    except KeyboardInterrupt:  # pragma: no cover - the signal handler takes SIGINT once running
        return EXIT_OK
    except Exception as e:  # noqa: BLE001
        logging.getLogger(LOGGER_NAME).exception("worker failed")
        return _fail(EXIT_ERROR, f"unexpected error: {type(e).__name__}: {e}")
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
