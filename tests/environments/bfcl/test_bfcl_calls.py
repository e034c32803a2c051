"""Decoding of model turns into BFCL calls: Hermes JSON, Python-call strings, hostile and malformed input."""

from __future__ import annotations

import keyword

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_gym.environments.bfcl.calls import BadCall, Call, decode, parse_ground_truth_call, to_python_call
from trace_gym.environments.bfcl.data import MULTI_TURN_CATEGORIES, load_entries

literals = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
# Python keywords (`in`, `if`) cannot be called or passed by keyword in a call string; BFCL names never are.
names = st.from_regex(r"[a-z_][a-z0-9_]{0,10}(\.[a-z_][a-z0-9_]{0,6})?", fullmatch=True).filter(
    lambda n: not any(keyword.iskeyword(part) for part in n.split(".")))


def test_python_call_list_decodes_names_keywords_and_positionals():
    decoded = decode("[cd(folder='document'), sort('a.txt'), ls(a=True), math.factorial(number=5)]")
    assert decoded.format == "python"
    assert decoded.items == (Call("cd", {"folder": "document"}), Call("sort", {}, ("a.txt",)),
                             Call("ls", {"a": True}), Call("math.factorial", {"number": 5}))


def test_hermes_blocks_decode_in_order_with_string_or_object_arguments():
    text = ('<tool_call>{"name": "cd", "arguments": {"folder": "x"}}</tool_call>\n'
            '<tool_call>{"name": "ls", "arguments": "{\\"a\\": true}"}</tool_call>')
    assert decode(text).items == (Call("cd", {"folder": "x"}), Call("ls", {"a": True}))


def test_plain_reply_has_no_call_attempt():
    for text in ["Done.", "I moved the file for you.", "", "[]", "Result: 42", "`ok`"]:
        assert decode(text).format == "none", text


def test_malformed_hermes_json_is_a_bad_call():
    decoded = decode('<tool_call>{"name": "cd", "arguments": {"folder": </tool_call>')
    assert decoded.format == "hermes" and len(decoded.errors) == 1 and not decoded.calls


def test_hostile_call_strings_are_bad_calls_not_executed(tmp_path):
    marker = tmp_path / "pwned"
    hostile = [
        f"[__import__('os').system('touch {marker}')]",
        f"[cd(folder=__import__('os').system('touch {marker}'))]",
        f"[open('{marker}', 'w').write('x')]",
        f"[ls(**{{'a': __import__('os').system('touch {marker}')}})]",
        f"[cd(folder=(lambda: __import__('os').system('touch {marker}'))())]",
        "[getattr(__builtins__, 'exec')('1')]",
    ]
    for text in hostile:
        decoded = decode(text)
        assert decoded.format == "python" and decoded.errors, text
        assert all(isinstance(i, BadCall) or i.name in ("open", "getattr") for i in decoded.items), text
    assert not marker.exists()


def test_every_ground_truth_call_string_decodes():
    for category in MULTI_TURN_CATEGORIES:
        for entry in load_entries(category):
            for turn in entry["ground_truth"]:
                for source in turn:
                    assert isinstance(parse_ground_truth_call(source), Call)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_decode_never_raises(text):
    decoded = decode(text)
    assert decoded.format in ("hermes", "python", "none")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(names, st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True).filter(
                                                     lambda k: not keyword.iskeyword(k)),
                                                 literals, max_size=3)), min_size=1, max_size=3))
def test_python_call_string_round_trips(calls):
    originals = [Call(name, args) for name, args in calls]
    decoded = decode("[" + ", ".join(to_python_call(c) for c in originals) + "]")
    assert decoded.items == tuple(originals)


def test_a_python_call_whose_string_holds_the_hermes_tag_stays_a_python_call():
    # found by the round-trip property: '<tool_call>' inside an argument once sent the turn to the hermes decoder
    decoded = decode("[f(a='<tool_call>')]")
    assert decoded.format == "python" and decoded.items == (Call("f", {"a": "<tool_call>"}),)
    assert decode('<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>').format == "hermes"


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "ls", "arguments": {"a": ' + "[" * 500 + "]" * 500 + "}}</tool_call>",
    "[ls(a=" + "[" * 90 + "]" * 90 + ")]",
    "[ls(a=0x" + "f" * 20000 + ")]",
    "[ls(0x" + "f" * 20000 + ")]",
])
def test_arguments_too_deep_or_too_long_to_print_are_bad_calls(text):
    (item,) = decode(text).items
    assert isinstance(item, BadCall) and ("nested deeper than" in item.error or "too long" in item.error)
