"""Request bodies read as strict JSON (RFC 8259): every body that cannot be read is a 400 naming ``body``.

Python's ``json.loads`` would take ``NaN``/``Infinity`` and turn ``1e400`` into infinity (both then stored as
null), raises a plain ValueError for an integer of more than 4,300 digits (``sys.int_max_str_digits``), and
recurses once per nesting level, and keeps the last of an object's duplicate names (which a reader of the
same body elsewhere may take differently: I-JSON, RFC 7493 section 2.3, forbids them). :func:`read_json_body`
is the resolver's body parser; :func:`unreadable_body` refuses, before routing, a body that is not UTF-8 or
nests deeper than :data:`MAX_JSON_DEPTH`.
"""

from __future__ import annotations

import base64
import json
import math
import sys
from collections.abc import Mapping
from typing import Any

#: Deepest JSON nesting accepted in a body (Python's parser recurses; no Duetime body needs more than ~6).
MAX_JSON_DEPTH = 32


class _NotJsonNumber(ValueError):
    """A body that parses but is not strict JSON."""


def _refuse_constant(name: str) -> Any:
    raise _NotJsonNumber(f"{name} is not a JSON number (RFC 8259 section 6)")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NotJsonNumber(f"{text[:40]} is too large for a 64-bit float")
    return value


def _bounded_int(text: str) -> int:
    limit = sys.get_int_max_str_digits()  # 4,300 unless the interpreter was told otherwise; 0 = no limit
    if limit and len(text.lstrip("-")) > limit:
        # int() would raise a ValueError whose hint (sys.set_int_max_str_digits) is for Python programmers
        raise _NotJsonNumber(f"a number has more than {limit:,} digits")
    return int(text)


def _unique_names(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    names: dict[str, Any] = {}
    for name, value in pairs:
        if name in names:
            raise _NotJsonNumber(f"the name {name[:40]!r} appears twice in one object (RFC 7493 section 2.3)")
        names[name] = value
    return names


def read_json_body(text: str) -> Any:
    """The resolver's JSON parser: strict JSON, every unreadable body a ``JSONDecodeError`` saying why (a
    number JSON cannot hold exactly or of more than 4,300 digits, a name twice in one object)."""
    try:
        return json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            parse_int=_bounded_int,
            object_pairs_hook=_unique_names,
        )
    except json.JSONDecodeError:
        raise
    except _NotJsonNumber as exc:
        raise json.JSONDecodeError(str(exc), text[:100], 0) from None


def unreadable_body(event: Mapping[str, Any]) -> str | None:
    """Why the body cannot be read as JSON (not UTF-8, nested too deep), or None if the parser may try."""
    body = event.get("body")
    if not body:
        return None
    raw: bytes | str = base64.b64decode(body) if event.get("isBase64Encoded") else body
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except (UnicodeDecodeError, ValueError):
        return "the request body is not UTF-8 text"
    if nesting_depth(text) > MAX_JSON_DEPTH:
        return f"the request body nests deeper than {MAX_JSON_DEPTH} levels"
    return None


def nesting_depth(text: str) -> int:
    """The deepest ``[``/``{`` nesting of ``text``, without recursion: brackets outside strings are counted."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def as_json(event: Mapping[str, Any]) -> dict[str, Any]:
    """The API speaks only JSON: a body is read as JSON whatever its declared content type (curl -d sends a
    form type by default), and a base64-encoded body is decoded."""
    out = dict(event)
    headers = out.get("headers") or {}
    if out.get("body") and not headers.get("content-type", "").startswith("application/json"):
        out["headers"] = {**headers, "content-type": "application/json"}
    if out.get("isBase64Encoded") and out.get("body"):
        out.update(body=base64.b64decode(out["body"]).decode("utf-8"), isBase64Encoded=False)
    return out
