"""The answer grammar: what it reads, what it refuses, the sizes it allows, and the checker's refusal of code."""

from fractions import Fraction

import pytest
import sympy
from hypothesis import given
from hypothesis import strategies as st

from trace_gym.environments.math import expressions
from trace_gym.environments.math.symbolic import refuse_code_from_strings, sympy_equal
from trace_gym.environments.sandbox.bounded import bounded_call

VALUES = [
    ("12", Fraction(12)),
    ("0.5", Fraction(1, 2)),
    (".25", Fraction(1, 4)),
    ("1/2+1/3", Fraction(5, 6)),
    ("\\frac{3}{4}", Fraction(3, 4)),
    ("\\frac34", Fraction(3, 4)),
    ("-\\frac{1}{2}", Fraction(-1, 2)),
    ("2^{10}", Fraction(1024)),
    ("2**-2", Fraction(1, 4)),
    ("2^3^2", Fraction(512)),                  # right-associative
    ("3(4+1)", Fraction(15)),                  # implicit multiplication
    ("2\\cdot3\\times4\\div6", Fraction(4)),
    ("5!", Fraction(120)),
    ("3!!", Fraction(720)),
    ("{(1+2)}^2", Fraction(9)),
    ("-(-3)", Fraction(3)),
    ("1^{10^{100}}", Fraction(1)),             # a huge exponent of 1 is sized as 1, not computed
]


@pytest.mark.parametrize(("text", "value"), VALUES)
def test_constant_expressions_have_their_exact_value(text: str, value: Fraction) -> None:
    assert expressions.exact_value(expressions.parse(text)) == value


@pytest.mark.parametrize("text", ["\\sqrt{2}", "\\pi", "x+1", "2^{1/2}", "1/0", "(1,2)"])
def test_irrational_symbolic_or_undefined_expressions_have_no_exact_value(text: str) -> None:
    assert expressions.exact_value(expressions.parse(text)) is None


def test_trees_become_the_sympy_objects_they_describe() -> None:
    x, p, q = sympy.symbols("x p q")
    assert expressions.to_sympy(expressions.parse("2\\sqrt{3}")) == 2 * sympy.sqrt(3)
    assert expressions.to_sympy(expressions.parse("\\sqrt[3]{8}")) == 2
    assert expressions.to_sympy(expressions.parse("pq-x^2")) == p * q - x**2
    assert expressions.to_sympy(expressions.parse("(3,\\pi/2)")) == (3, sympy.pi / 2)
    assert expressions.to_sympy(expressions.parse("sqrt(2)/2")) == sympy.sqrt(2) / 2


@pytest.mark.parametrize("text", [
    "__import__('os').system('id')",
    "(lambda:0).__globals__",
    "().__class__.__bases__[0].__subclasses__()",
    "x.__class__",
    "exec('1')",
    "os.system",
    "Symbol('x')",
    "1;2",
    "a=b",
    "x[0]",
    "\\input{/etc/passwd}",
    "\\text{x}",
    "１２",                                     # fullwidth digits
    "٣",                                       # Arabic-Indic digit
    "ｘ",
    "2\u00d73",                                # the multiplication sign is not an operator here
    "",
    "(",
    "1+",
    "\\frac{1}",
    "\\sqrt",
])
def test_text_outside_the_grammar_is_refused(text: str) -> None:
    with pytest.raises(expressions.ExpressionError):
        expressions.parse(text)


@pytest.mark.parametrize("text", [
    "9^{9^{9^{9}}}", "9**9**9**9", "10^{10^{5}}", "2^{2^{2^{2^{2}}}}", "(10^{10})!", "1001!", "3!!!!",
    "x^{10^{6}}", "\\sqrt{2}^{10^{6}}", "(2^{9999})(2^{9999})",
])
def test_constant_powers_and_factorials_past_the_size_limit_are_refused_before_computing(text: str) -> None:
    with pytest.raises(expressions.TooLarge):
        expressions.parse(text)


