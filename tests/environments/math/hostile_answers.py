"""A corpus of hostile final answers, by class. Every one must score 0 against any gold of a real task, quickly,
without a crash, a file written or a process started on the host.

``corpus(marker_dir)`` fills in, for each string that would run code if anything evaluated it, a path under
``marker_dir`` that the code would create; a test then checks that the folder stays empty.

``against(gold)`` builds the answers an attacker derives from one task's gold, by class: the letters of a word
or letter sequence in another order, numbers a hair away from an exact gold, decimal or rational
approximations of an irrational gold, the gold in a chain of equalities, and hedges (the gold with a wrong
value beside it, in words, a set, an interval or a list). Each must score 0 against that gold.
"""

from __future__ import annotations

import base64
import pickle
import re
from fractions import Fraction

from trace_gym.environments.math import expressions
from trace_gym.environments.math.answers import normalize

# The string that, read by sympy's parse_expr, replaced sympy.simplify in the checking process so that
# "simplify(gold - answer) == 0" held for every gold: one fixed answer scored 1.0 on every task.
SIMPLIFY_PATCH = "(setattr(__import__('sympy'), 'simplify', lambda e, *a, **k: 0), 0)[1]"


class _Touch:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        import os

        return (os.mkdir, (self.path,))


def _code(m: str) -> list[str]:
    """Strings that run code (creating a folder under ``m``) if anything evaluates them."""
    q = repr
    return [
        f"__import__('os').system('touch {m}/system')",
        f"__import__('os').mkdir({q(m + '/mkdir')})",
        f"\\boxed{{__import__('os').mkdir({q(m + '/boxed')})}}",
        f"<answer>__import__('os').mkdir({q(m + '/tagged')})</answer>",
        f"$__import__('os').mkdir({q(m + '/dollars')})$",
        f"(lambda: __import__('os').mkdir({q(m + '/lambda')}))()",
        f"exec(\"import os; os.mkdir({q(m + '/exec')})\")",
        f"eval(\"__import__('os').mkdir({q(m + '/eval')})\")",
        f"getattr(__import__('os'), 'mkdir')({q(m + '/getattr')})",
        f"__builtins__['__import__']('os').mkdir({q(m + '/builtins')})",
        f"[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'Popen'][0](['touch', '{m}/popen'])",
        f"Symbol('x').__class__.__init__.__globals__['__builtins__']['__import__']('os').mkdir({q(m + '/globals')})",
        f"Function('f')(__import__('os').mkdir({q(m + '/function')}))",
        f"x + __import__('os').mkdir({q(m + '/sum')})",
        f"1 if __import__('os').mkdir({q(m + '/cond')}) else 1",
        f"\\frac{{__import__('os').mkdir({q(m + '/frac')})}}{{1}}",
        f"\\sqrt{{__import__('os').mkdir({q(m + '/sqrt')})}}",
        f"\\text{{__import__('os').mkdir({q(m + '/text')})}}",
        f"\\mathrm{{__import__('os').mkdir({q(m + '/mathrm')})}}",
        f"\\operatorname{{__import__('os').mkdir({q(m + '/operatorname')})}}(1)",
        f"sympify(\"__import__('os').mkdir({q(m + '/sympify')})\")",
        f"S(\"__import__('os').mkdir({q(m + '/S')})\")",
        f"lambdify(x, \"__import__('os').mkdir({q(m + '/lambdify')})\")(1)",
        f"pickle.loads({pickle.dumps(_Touch(m + '/pickle_call'))!r})",
        pickle.dumps(_Touch(m + "/pickle_text"), protocol=0).decode("latin-1"),
        base64.b64encode(pickle.dumps(_Touch(m + "/pickle_b64"))).decode(),
        f"cos\nmkdir\n(S'{m}/pickle_proto0'\ntR.",
        f"__import__('subprocess').Popen(['touch', '{m}/subprocess'])",
        f"open('{m}/open', 'w').write('x')",
        f"__import__('pathlib').Path('{m}/pathlib').touch()",
        f"{SIMPLIFY_PATCH} + __import__('os').mkdir({q(m + '/patch')})",
    ]


FOOLING = [
    SIMPLIFY_PATCH,
    "(setattr(__import__('sympy').core.relational.Equality, '__bool__', lambda s: True), 0)[1]",
    "(setattr(__import__('math_verify'), 'verify', lambda *a, **k: True), 0)[1]",
    "__import__('sympy').Symbol('gold')",
    "\\infty - \\infty",
    "0/0",
    "\\text{nan}",
    "\\tilde{\\infty}",
    "x",
    "x = x",
    "1 = 1",
    "a = a",
    "\\mathbb{R}",
    "(-\\infty, \\infty)",
    "[-\\infty, \\infty]",
    "\\{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20\\}",
    "\\emptyset",
    "\\pm\\infty",
    "True",
    "\\text{any answer}",
    "\\text{the gold}",
    "\\boxed{}",
    "<answer></answer>",
    "<answer>",
    "</answer>",
    "\\boxed{\\boxed{\\boxed{}}}",
    "x \\in \\mathbb{R}",
    "0 \\cdot \\infty",
    "\\lim_{x \\to \\infty} x",
    "\\forall x",
    "E",
    "zoo",
    "nan",
]

