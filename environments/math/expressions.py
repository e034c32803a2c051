"""A small math-expression grammar for final answers: a parser that cannot run code, with size limits.

An answer is untrusted text. It is read here by a recursive-descent parser into a tree of tuples (nothing is
evaluated, imported or looked up by name), then turned into exact rationals (``exact_value``) or sympy objects
(``to_sympy``) node by node. No string ever reaches ``eval``, ``sympify`` or ``parse_expr``.

Accepted (after ``answers.normalize``, so without spaces): numbers (``12``, ``0.5``, ``.5``), single-letter
symbols (two small letters together are a product: ``pq`` = p*q; a longer run or one with a capital is a word or a
letter sequence, ``CBAD``, ``east``, which ``word_runs`` finds and the grammar refuses: the letters of a word in
another order are not the same answer), ``pi``/``\\pi``, ``+ - * / ^ **``, ``\\cdot``, ``\\times``,
``\\div``, implicit multiplication (``2\\sqrt{3}``, ``3(x+1)``), ``!`` on small integers, parentheses and
braces, ``\\frac{a}{b}`` (and ``\\frac34``), ``\\sqrt{x}``, ``\\sqrt[n]{x}``, ``sqrt(x)``, and one top-level
tuple (``(3,\\pi/2)``). Anything else is an ``ExpressionError`` (the caller then tries other checks).

Limits, so that neither parsing nor sympy can be made to work without bound: ``MAX_CHARS`` characters,
``MAX_DEPTH`` nesting, ``MAX_DIGITS`` digits per literal, and every constant power or factorial is sized before
anything computes it: a result of more than ``MAX_RESULT_DIGITS`` digits (``9^{9^{9^9}}``, ``(10^{10})!``) is
refused with ``TooLarge``.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

MAX_CHARS = 400
MAX_DEPTH = 40
MAX_DIGITS = 200
MAX_RESULT_DIGITS = 10_000
MAX_SYMBOLIC_EXPONENT = 1_000  # x^1000 is fine for simplify; x^(10^9) makes expand() build huge polynomials
MAX_FACTORIAL = 1_000
RELATIVE_TOLERANCE = Fraction(1, 10**6)
"""How far a value may be from a gold written as a decimal with a fractional part, relative to the gold."""

Node = tuple[Any, ...]
"""("num", Fraction) | ("sym", letter) | ("pi",) | (op, child, ...) for op in add neg mul div pow sqrt root fact;
("tuple", child, ...) only at the top."""

_TOKEN = re.compile(r"(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)|(?P<cmd>\\[a-zA-Z]+)|(?P<name>sqrt|pi)"
                    r"|(?P<letter>[a-zA-Z])|(?P<op>\*\*|[-+*/^(){}\[\],!])", re.ASCII)
_COMMANDS = {"\\frac", "\\dfrac", "\\tfrac", "\\sqrt", "\\pi", "\\cdot", "\\times", "\\div"}
_MUL_OPS = {"*", "\\cdot", "\\times"}
_NAMES = {"sqrt", "pi"}
_SHORT_WORDS = {"or", "no", "to", "of", "is", "if", "on", "at", "by", "as", "an", "be", "it", "so"}
_RUN = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}", re.ASCII)
_DIV_OPS = {"/", "\\div"}


class ExpressionError(ValueError):
    """The text is not an expression of this grammar."""


class TooLarge(ExpressionError):
    """The expression is well formed but its value would be too large to compute."""


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ExpressionError(f"unexpected character {text[pos]!r} at {pos}")
        kind = m.lastgroup or ""
        value = m.group()
        if kind == "cmd" and value not in _COMMANDS:
            raise ExpressionError(f"unknown command {value}")
        if kind == "num" and len(value) > MAX_DIGITS:
            raise ExpressionError(f"a number of more than {MAX_DIGITS} digits")
        out.append((kind, value))
        pos = m.end()
    return out


def relative_tolerance(gold: str) -> Fraction | None:
    """``RELATIVE_TOLERANCE`` for a gold (normalised) written as a decimal whose value is not an integer, the only
    gold that is given to some precision rather than exactly; None (exact equality) for every other gold."""
    decimal = len(gold) <= MAX_DIGITS and re.fullmatch(r"-?[0-9]*\.[0-9]+", gold, re.ASCII) is not None
    if decimal and Fraction(gold).denominator != 1:
        return RELATIVE_TOLERANCE
    return None


def word_runs(text: str) -> list[str]:
    """The runs of letters in ``text`` that are words or letter sequences rather than products: three or more
    letters, two with a capital (``AB``, a segment) or a two-letter English word (``or``); LaTeX commands and the
    names ``sqrt`` and ``pi`` are not runs. Other pairs of small letters (``xy``, ``bx``) are a product of symbols,
    as algebra writes them."""
    return [run for run in _RUN.findall(text)
            if run not in _NAMES and (len(run) > 2 or not run.islower() or run in _SHORT_WORDS)]


class _Parser:
    def __init__(self, text: str):
        self.toks = _tokens(text)
        self.i = 0
        self.depth = 0

    # -- helpers
    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value):
            raise ExpressionError(f"expected {value or 'more input'}, got {tok[1] if tok else 'the end'}")
        self.i += 1
        return tok

    def accept(self, *values: str) -> str | None:
        tok = self.peek()
        if tok is not None and tok[1] in values:
            self.i += 1
            return tok[1]
        return None

    def nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExpressionError(f"nested deeper than {MAX_DEPTH}")

    # -- grammar
    def top(self) -> Node:
        if self.peek() == ("op", "("):  # a tuple "(a, b)" is a whole answer, never a factor
            start = self.i
            self.take()
            items = [self.sum()]
            while self.accept(","):
                items.append(self.sum())
            if len(items) > 1 and self.accept(")") and self.peek() is None:
                return ("tuple", *items)
            self.i = start
        node = self.sum()
        if self.peek() is not None:
            raise ExpressionError(f"unexpected {self.peek()[1]!r}")  # type: ignore[index]
        return node

    def sum(self) -> Node:
        self.nest()
        node = self.term()
        while (op := self.accept("+", "-")) is not None:
            right = self.term()
            node = ("add", node, right if op == "+" else ("neg", right))
        self.depth -= 1
        return node

    def term(self) -> Node:
        node = self.unary()
        while True:
            tok = self.peek()
            if tok is None:
                return node
            if tok[1] in _MUL_OPS or tok[1] in _DIV_OPS:
                self.i += 1
                node = ("mul" if tok[1] in _MUL_OPS else "div", node, self.unary())
            elif self.starts_atom(tok):  # implicit multiplication: 2\sqrt{3}, 3(x+1), pq
                node = ("mul", node, self.power())
            else:
                return node

    def unary(self) -> Node:
        if (op := self.accept("-", "+")) is not None:
            self.nest()
            inner = self.unary()
            self.depth -= 1
            return ("neg", inner) if op == "-" else inner
        return self.power()

    def power(self) -> Node:
        base = self.postfix()
        if self.accept("^", "**") is not None:
            self.nest()
            exponent = self.unary()  # right-associative: a^b^c = a^(b^c); a^-1 allowed
            self.depth -= 1
            return ("pow", base, exponent)
        return base

    def postfix(self) -> Node:
        node = self.atom()
        while self.accept("!") is not None:
            node = ("fact", node)
        return node

    @staticmethod
    def starts_atom(tok: tuple[str, str]) -> bool:
        kind, value = tok
        return kind in ("num", "name", "letter") or value in ("(", "{", "\\frac", "\\dfrac", "\\tfrac", "\\sqrt",
                                                              "\\pi")

    def atom(self) -> Node:
        kind, value = self.take()
        if kind == "num":
            return ("num", Fraction(value))
        if kind == "letter":
            return ("sym", value)
        if value in ("pi", "\\pi"):
            return ("pi",)
        if value in ("(", "{"):
            inner = self.sum()
            self.take(")" if value == "(" else "}")
            return inner
        if value in ("\\frac", "\\dfrac", "\\tfrac"):
            return ("div", self.group(), self.group())
        if value == "\\sqrt":
            if self.accept("[") is not None:
                index = self.sum()
                self.take("]")
                return ("root", self.group(), index)
            return ("sqrt", self.group())
        if value == "sqrt":
            self.take("(")
            inner = self.sum()
            self.take(")")
            return ("sqrt", inner)
        raise ExpressionError(f"unexpected {value!r}")

    def group(self) -> Node:
        """A LaTeX argument: ``{...}``, or one digit or letter (``\\frac34``, ``\\sqrt2``)."""
        tok = self.peek()
        if tok is None:
            raise ExpressionError("a command without its argument")
        if tok == ("op", "{"):
            self.take()
            inner = self.sum()
            self.take("}")
            return inner
        kind, value = tok
        if kind == "num" and value[0].isdigit():
            if len(value) > 1:
                self.toks[self.i] = ("num", value[1:])
            else:
                self.i += 1
            return ("num", Fraction(value[0]))
        if kind == "letter":
            self.i += 1
            return ("sym", value)
        raise ExpressionError(f"expected a LaTeX argument, got {value!r}")


def parse(text: str) -> Node:
    """The tree of ``text``; ``ExpressionError`` if it is not in the grammar, ``TooLarge`` if its constant powers
    or factorials would exceed ``MAX_RESULT_DIGITS`` digits."""
    if len(text) > MAX_CHARS:
        raise ExpressionError(f"longer than {MAX_CHARS} characters")
    if not text:
        raise ExpressionError("empty")
    words = word_runs(text)
    if words:
        raise ExpressionError(f"a word or letter sequence ({words[0]!r}) is not an expression")
    parser = _Parser(text)
    node = parser.top()
    _size(node)
    return node


def _digits(value: Fraction) -> float:
    """Digits of a rational's numerator and denominator together (an upper bound, cheap)."""
    return value.numerator.bit_length() * 0.302 + value.denominator.bit_length() * 0.302 + 1


