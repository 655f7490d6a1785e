"""Host side of the value protocol: decode what a job reported and compare it with the expected value.

The job encodes each test value with `sandbox.harness.encode` into JSON where every JSON object is a type
tag ({"$t": [...]} tuple, {"$d": [[k, v], ...]} dict, ...); plain lists, strings, numbers, booleans and null
stand for themselves. Decoding is strict: anything else is a protocol violation, never a guess.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

_SPECIAL_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
MAX_DEPTH = 100


class ProtocolError(ValueError):
    """The result stream is not something our harness would have written."""


def decode(node: Any, depth: int = 0) -> Any:
    """Tagged JSON (already parsed with json.loads) -> plain Python value."""
    if depth > MAX_DEPTH:
        raise ProtocolError("value nested too deeply")
    if node is None or isinstance(node, (bool, int, str)):
        return node
    if isinstance(node, float):
        return node
    if isinstance(node, list):
        return [decode(x, depth + 1) for x in node]
    if not isinstance(node, dict) or len(node) != 1:
        raise ProtocolError(f"malformed value node {type(node).__name__}")
    ((tag, body),) = node.items()
    if tag == "$f":
        if body not in _SPECIAL_FLOATS:
            raise ProtocolError(f"bad float {body!r}")
        return _SPECIAL_FLOATS[body]
    if tag == "$c":
        if not (isinstance(body, list) and len(body) == 2):
            raise ProtocolError("bad complex")
        re_, im = (decode(x, depth + 1) for x in body)
        if not all(isinstance(x, float) for x in (re_, im)):
            raise ProtocolError("bad complex parts")
        return complex(re_, im)
    if tag == "$b":
        if not isinstance(body, str):
            raise ProtocolError("bad bytes")
        try:
            return base64.b64decode(body.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raise ProtocolError("bad base64") from None
    if not isinstance(body, list):
        raise ProtocolError(f"tag {tag!r} needs a list body")
    try:
        if tag == "$t":
            return tuple(decode(x, depth + 1) for x in body)
        if tag == "$s":
            return {decode(x, depth + 1) for x in body}
        if tag == "$fs":
            return frozenset(decode(x, depth + 1) for x in body)
        if tag == "$d":
            out = {}
            for pair in body:
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise ProtocolError("bad dict item")
                out[decode(pair[0], depth + 1)] = decode(pair[1], depth + 1)
            return out
    except TypeError:  # unhashable set element / dict key: a real Python value cannot look like that
        raise ProtocolError("unhashable set element or dict key") from None
    raise ProtocolError(f"unknown tag {tag!r}")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, complex)


def values_equal(expected: Any, actual: Any, rel_tol: float | None = None, abs_tol: float | None = None) -> bool:
    """Python `==` semantics on plain values, with two deliberate departures.

    - An expected *list* also matches an actual tuple of equal items: tests written as JSON cannot express
      tuples. An expected tuple still does not match a list, exactly as `assert f() == (1, 2)` would fail.
    - With rel_tol/abs_tol, floats compare with math.isclose, recursively through containers.
    Both sides are plain decoded values, never candidate objects, so `==` here runs no candidate code.
    """
    tolerant = rel_tol is not None or abs_tol is not None
    if isinstance(expected, (list, tuple)):
        if isinstance(expected, tuple) and not isinstance(actual, tuple):
            return False
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return False
        return all(values_equal(e, a, rel_tol, abs_tol) for e, a in zip(expected, actual))
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or len(actual) != len(expected):
            return False
        for key, value in expected.items():
            if key not in actual or not values_equal(value, actual[key], rel_tol, abs_tol):
                return False
        return True
    if isinstance(actual, (list, tuple, dict)):
        return False
    floats = isinstance(expected, float) or isinstance(actual, float)
    if tolerant and floats and _is_number(expected) and _is_number(actual):
        if math.isnan(expected) or math.isnan(actual):
            return False
        return math.isclose(
            expected,
            actual,
            rel_tol=rel_tol if rel_tol is not None else 1e-9,
            abs_tol=abs_tol if abs_tol is not None else 0.0,
        )
    try:
        return bool(expected == actual)
    except Exception:
        return False


# Expected values in files and HTTP bodies are plain JSON; what JSON cannot express is written as a
# one-key object with one of these keys (so `assert f() == (1, 2)` survives a round trip through JSON).
_TAGS = ("__tuple__", "__set__", "__frozenset__", "__dict__", "__bytes__", "__complex__", "__float__")


def to_json(value: Any) -> Any:
    """Python value -> plain JSON, with `{"__tuple__": [...]}`-style objects for tuples, sets, frozensets,
    non-string-keyed dicts, bytes, complex numbers and non-finite floats."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {"__float__": "nan" if value != value else ("inf" if value > 0 else "-inf")}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    if isinstance(value, tuple):
        return {"__tuple__": [to_json(v) for v in value]}
    if isinstance(value, (set, frozenset)):
        items = [to_json(v) for v in value]
        try:
            items = sorted(items)
        except TypeError:
            pass
        return {"__frozenset__" if isinstance(value, frozenset) else "__set__": items}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not (len(value) == 1 and next(iter(value)) in _TAGS):
            return {k: to_json(v) for k, v in value.items()}
        return {"__dict__": [[to_json(k), to_json(v)] for k, v in value.items()]}
    if isinstance(value, bytes):
        return {"__bytes__": base64.b64encode(value).decode("ascii")}
    if isinstance(value, complex):
        return {"__complex__": [to_json(value.real), to_json(value.imag)]}
    raise ValueError(f"cannot express a {type(value).__name__} as an expected value")


def from_json(node: Any, depth: int = 0) -> Any:
    """Inverse of to_json; raises ValueError on a malformed tag."""
    if depth > MAX_DEPTH:
        raise ValueError("expected value nested too deeply")
    if isinstance(node, list):
        return [from_json(v, depth + 1) for v in node]
    if not isinstance(node, dict):
        return node
    if len(node) == 1:
        ((tag, body),) = node.items()
        if tag in _TAGS:
            try:
                if tag == "__float__":
                    return _SPECIAL_FLOATS[body]
                if tag == "__bytes__":
                    return base64.b64decode(body.encode("ascii"), validate=True)
                items = [from_json(v, depth + 1) for v in body]
                if tag == "__tuple__":
                    return tuple(items)
                if tag == "__set__":
                    return set(items)
                if tag == "__frozenset__":
                    return frozenset(items)
                if tag == "__complex__":
                    return complex(*items)
                return {_hashable(k): v for k, v in items}  # __dict__: [[key, value], ...]
            except (KeyError, TypeError, ValueError, AttributeError, binascii.Error) as exc:
                raise ValueError(f"malformed {tag} value: {exc}") from None
    return {k: from_json(v, depth + 1) for k, v in node.items()}


def _hashable(key: Any) -> Any:
    hash(key)  # TypeError for a list key: malformed
    return key


def short_repr(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