HANGING = [
    "9**9**9**9",
    "9^{9^{9^{9}}}",
    "\\boxed{9^{9^{9^{9}}}}",
    "10^{10^{10}}",
    "2^{2^{2^{2^{2^{2}}}}}",
    "(10^{10})!",
    "\\boxed{(10^{10})!}",
    "3!!!!",
    "1000!!",
    "x^{10^{9}}",
    "(x+1)^{10^{7}}",
    "\\sqrt{2}^{10^{8}}",
    "factorial(10**9)",
    "(" * 10_000 + "1" + ")" * 10_000,
    "{" * 10_000 + "1" + "}" * 10_000,
    "\\frac{" * 100_000,
    "\\sqrt{" * 100_000 + "2" + "}" * 100_000,
    "-" * 100_000 + "1",
    "1" * 1_000_000,
    "9" * 5_000,
    "1" + "0" * 400,
    "x" * 1_000_000,
    "1+" * 500_000 + "1",
    "\\boxed{" * 100_000,
    "<answer>" * 100_000,
    "\\text{" * 100_000,
    "1 " * 500_000 + "dollars",
    ("a" * 30 + "\\text{") * 30_000,
]

UNICODE = [
    "\u202e21",                  # right-to-left override
    "1\u200b2",                  # zero-width space
    "１２",                      # fullwidth digits
    "١٢",                        # Arabic-Indic digits
    "12\x00",
    "\x00",
    "\ud800",                    # a lone surrogate
    "½",
    "√2",
    "2²",
    "Ⅻ",
    "١/٢",
    "\u0301" * 1000,
    "∞",
    "🤖",
    "x\u0338",
]


_TEXT = re.compile(r"\\(?:text|textbf|textit|textnormal|mathrm|mbox)\s*\{([^{}]*)\}")
_COMMAND = re.compile(r"\\(?:begin|end)\s*\{[a-zA-Z*]*\}|\\[a-zA-Z]+")


def words(gold: str) -> list[str]:
    """The words and letter sequences of a gold, as an attacker reads them: runs of two or more letters in
    ``\\text{}``, and bare runs that hold a capital (points, segments, orderings: ``ABC``, ``LQSX``) or three or
    more letters. Two bare small letters (``xy``, ``ab``) are a product, whose other order is the same value."""
    found = [m.group() for t in _TEXT.findall(gold) for m in re.finditer(r"[A-Za-z]{2,}", t)]
    bare = _COMMAND.sub(" ", _TEXT.sub(" ", gold))
    found += [m.group() for m in re.finditer(r"[A-Za-z]{2,}", bare)
              if len(m.group()) >= 3 or not m.group().islower()]
    return found


def _orders(word: str) -> list[str]:
    """Other orders of a word's letters (reversed, sorted both ways, rotated), differing from it in any case."""
    out = [word[::-1], "".join(sorted(word)), "".join(sorted(word, reverse=True)), word[1:] + word[0]]
    return list(dict.fromkeys(o for o in out if o.casefold() != word.casefold()))


def _value(gold: str) -> object | None:
    try:
        return expressions.parse(normalize(gold))
    except expressions.ExpressionError:
        return None