def _size(node: Node) -> tuple[float, Fraction | None]:
    """(a bound on the digits of the node's exact value, that value if it is rational and known exactly).
    Raises ``TooLarge`` before any big number would be computed; symbolic and irrational parts count as
    size 1 with no exact value."""
    op = node[0]
    if op == "num":
        return _digits(node[1]), node[1]
    if op in ("sym", "pi"):
        return 1.0, None
    if op == "tuple":
        for child in node[1:]:
            _size(child)
        return 1.0, None
    sizes = [_size(child) for child in node[1:]]
    values = [v for _, v in sizes]
    if op == "neg":
        return sizes[0][0], -values[0] if values[0] is not None else None
    if op in ("add", "mul", "div"):
        bound = sizes[0][0] + sizes[1][0] + 1
        if bound > MAX_RESULT_DIGITS:
            raise TooLarge(f"a result of more than {MAX_RESULT_DIGITS} digits")
        a, b = values
        if a is None or b is None:
            return bound, None
        if op == "add":
            return bound, a + b
        if op == "mul":
            return bound, a * b
        return bound, a / b if b != 0 else None
    if op == "pow":
        (base_size, base), (_, exponent) = sizes
        if exponent is None:  # 2^x, 2^\pi, 2^{\sqrt2}: sympy keeps these symbolic
            return base_size, None
        if base is not None and base in (0, 1, -1):
            return 1.0, _power(base, exponent)
        limit = MAX_SYMBOLIC_EXPONENT if base is None else MAX_RESULT_DIGITS
        if abs(exponent) > limit:
            raise TooLarge(f"an exponent of about {_digits(abs(exponent)):.0f} digits (at most {limit})")
        bound = base_size * float(abs(exponent)) + 1
        if bound > MAX_RESULT_DIGITS:
            raise TooLarge(f"a power of more than {MAX_RESULT_DIGITS} digits")
        return bound, _power(base, exponent) if base is not None else None
    if op == "fact":
        (_, n), = sizes
        if n is None or n.denominator != 1 or not 0 <= n <= MAX_FACTORIAL:
            if n is not None and n > MAX_FACTORIAL:
                raise TooLarge(f"a factorial of {n} (at most {MAX_FACTORIAL})")
            return 1.0, None
        return math.lgamma(int(n) + 1) / math.log(10) + 1, Fraction(math.factorial(int(n)))
    if op in ("sqrt", "root"):
        return sizes[0][0], None
    raise AssertionError(f"unknown node {op!r}")


