"""The jailed symbolic check: its verdict is one validated JSON line, and each check starts from the same state."""

import pytest

from trace_gym.environments.math import jailed
from trace_gym.environments.math.answers import check_answer

MARK = jailed._MARK


@pytest.mark.parametrize(("output", "verdict"), [
    (MARK + '["sympy", "x", "x"]\n', ("sympy", "x", "x")),
    (MARK + '[null, "", ""]\n', (None, "", "")),
    ("noise\n" + MARK + '["math_verify", "1/2", "0.5"]\n', ("math_verify", "1/2", "0.5")),
])
def test_a_verdict_line_is_read(output: str, verdict) -> None:
    assert jailed._verdict(output) == verdict


@pytest.mark.parametrize("output", [
    "",
    MARK + '["sympy", "x", "x"]\n' + MARK + '["sympy", "x", "x"]\n',  # two verdicts: neither counts
    MARK + '["exact", "x", "x"]\n',                                      # not a method the jail may report
    MARK + '["sympy", 1, "x"]\n',
    MARK + '{"method": "sympy"}\n',
    MARK + "not json\n",
    'print("' + MARK + '[\\"sympy\\", \\"x\\", \\"x\\"]")',              # the mark not at a line start
])
def test_anything_but_one_valid_verdict_is_no_verdict(output: str) -> None:
    assert jailed._verdict(output) is None


def test_a_timed_out_check_does_not_spoil_later_checks() -> None:
    # The same pair gives the same verdict after a timeout and after other answers: each check is a fresh
    # restore of the warmed snapshot, not a cell after the previous ones.
    pair = ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}")
    first = check_answer(*pair)
    assert check_answer("\\{9^{9^{9^{9}}}\\}", "3")[1]["method"] == "timeout"
    check_answer("(x+1)(x-1)", "x^2-1")
    assert check_answer(*pair) == first and first[0] == 1.0