def test_length_nesting_and_literal_size_are_limited() -> None:
    with pytest.raises(expressions.ExpressionError, match="longer"):
        expressions.parse("1+" * 300 + "1")
    with pytest.raises(expressions.ExpressionError, match="nested"):
        expressions.parse("(" * 100 + "1" + ")" * 100)
    with pytest.raises(expressions.ExpressionError, match="nested"):
        expressions.parse("-" * 100 + "1")
    with pytest.raises(expressions.ExpressionError, match="digits"):
        expressions.parse("1" * (expressions.MAX_DIGITS + 1))
    assert expressions.exact_value(expressions.parse("(" * 30 + "1" + ")" * 30)) == 1


@pytest.mark.parametrize(("gold", "pred", "equal"), [
    ("\\frac{\\sqrt{2}}{2}", "1/sqrt(2)", True),
    ("2\\sqrt{3}", "sqrt(12)", True),
    ("x^2-1", "(x+1)(x-1)", True),
    ("(3,\\frac{\\pi}{2})", "(3,\\pi/2)", True),
    ("\\pi", "3.14159", False),
    ("(1,2)", "(2,1)", False),
    ("x^2", "2x", False),
    ("(1,2)", "3", False),
])
def test_sympy_on_grammar_trees_decides_equivalence(gold: str, pred: str, equal: bool) -> None:
    assert sympy_equal(gold, pred) is equal


def sympify_after_refusal(text: str) -> str:
    """In a checking process: try the ways a string could become code after ``refuse_code_from_strings``."""
    refuse_code_from_strings()
    results = []
    for attempt in (lambda: sympy.sympify(text), lambda: sympy.parsing.sympy_parser.parse_expr(text),
                    lambda: eval(text), lambda: compile(text, "<answer>", "eval")):
        try:
            attempt()
            results.append("ran")
        except Exception as e:
            results.append(type(e).__name__)
    results.append(str(sympy.Number("12")))  # what math-verify's LaTeX parser asks of sympy still works
    return ",".join(results)


def test_the_checking_process_refuses_to_turn_strings_into_code(tmp_path) -> None:
    marker = tmp_path / "ran"
    outcome = bounded_call(sympify_after_refusal, f"__import__('os').mkdir({str(marker)!r})")
    assert outcome.ok, outcome.error
    assert "ran" not in outcome.value.split(",")[:4] and outcome.value.endswith(",12")
    assert not marker.exists()


# --------------------------------------------------------------------------- properties
def _trees(depth: int = 3):
    """(text, exact value or None) pairs: random constant expressions in the written forms the grammar reads."""
    leaf = st.integers(0, 999).map(lambda n: (str(n), Fraction(n)))
    if depth == 0:
        return leaf
    sub = _trees(depth - 1)

    def combine(op, a, b):
        (ta, va), (tb, vb) = a, b
        if op in "+-*":
            value = None if va is None or vb is None else {"+": va + vb, "-": va - vb, "*": va * vb}[op]
            return f"({ta}){op}({tb})", value
        if op == "/":
            return f"\\frac{{{ta}}}{{{tb}}}", None if va is None or vb is None or vb == 0 else va / vb
        return f"({ta})^{{2}}", None if va is None else va**2  # squares only: sizes stay small

    return st.one_of(leaf, st.builds(combine, st.sampled_from("+-*/^"), sub, sub))  # "^" ignores b


@given(_trees())
def test_the_exact_value_of_random_constant_expressions_matches_fraction_arithmetic(pair) -> None:
    text, value = pair
    if len(text) > expressions.MAX_CHARS:
        return
    assert expressions.exact_value(expressions.parse(text)) == value


@given(st.text(alphabet="0123456789+-*/^()!{}[],.xpi\\fracsqt ", max_size=60))
def test_arbitrary_text_is_a_tree_or_an_expression_error(text: str) -> None:
    try:
        tree = expressions.parse(text)
    except expressions.ExpressionError:
        return
    expressions.exact_value(tree)  # sized at parse time: computing the value is cheap and cannot raise