def _power(base: Fraction, exponent: Fraction) -> Fraction | None:
    """base^exponent when it is rational and the sizes were checked; None for roots and 0^-n."""
    if exponent.denominator != 1 or (base == 0 and exponent < 0):
        return None
    return base ** int(exponent)


def exact_value(node: Node) -> Fraction | None:
    """The exact rational value of a parsed expression without symbols, roots or pi; else None."""
    return _size(node)[1]


def to_sympy(node: Node) -> Any:
    """sympy objects built node by node (a tuple becomes a Python tuple). Sizes were checked by ``parse``."""
    import sympy

    op = node[0]
    if op == "tuple":
        return tuple(to_sympy(child) for child in node[1:])
    if op == "num":
        return sympy.Rational(node[1].numerator, node[1].denominator)
    if op == "sym":
        return sympy.Symbol(node[1])
    if op == "pi":
        return sympy.pi
    args = [to_sympy(child) for child in node[1:]]
    if op == "neg":
        return -args[0]
    if op == "add":
        return args[0] + args[1]
    if op == "mul":
        return args[0] * args[1]
    if op == "div":
        return args[0] / args[1]
    if op == "pow":
        return sympy.Pow(args[0], args[1])
    if op == "fact":
        return sympy.factorial(args[0])
    if op == "sqrt":
        return sympy.sqrt(args[0])
    if op == "root":
        return sympy.root(args[0], args[1])
    raise AssertionError(f"unknown node {op!r}")
