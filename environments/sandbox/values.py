"""Python values as JSON data, for what bounded calls send and get back: a format that cannot carry code.

``encode(value, classes)`` turns a value into JSON-ready data; ``decode(data, classes)`` rebuilds it. Scalars
(None, bool, int, float, str) stand for themselves; everything else is a one-key object naming its kind:

    {"l": [...]} list   {"t": [...]} tuple   {"s": [...]} set   {"fs": [...]} frozenset   {"b": base64} bytes
    {"d": [[k, v], ...]} dict (any keys that are scalars or tuples of them)
    {"dt" | "date" | "time": ISO text}   {"td": [days, seconds, microseconds]}   {"dec": text} Decimal
    {"rng": state} random.Random   {"o": n, "c": "module:Name", "a": {attribute: value}} an object   {"r": n}
    the n-th object met again (shared references and cycles, as in a tree whose nodes point to their parent)

An object travels only if its class is in ``classes`` (given by whoever calls): it is rebuilt with
``object.__new__`` and its attributes are set in its ``__dict__``, so no ``__init__``, ``__setstate__``,
``__reduce__`` or any other code of the sender's choosing runs. Objects cannot be dict keys or set members (their
``__hash__`` would run on half-built data). Anything else (functions, classes, modules, other types) is a
``ValueError`` naming it.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import random
from typing import Any

_SCALARS = (type(None), bool, int, float, str)


def class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def encode(value: Any, classes: tuple[type, ...] = ()) -> Any:
    """JSON-ready data for ``value``; ``ValueError`` for a value that cannot travel."""
    allowed = {cls: class_name(cls) for cls in classes}
    seen: dict[int, int] = {}  # id of an object -> its number (the objects stay alive in ``value`` meanwhile)

    def walk(v: Any, hashable: bool = False) -> Any:
        t = type(v)
        if t in _SCALARS:
            return v
        if t is tuple:
            return {"t": [walk(x, hashable) for x in v]}
        if hashable:
            raise ValueError(f"a dict key or set member of type {t.__name__} cannot travel (scalars and tuples only)")
        if t is list:
            return {"l": [walk(x) for x in v]}
        if t is dict:
            return {"d": [[walk(k, True), walk(x)] for k, x in v.items()]}
        if t is set or t is frozenset:
            return {"s" if t is set else "fs": [walk(x, True) for x in v]}
        if t is bytes:
            return {"b": base64.b64encode(v).decode()}
        if t is datetime.datetime:
            return {"dt": v.isoformat()}
        if t is datetime.date:
            return {"date": v.isoformat()}
        if t is datetime.time:
            return {"time": v.isoformat()}
        if t is datetime.timedelta:
            return {"td": [v.days, v.seconds, v.microseconds]}
        if t is decimal.Decimal:
            return {"dec": str(v)}
        if t is random.Random:
            return {"rng": walk(v.getstate())}
        if t in allowed and hasattr(v, "__dict__"):
            if id(v) in seen:
                return {"r": seen[id(v)]}
            seen[id(v)] = n = len(seen)
            return {"o": n, "c": allowed[t], "a": {str(k): walk(x) for k, x in vars(v).items()}}
        raise ValueError(f"a value of type {t.__module__}.{t.__qualname__} cannot travel; fix: return plain data, "
                         "or name its class in classes=")

    return walk(value)


def decode(data: Any, classes: tuple[type, ...] = ()) -> Any:
    """The value ``data`` describes; ``ValueError`` for anything malformed or a class not in ``classes``."""
    allowed = {class_name(cls): cls for cls in classes}
    objects: dict[int, Any] = {}

    def items(x: Any) -> list[Any]:
        if not isinstance(x, list):
            raise ValueError("expected a list")
        return x

    def walk(d: Any, hashable: bool = False) -> Any:
        if type(d) in _SCALARS:
            return d
        if not isinstance(d, dict) or not d:
            raise ValueError(f"unexpected {type(d).__name__} in the data")
        if "t" in d:
            return tuple(walk(x, hashable) for x in items(d["t"]))
        if hashable:
            raise ValueError("only scalars and tuples may be dict keys or set members")
        if "l" in d:
            return [walk(x) for x in items(d["l"])]
        if "d" in d:
            out = {}
            for pair in items(d["d"]):
                if not isinstance(pair, list) or len(pair) != 2:
                    raise ValueError("a dict item is not a pair")
                out[walk(pair[0], True)] = walk(pair[1])
            return out
        if "s" in d or "fs" in d:
            members = [walk(x, True) for x in items(d.get("s", d.get("fs")))]
            return set(members) if "s" in d else frozenset(members)
        if "b" in d:
            return base64.b64decode(_text(d["b"]), validate=True)
        if "dt" in d:
            return datetime.datetime.fromisoformat(_text(d["dt"]))
        if "date" in d:
            return datetime.date.fromisoformat(_text(d["date"]))
        if "time" in d:
            return datetime.time.fromisoformat(_text(d["time"]))
        if "td" in d:
            days, seconds, micro = (int(x) for x in items(d["td"]))
            return datetime.timedelta(days, seconds, micro)
        if "dec" in d:
            return decimal.Decimal(_text(d["dec"]))
        if "rng" in d:
            rng = random.Random()
            rng.setstate(walk(d["rng"]))
            return rng
        if "r" in d:
            if d["r"] not in objects:
                raise ValueError("a reference to an object not met before")
            return objects[d["r"]]
        if "o" in d:
            cls = allowed.get(d.get("c"))  # type: ignore[arg-type]
            if cls is None:
                raise ValueError(f"an object of class {str(d.get('c'))[:100]!r}, which may not travel here")
            attributes = d.get("a")
            if not isinstance(attributes, dict) or not isinstance(d["o"], int) or d["o"] in objects:
                raise ValueError("a malformed object")
            obj: Any = object.__new__(cls)
            objects[d["o"]] = obj  # before its attributes: they may point back to it
            obj.__dict__.update({str(k): walk(x) for k, x in attributes.items()})
            return obj
        raise ValueError(f"unknown kind {next(iter(d))[:20]!r}")

    return walk(data)


def _text(x: Any) -> str:
    if not isinstance(x, str):
        raise ValueError("expected text")
    return x
