"""Structured logging through :mod:`logging`: every record of the SDK carries its fields
(``worker_id``, ``delivery_id``, ``event_id``, ``epoch``, ...) as attributes of the record and in
``record.corral`` (a dict), so a JSON formatter can print them; :class:`JsonFormatter` does."""

from __future__ import annotations

import json
import logging
import time
from typing import Any, MutableMapping

LOGGER_NAME = "corral_worker"

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "corral"}


class FieldsAdapter(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A logger with fixed fields; fields given per call (``extra=``) are merged in, not dropped
    (the stdlib adapter of Python < 3.13 replaces them)."""

    def __init__(self, logger: logging.Logger, fields: dict[str, object]) -> None:
        super().__init__(logger, fields)
        self.fields = fields

    def child(self, **fields: object) -> "FieldsAdapter":
        return FieldsAdapter(self.logger, {**self.fields, **fields})

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        given = kwargs.get("extra") or {}
        merged = {**self.fields, **given}
        # a field named like a LogRecord attribute (message, msg, args, ...) would make logging
        # raise: such fields stay in record.corral only
        kwargs["extra"] = {**{k: v for k, v in merged.items() if k not in _STANDARD}, "corral": merged}
        return msg, kwargs


def sdk_logger(base: logging.Logger | None, **fields: object) -> FieldsAdapter:
    return FieldsAdapter(base or logging.getLogger(LOGGER_NAME), dict(fields))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (ms since the epoch), ``level``, ``logger``, ``msg``,
    the record's fields, and ``err`` for an exception."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": int(record.created * 1000),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "corral", None)
        if isinstance(fields, dict):
            out.update(fields)
        else:
            out.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            out["err"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``HH:MM:SS level msg key=value ...`` for a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "corral", None)
        tail = ""
        if isinstance(fields, dict) and fields:
            tail = " " + " ".join(f"{k}={v}" for k, v in fields.items())
        line = f"{time.strftime('%H:%M:%S', time.localtime(record.created))} {record.levelname.lower():7} {record.getMessage()}{tail}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line
