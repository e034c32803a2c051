"""Values as JSON data: everything a bounded call may carry round-trips; nothing else is accepted, and
decoding never builds a class it was not given or runs a method of the data's choosing."""

import datetime
import decimal
import json
import random

import pytest

from trace_gym.environments.sandbox import values


class Node:
    def __init__(self, name: str, parent: "Node | None" = None) -> None:
        self.name, self.parent, self.children = name, parent, {}
        if parent is not None:
            parent.children[name] = self


class Loud:
    def __setstate__(self, state) -> None:  # pragma: no cover - must never run
        raise AssertionError("decoding ran __setstate__")

    def __init__(self) -> None:  # pragma: no cover - must never run when decoding
        raise AssertionError("decoding ran __init__")


def roundtrip(value, classes=()):
    return values.decode(json.loads(json.dumps(values.encode(value, classes))), classes)


def test_plain_data_round_trips_with_its_types() -> None:
    rng = random.Random(7)
    value = {"a": [1, 2.5, None, True, "x"], (1, "k"): (b"\x00\xff", {3, 4}, frozenset({"z"})), 5: {},
             "when": datetime.datetime(2024, 1, 2, 3, 4, 5), "day": datetime.date(2024, 1, 2),
             "at": datetime.time(1, 2), "span": datetime.timedelta(days=2, seconds=3), "d": decimal.Decimal("1.10"),
             "rng": rng}
    back = roundtrip(value)
    assert back["rng"].random() == random.Random(7).random()
    del value["rng"], back["rng"]
    assert back == value and type(back[(1, "k")]) is tuple and type(back[(1, "k")][2]) is frozenset


def test_objects_of_named_classes_keep_shared_references_and_cycles() -> None:
    root = Node("/")
    child = Node("a", root)
    back = roundtrip({"root": root, "cwd": child}, (Node,))
    assert back["cwd"] is back["root"].children["a"] and back["cwd"].parent is back["root"]


def test_an_object_of_a_class_not_named_cannot_be_sent_or_received() -> None:
    with pytest.raises(ValueError, match="classes="):
        values.encode(Node("/"))
    data = values.encode(Node("/"), (Node,))
    with pytest.raises(ValueError, match="may not travel"):
        values.decode(data)


@pytest.mark.parametrize("data", [
    {"o": 0, "c": "os:system", "a": {}},
    {"o": 0, "c": "builtins:eval", "a": {}},
    {"o": 0, "c": "subprocess:Popen", "a": {"args": "touch x"}},
    {"l": [{"r": 3}]},
    {"d": [[{"o": 0, "c": "tests.environments.sandbox.test_values:Node", "a": {}}, 1]]},
    {"s": [{"l": []}]},
    {"unknown": 1},
    {"b": "not base64!"},
    {"rng": {"t": [3, "x"]}},
    ["a bare list"],
])
def test_malformed_or_hostile_data_is_refused(data) -> None:
    with pytest.raises((ValueError, TypeError)):
        values.decode(data, (Node,))


def test_decoding_runs_no_method_of_the_class() -> None:
    obj = values.decode({"o": 0, "c": values.class_name(Loud), "a": {"x": 1}}, (Loud,))
    assert type(obj) is Loud and obj.x == 1


@pytest.mark.parametrize("value", [len, Node, json, lambda: 1, object(), bytearray(b"x")])
def test_code_and_unknown_types_cannot_be_encoded(value) -> None:
    with pytest.raises(ValueError, match="cannot travel"):
        values.encode([value])