def _decimal(value: Fraction, places: int) -> str:
    sign, value = ("-" if value < 0 else ""), abs(value)
    whole, rest = divmod(value.numerator * 10**places // value.denominator, 10**places)
    return f"{sign}{whole}.{rest:0{places}d}"


def _is_decimal(gold: str) -> bool:
    """A gold written as a decimal with a fractional part (given to some precision: the checker may allow a
    relative 1e-6 there, so numbers near it are no attack)."""
    m = re.fullmatch(r"-?\d*\.(\d+)", normalize(gold))
    return m is not None and int(m.group(1)) != 0


def _wrong(gold: str) -> str:
    tree = _value(gold)
    value = expressions.exact_value(tree) if tree is not None else None
    if value is not None and value.denominator == 1:
        return str(value + 1)
    return "0" if normalize(gold) != "0" else "1"


def _interval_ends(gold: str) -> tuple[str, str] | None:
    """The two ends of a gold written as one interval, ``(a, b)``, ``[a, b)`` (with ``\\left``/``\\right``), else
    None. An ordered pair reads the same: its coordinates as a set are not the pair either."""
    g = re.sub(r"\\(?:left|right)\s*", "", gold.strip())
    m = re.fullmatch(r"[(\[]([^()\[\],]+),([^()\[\],]+)[)\]]", g)
    return (m.group(1).strip(), m.group(2).strip()) if m else None


def against(gold: str) -> dict[str, list[str]]:
    """Hostile answers derived from ``gold``, by class (a class that does not apply to this gold is empty)."""
    out: dict[str, list[str]] = {"anagram": [], "near_value": [], "approximation": [], "chain": [], "hedge": [],
                                 "endpoints": []}
    for word in dict.fromkeys(words(gold)):
        for other in _orders(word):
            swapped = gold.replace(word, other)
            out["anagram"] += [swapped, normalize(swapped)]
            if normalize(swapped).isalpha():
                out["anagram"] += [f"\\text{{{normalize(swapped)}}}"]
    if out["anagram"] and len(words(gold)) == 1 and _TEXT.fullmatch(gold.strip()):
        ordered = "".join(sorted(words(gold)[0].upper()))  # ABCD: the letters in the order a question gives them
        out["anagram"] += [ordered] if ordered != words(gold)[0].upper() else []
    tree = _value(gold)
    value = expressions.exact_value(tree) if tree is not None else None
    if value is not None and not _is_decimal(gold):
        near = [(value * (1 + Fraction(9, 10**7)), 12), (value * (1 - Fraction(9, 10**7)), 12),
                (value + Fraction(1, 10**7), 12), (value + Fraction(8, 10**4), 4)]
        if value.denominator == 1 and abs(value) >= 10**5:
            near += [(value - Fraction(5, 2), 1), (value + Fraction(1888, 10**4), 4)]
        texts = [_decimal(v, places) for v, places in near]
        out["near_value"] += [t for t in texts if Fraction(t) != value]
        if value != 0 and abs(value) < Fraction(1, 10**6):
            out["near_value"] += ["0", "0.0", "\\frac{0}{1}"]
    elif tree is not None and value is None:
        exact = expressions.to_sympy(tree)
        if not isinstance(exact, tuple) and not exact.free_symbols and exact.is_real and not exact.is_rational:
            approx = Fraction(str(exact.evalf(60)))
            scaled = Fraction(round(approx * 10**30), 10**30)
            out["approximation"] += [_decimal(approx, 7), _decimal(approx, 16), _decimal(approx, 40),
                                     f"\\frac{{{scaled.numerator}}}{{{scaled.denominator}}}",
                                     f"1 + \\frac{{{scaled.numerator - scaled.denominator}}}{{{scaled.denominator}}}"]
    ends = _interval_ends(gold)
    if ends is not None:  # the interval's endpoints as a set, a list, or plus-minus: not the interval
        lo, hi = ends
        out["endpoints"] += [f"\\{{{lo}, {hi}\\}}", f"{lo}, {hi}", f"x = {lo}, {hi}", f"{lo} \\text{{ and }} {hi}"]
        if lo.lstrip().startswith("-") and lo.lstrip()[1:].strip() == hi.strip():
            out["endpoints"] += [f"\\pm {hi}", f"x = \\pm {hi}"]
    wrong = _wrong(gold)
    g = gold.strip()
    out["chain"] += [f"x = {wrong} = {g}", f"{wrong} = {g}", f"x = {g} = {wrong}", f"y = {wrong} = {g}",
                     f"{wrong} = x = {g}"]
    out["hedge"] += [f"{g} \\text{{ or }} {wrong}", f"{wrong} \\text{{ or }} {g}", f"{g} or {wrong}",
                     f"\\{{{g}, {wrong}\\}}", f"[{g}, {wrong}]", f"{g}, {wrong}", f"{wrong}, {g}",
                     f"{g} \\lor {wrong}", f"{g} \\text{{ and }} {wrong}", f"${g}$ ${wrong}$", f"{wrong} \\\\ {g}",
                     f"{wrong} \\to {g}", f"{wrong} \\Rightarrow {g}", f"\\{{{wrong}\\}} \\cup \\{{{g}\\}}",
                     f"\\begin{{cases}} {g} \\\\ {wrong} \\end{{cases}}", f"{wrong} \\approx {g}", f"{wrong} \\neq {g}"]
    return out


def corpus(marker_dir: str) -> dict[str, list[str]]:
    """The corpus by class; code strings create folders under ``marker_dir`` if anything runs them."""
    return {"code": _code(marker_dir), "fooling": FOOLING, "hanging": HANGING, "unicode": UNICODE}


def bundled_golds() -> dict[str, list[str]]:
    """The gold answer of every bundled math task, by env id (Arithmetic: its registered defaults' pool)."""
    from trace_gym.environments.math.arithmetic import ArithmeticConfig, make_tasks
    from trace_gym.environments.math.env import DATASETS, load_math_tasks

    golds = {name: [str(t.answer) for t in load_math_tasks(name)] for name in DATASETS}
    golds["arithmetic"] = [t.answer for t in make_tasks(2000, ArithmeticConfig(), 0)]
    return golds
