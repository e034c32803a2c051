"""Final-answer extraction and equivalence checking for math tasks.

An answer is untrusted text and is never run as code. Order of checks (the first that says "equal" wins):
normalised strings; exact rationals and decimals; the expression grammar of ``expressions.py`` (a parser that
cannot run code, with size limits), whose constant trees compare as exact rationals here; then, in the jail
(``jailed.py``), sympy on the grammar's trees when both sides are in the grammar, else math-verify's LaTeX parser
(sets, intervals, matrices, relations) with its numeric shortcuts replaced by exact comparison
(``symbolic.py``). Neither ``sympify``/``parse_expr`` on a string nor math-verify's plain-expression parser (which
calls ``parse_expr``) is used, and the checking process refuses both (``symbolic.refuse_code_from_strings``).
Binary reward; the parsed forms are returned for ``info``. Nothing here raises on an answer.

What counts as the answer: a word or a letter sequence (``\\text{east}``, ``ABCD``, ``\\triangle ABC``) is
compared as a string (after normalising, ignoring case), never as a product of symbols; a number equals an exact
gold (an integer, a fraction, an expression) only if its value is exactly the gold's; only a gold written as a
decimal with a fractional part allows a relative ``RELATIVE_TOLERANCE`` (never an absolute one, so nothing is
near a small gold but itself); an answer that chains relations (``x = 6 = 5``) or relates two constants
(``6 = 5``) where the gold has no relation is wrong.

Time and memory bound: the checks here are linear in the answer's length (inputs over ``MAX_CHARS`` get only
the string check), and the grammar sizes every constant power and factorial before computing it, so
``9^{9^{9^{9}}}`` or ``(10^{10})!`` get 0 with ``info["method"] == "too_large"`` at once. The jailed check has
its own CPU budget and a cell's limits (``jailed.py``): an answer that makes it work too long gets 0 with
``info["method"] == "timeout"`` and a note; a check that fails for the checker's own reasons is run again.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from trace_gym.environments.math import expressions, jailed

MAX_CHARS = expressions.MAX_CHARS
TIMEOUT_S = jailed.TIMEOUT_S
RELATIVE_TOLERANCE = expressions.RELATIVE_TOLERANCE

_UNIT_WORDS = (r"(?:dollars?|cents?|euros?|usd|units?|degrees?|radians?|rad|cm|mm|km|m|meters?|inches|inch|feet|"
               r"foot|ft|miles?|acres?|hours?|minutes?|seconds?|days?|weeks?|years?|pounds?|ounces?|kg|mg|g|grams?|"
               r"liters?|litres?|ml|gallons?|quarts?|pints?|cups?|tons?|mph|sq|square)")
_TEXT = r"\\(?:text|textbf|textit|textnormal|mathrm|mbox)\s*"
_ENVIRONMENT = re.compile(r"\\(?:begin|end)\s*\{[a-zA-Z*]*\}")
_RELATION = re.compile(r"=|<|>|\\(?:leq?|geq?|neq?|ne|approx|equiv|simeq|sim|cong|lt|gt)(?![a-zA-Z])")
# A gold's trailing words after a number, "9\text{ values}", name its unit unless they change the value or hedge.
_GOLD_UNIT = re.compile(_TEXT + r"\{\s*([A-Za-z][A-Za-z .]*)\}\s*\.?\s*$")
_NOT_UNITS = {"or", "and", "not", "to", "plus", "minus", "times", "hundred", "thousand", "million", "billion",
              "trillion", "percent", "more", "less", "least", "most", "than", "about", "approximately"}


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None if there is none."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start == -1:
        return None
    i = text.find("{", start)
    if i == -1:
        rest = text[start + len("\\boxed"):].strip()  # "\boxed 5"
        return rest.split("$")[0].strip() or None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def extract_answer(text: str) -> str | None:
    """The final answer of a response: the last ``<answer>…</answer>`` (its ``\\boxed{}`` if it has one), else
    the last ``\\boxed{…}``; None if neither is present."""
    end = text.rfind("</answer>")
    if end != -1:
        start = text.rfind("<answer>", 0, end)
        if start != -1:
            body = text[start + len("<answer>") : end]
            return (last_boxed(body) or body).strip()
    boxed = last_boxed(text)
    return boxed.strip() if boxed is not None else None


def gsm8k_gold(solution: str) -> str:
    """GSM8K's answer field ends with ``#### <number>``."""
    return normalize(solution.rsplit("####", 1)[-1])


