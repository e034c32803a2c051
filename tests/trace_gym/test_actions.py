import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_gym import ConfigError, HermesParser, TagParser, Tool, ToolCall


def _search(query: str) -> str:
    """Search the corpus."""
    return query


def _calc(a: int, b: int = 0) -> str:
    """Add."""
    return str(a + b)


TOOLS = {t.name: t for t in (Tool.from_function(_search, name="search"), Tool.from_function(_calc, name="calc"))}
ACTION_TEXT = st.one_of(
    st.text(max_size=300),
    st.lists(st.sampled_from(["<tool_call>", "</tool_call>", "<answer>", "</answer>", "<search>", "</search>",
                              '{"name": "calc", "arguments": {"a": 1}}', "{", "}", '"', "x", "\n", "null"]),
             max_size=30).map("".join),
)


def test_hermes_parses_several_calls_in_order():
    text = ('think <tool_call>{"name": "search", "arguments": {"query": "a"}}</tool_call>'
            '<tool_call>{"name": "calc", "arguments": "{\\"a\\": 2}"}</tool_call>')
    parsed = HermesParser().parse(text, TOOLS)
    assert parsed.error is None
    assert [(c.name, c.arguments) for c in parsed.calls] == [("search", {"query": "a"}), ("calc", {"a": 2})]


def test_hermes_reports_bad_json_as_error():
    parsed = HermesParser().parse('<tool_call>{"name": "calc", "arguments": {a: 1}}</tool_call>', TOOLS)
    assert parsed.calls == () and "not valid JSON" in parsed.error


def test_hermes_answer_only_turn():
    parsed = HermesParser().parse("so <answer> 42 </answer>", TOOLS)
    assert parsed.answer == "42" and parsed.calls == () and parsed.error is None


def test_hermes_rejects_call_and_answer_together():
    text = '<tool_call>{"name": "calc", "arguments": {"a": 1}}</tool_call><answer>1</answer>'
    assert "not both" in HermesParser().parse(text, TOOLS).error


def test_empty_action_is_an_error_for_both_parsers():
    assert HermesParser().parse("", TOOLS).error
    assert TagParser().parse("", TOOLS).error


def test_tag_parser_fills_the_single_string_argument_in_order():
    parsed = TagParser().parse("<search>who</search> then <search>where</search>", TOOLS)
    assert [c.arguments for c in parsed.calls] == [{"query": "who"}, {"query": "where"}]


def test_tag_parser_unclosed_tag_is_an_error():
    assert "search tag was opened and not closed" in TagParser().parse("<search>who", TOOLS).error


def test_megabytes_of_unclosed_tags_parse_without_error_escaping():
    garbage = "<tool_call><answer><search>" * 200_000
    assert HermesParser().parse(garbage, TOOLS).error
    assert TagParser().parse(garbage, TOOLS).error


@settings(max_examples=300, deadline=None)
@given(ACTION_TEXT)
def test_parsers_never_raise(text):
    for parser in (HermesParser(), TagParser()):
        parsed = parser.parse(text, TOOLS)
        assert (parsed.error is None) == bool(parsed.calls or parsed.answer is not None)


def test_a_json_tool_call_on_the_tag_format_says_that_action_format_hermes_reads_it():
    text = '<tool_call>{"name": "search", "arguments": {"query": "a"}}</tool_call>'
    error = TagParser().parse(text, TOOLS).error
    assert error is not None and "action_format=hermes" in error and "<tool_call>" not in error
    assert "action_format" not in TagParser().parse("no action at all", TOOLS).error


MARKUP = ("<tool_call>", "</tool_call>", "<answer>", "</answer>", "<search>", "</search>", "<calc>", "</calc>")


@settings(max_examples=300, deadline=None)
@given(ACTION_TEXT)
def test_an_error_written_back_by_the_model_makes_no_call_and_no_answer(text):
    # A small model copies the error it was shown: the copy must not open a call (unclosed, the same error again)
    for parser in (HermesParser(), TagParser()):
        error = parser.parse(text, TOOLS).error
        if error is not None:
            assert not any(m in error for m in MARKUP), error
            echoed = parser.parse(error, TOOLS)
            assert not echoed.calls and echoed.answer is None


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
MARKED_TEXT = st.lists(st.sampled_from(["<tool_call>", "</tool_call>", "<answer>", "</answer>", "x", " ", '"', "\\"]),
                       max_size=8).map("".join)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["search", "calc"]), st.dictionaries(st.text(max_size=10), JSON_VALUES | MARKED_TEXT,
                                                             max_size=4))
def test_hermes_parse_inverts_format(name, arguments):
    call = ToolCall(name, arguments)
    parsed = HermesParser().parse(HermesParser().format(call), TOOLS)
    assert parsed.error is None and parsed.calls == (call,)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="<"), max_size=60))
def test_tag_parse_inverts_format(query):
    call = ToolCall("search", {"query": query})
    parsed = TagParser().parse(TagParser().format(call), TOOLS)
    assert parsed.error is None and parsed.calls == (call,)


def test_format_writes_several_calls_in_order_and_answers():
    calls = (ToolCall("search", {"query": "a"}), ToolCall("calc", {"a": 1, "b": 2}))
    assert HermesParser().parse(HermesParser().format(*calls), TOOLS).calls == calls
    for parser in (HermesParser(), TagParser()):
        assert parser.parse(parser.format_answer("Paris"), TOOLS).answer == "Paris"


def test_tag_format_refuses_calls_a_tag_cannot_write():
    with pytest.raises(ConfigError, match="one string argument"):
        TagParser().format(ToolCall("calc", {"a": 1, "b": 2}))
    with pytest.raises(ConfigError, match="without </search>"):
        TagParser().format(ToolCall("search", {"query": "a</search>b"}))


@pytest.mark.parametrize(("body", "fragment"), [
    ('{"name": "calc", "arguments": {"a": ' + "9" * 5000 + "}}", "integer too long to read (over 4300 digits)"),
    ('{"name": "calc", "arguments": "{\\"a\\": ' + "9" * 5000 + '}"}', "integer too long to read"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_hermes_answers_json_python_cannot_read(body, fragment):
    parsed = HermesParser().parse(f"<tool_call>{body}</tool_call>", TOOLS)
    assert parsed.calls == () and fragment in parsed.error
