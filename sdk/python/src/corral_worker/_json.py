"""JSON on the wire: the value type, the codec of one frame, and the shape limits of
docs/protocol.md section 4 (depth, what PostgreSQL's jsonb cannot store). Every walk here is
iterative, so no value, however deep, can exhaust the stack."""

from __future__ import annotations

import json
import math
from typing import Union

JsonValue = Union[None, bool, int, float, str, list["JsonValue"], dict[str, "JsonValue"]]
"""Any JSON value, as :func:`json.loads` returns it."""

JsonObject = dict[str, JsonValue]

MAX_JSON_DEPTH = 100
"""The most levels of nested arrays and objects in a value the daemon takes (``[[1]]`` has 2)."""

_SAFE_INT = 2**53 - 1


class FrameError(ValueError):
    """A frame that is not one UTF-8 JSON object."""


def _no_constant(name: str) -> float:
    # NaN, Infinity and -Infinity are not JSON (RFC 8259); Python's parser takes them by default
    raise FrameError(f"{name} is not JSON")


def decode_object(frame: bytes) -> JsonObject:
    """The JSON object a frame holds; raises :class:`FrameError` otherwise. Never anything else."""
    try:
        text = frame.decode("utf-8")
    except UnicodeDecodeError:
        raise FrameError("payload is not valid UTF-8") from None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except FrameError:
        raise
    except RecursionError:
        raise FrameError("payload is nested too deep to parse") from None
    except ValueError as e:
        raise FrameError(f"payload is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise FrameError("payload is not a JSON object")
    return value


def encode(value: object) -> bytes:
    """One frame's bytes: compact JSON in UTF-8, as ``JSON.stringify`` would write it.

    Raises ``ValueError`` (or ``TypeError``) for what is not JSON: NaN, infinities, objects of
    other types, a lone surrogate (which UTF-8 cannot encode), or nesting past the recursion
    limit."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return text.encode("utf-8")
    except RecursionError:
        raise ValueError("value is nested too deep to encode") from None
    except UnicodeEncodeError:
        raise ValueError("value holds a lone UTF-16 surrogate, which JSON in UTF-8 cannot carry") from None


def is_json(value: object) -> bool:
    """True when ``value`` is a JSON value: None, bool, str, a finite int/float, lists and
    str-keyed dicts of those."""
    stack: list[object] = [value]
    while stack:
        v = stack.pop()
        if v is None or isinstance(v, (bool, str)):
            continue
        if isinstance(v, int):
            continue
        if isinstance(v, float):
            if not math.isfinite(v):
                return False
            continue
        if isinstance(v, list):
            stack.extend(v)
            continue
        if isinstance(v, dict):
            for k, item in v.items():
                if not isinstance(k, str):
                    return False
                stack.append(item)
            continue
        return False
    return True


def _bad_string(s: str) -> str | None:
    if "\x00" in s:
        return "a string holds NUL (\\u0000), which PostgreSQL cannot store"
    for ch in s:
        if "\ud800" <= ch <= "\udfff":
            return "a string holds a lone UTF-16 surrogate"
    return None


def unstorable_reason(value: object, path: str = "$", max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why the daemon would refuse ``value`` (docs/protocol.md section 4): not JSON, nested deeper
    than ``max_depth``, or holding what jsonb cannot keep; with the path of the first offender.
    None when it is fine."""
    stack: list[tuple[object, int, str]] = [(value, 0, path)]
    while stack:
        v, depth, where = stack.pop()
        if isinstance(v, str):
            why = _bad_string(v)
            if why:
                return f"{where}: {why}"
        elif v is None or isinstance(v, bool):
            pass
        elif isinstance(v, int):
            if abs(v) > 1.7976931348623157e308:
                return f"{where}: number out of range for JSON"
        elif isinstance(v, float):
            if not math.isfinite(v):
                return f"{where}: number out of range for JSON ({v})"
        elif isinstance(v, (list, dict)):
            if depth + 1 > max_depth:
                return f"{where}: nested deeper than {max_depth} levels"
            if isinstance(v, list):
                for i in range(len(v) - 1, -1, -1):
                    stack.append((v[i], depth + 1, f"{where}[{i}]"))
            else:
                items = list(v.items())
                for k, item in reversed(items):
                    if not isinstance(k, str):
                        return f"{where}: an object key is not a string ({type(k).__name__})"
                    why = _bad_string(k)
                    if why:
                        return f"{where}: key: {why}"
                    stack.append((item, depth + 1, f"{where}.{k}"))
        else:
            return f"{where}: {type(v).__name__} is not a JSON value"
    return None


def is_int(value: object, lo: int = -_SAFE_INT, hi: int = _SAFE_INT) -> bool:
    """A JSON integer within [lo, hi] (never a bool; ``3.0`` counts, as JSON does not tell them apart)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        if not value.is_integer():
            return False
        value = int(value)
    return isinstance(value, int) and lo <= value <= hi