def format_gold(value: Any) -> str:
    """Gold answers as strings: AMC's floats (27.0) become integers where they are whole."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


_GROUPED = re.compile(r"(?:[a-zA-Z]\s*=\s*)?-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")  # a number with thousands separators


def _drop_units(s: str) -> str:
    s = s.strip().strip("$").strip()
    s = re.sub(_TEXT + r"\{\s*" + _UNIT_WORDS + r"\s*\}", "", s)
    return re.sub(r"(?<=\d)\s*" + _UNIT_WORDS + r"\b\.?$", "", s)


def normalize(s: str) -> str:
    """A canonical string: no $, spaces, \\left/\\right, \\text{units}, thousands separators or trailing dots."""
    s = _drop_units(s)
    s = re.sub(_TEXT + r"\{([^{}]*)\}", r"\1", s)
    for old, new in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\ ", ""),
                     ("dfrac", "frac"), ("tfrac", "frac"), ("^\\circ", ""), ("^{\\circ}", ""), ("\\%", ""),
                     ("%", ""), ("\\$", ""), ("\\displaystyle", "")):
        s = s.replace(old, new)
    grouped = _GROUPED.fullmatch(s.strip())  # 1,000 -> 1000; not the tuple "1,2", nor "(20,100)" or "20, 100"
    s = re.sub(r"\s+", "", s)
    if grouped:
        s = s.replace(",", "")
    s = s.rstrip(".")
    if re.fullmatch(r"[a-zA-Z]=.+", s) and "," not in s:
        s = s[2:]  # "x=5" -> "5"
    return s


def words(text: str) -> list[str]:
    """The words and letter sequences of an answer or a gold: runs of two or more letters in ``\\text{}`` (units
    that normalising drops aside) and the runs of the rest that the grammar refuses as words
    (``expressions.word_runs``: three or more letters, or a capital, as in ``ABC``)."""
    s = _ENVIRONMENT.sub(" ", _drop_units(text))
    found = [m.group() for inner in re.findall(_TEXT + r"\{([^{}]*)\}", s)
             for m in re.finditer(r"[A-Za-z]{2,}", inner)]
    # "\triangle ABC" is a command, then ABC: the ";" keeps normalising from joining them
    bare = re.sub(r"\\([a-zA-Z]+)", r"\\\1;", re.sub(_TEXT + r"\{[^{}]*\}", " ", s))
    return found + expressions.word_runs(normalize(bare))


def unit_alias(gold: str) -> str | None:
    """The number of a gold written with its unit in words (``9\\text{ values}`` -> ``9``), else None. An answer
    may give the number alone, or with the same words (then the strings are equal)."""
    m = _GOLD_UNIT.search(gold)
    if m is None or set(m.group(1).lower().replace(".", " ").split()) & _NOT_UNITS:
        return None
    head = re.sub(r"(?:\\[ ,;!]|\s)+$", "", gold[: m.start()])
    if not head or not (head[-1].isdigit() or head[-1] == "}") or re.search(_TEXT, head) or words(head):
        return None
    return head


def _relation_refused(pred: str, p: str, gold: str) -> bool:
    """A chain of relations (``x=6=5``, ``6=x=5``) or a relation whose left side holds no letter (``6=5``,
    ``2+3=5``), in an answer (``pred`` as written, ``p`` normalised, where ``x=`` is gone) to a gold with fewer
    relations: a statement, not a value."""
    count = len(_RELATION.findall(pred))
    if count <= len(_RELATION.findall(gold)):
        return False
    if count >= 2:
        return True
    if not _RELATION.search(p):
        return False  # "x = 5": an assignment, read as its value
    lhs = _RELATION.split(p, maxsplit=1)[0]
    return re.search(r"[a-zA-Z]", re.sub(r"\\[a-zA-Z]+", "", lhs)) is None


def _rational(s: str) -> Fraction | None:
    if len(s) > MAX_CHARS:  # int() of thousands of digits is slow; such an answer gets only the string check
        return None
    m = (re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}", s, re.ASCII)
         or re.fullmatch(r"(-?)\\frac(\d)(\d)", s, re.ASCII))
    try:
        if m:
            value = Fraction(int(m.group(2)), int(m.group(3)))
            return -value if m.group(1) else value
        if re.fullmatch(r"-?\d+(?:\.\d*)?(?:/\d+)?|-?\.\d+", s, re.ASCII):
            return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def _same_value(value: Fraction, gold: Fraction, tolerance: Fraction | None) -> bool:
    """Exactly the gold's value, or within the gold's relative tolerance (a decimal gold; never absolute)."""
    return value == gold or (tolerance is not None and abs(value - gold) <= tolerance * abs(gold))


def _grammar(s: str) -> expressions.Node | None:
    try:
        return expressions.parse(s)
    except expressions.ExpressionError:
        return None


def check_answer(pred: str | None, gold: Any, isolation: str = "jail",
                 user: str | None = "nobody") -> tuple[float, dict[str, Any]]:
    """Reward 1.0 if ``pred`` is equivalent to ``gold`` (a string or a list of aliases), else 0.0, plus info.
    ``isolation`` and ``user``: the jail the symbolic check runs in (those of the env's sandbox)."""
    golds = [format_gold(g) for g in gold] if isinstance(gold, list | tuple) else [format_gold(gold)]
    info: dict[str, Any] = {"gold": golds[0], "parsed_answer": None, "method": None}
    if not isinstance(pred, str) or not pred.strip():
        info["method"] = "no_answer"
        return 0.0, info
    inner = extract_answer(pred) if ("\\boxed" in pred or "<answer>" in pred) else None
    pred = (inner if inner is not None else pred).strip()
    p = normalize(pred)
    info["parsed_answer"] = p
    pred_words = words(pred) if len(p) <= MAX_CHARS else []  # a longer answer gets the string check only
    pred_tree: expressions.Node | None = None
    if len(p) <= MAX_CHARS and not pred_words:
        try:
            pred_tree = expressions.parse(p)
        except expressions.TooLarge as e:
            info.update(method="too_large", note=f"the answer was not evaluated ({e}); it counts as wrong")
            return 0.0, info
        except expressions.ExpressionError:
            pass
    pred_value = expressions.exact_value(pred_tree) if pred_tree is not None else None
    symbolic: list[tuple[str, str]] = []
    for g_raw in [alias for g in golds for alias in (g, unit_alias(g)) if alias is not None]:
        g = normalize(g_raw)
        if p == g:
            info["method"] = "exact"
            return 1.0, info
        if pred_words or words(g_raw):
            if p.casefold() == g.casefold():
                info["method"] = "exact"
                return 1.0, info
            continue  # a word or letter sequence is its letters in their order: no other check may reorder them
        if _relation_refused(pred, p, g_raw):
            continue
        tolerance = expressions.relative_tolerance(g)
        pr, gr = _rational(p), _rational(g)
        if pr is not None and gr is not None:
            if _same_value(pr, gr, tolerance):
                info["method"] = "numeric"
                return 1.0, info
            continue  # two plain numbers that differ: no symbolic check can make them equal
        gold_tree = _grammar(g) if pred_value is not None else None
        gold_value = expressions.exact_value(gold_tree) if gold_tree is not None else None
        if pred_value is not None and gold_value is not None:
            if _same_value(pred_value, gold_value, tolerance):
                info["method"] = "numeric"
                return 1.0, info
            continue  # two exact rationals that differ
        if len(p) <= MAX_CHARS and len(g) <= MAX_CHARS:
            symbolic.append((g_raw, g))
    if symbolic:
        raw = pred if len(pred) <= MAX_CHARS else p  # math-verify reads the raw LaTeX when it is short
        outcome = jailed.symbolic_check(symbolic, raw, p, isolation=isolation, user=user)
        if not outcome.ok:
            info.update(method="timeout" if outcome.timed_out else "error",
                        note=f"the symbolic check stopped ({outcome.error}); the answer counts as wrong")
            return 0.0, info
        verdict = outcome.value
        info.update(parsed_gold=verdict["gold"], parsed_answer=verdict["answer"] or p)
        if verdict["method"] is not None:
            info["method"] = verdict["method"]
            return 1.0, info
    info["method"] = "mismatch"
    return 0.0, info
