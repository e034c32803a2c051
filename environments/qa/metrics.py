"""Answer scoring for multi-hop QA: normalised exact match (the training reward), token F1 and the paper's
F1 >= 0.3 accuracy (evaluation). Why exact match is the reward: docs/rewards.md.

Normalisation, shared by every metric (the official HotpotQA/SQuAD rules plus what they miss):
1. Unicode: NFKD, combining marks dropped, and the letters NFKD leaves alone folded (ø -> o, æ -> ae, ß -> ss,
   ł -> l, ...), so "Najera" matches "Nájera" and "Faro" matches "Fårö". The spacing modifier letters and
   accents of U+02B0-U+02FF (the okina ʻ, the modifier apostrophe ʼ, stress marks) go too, so "Hawaii" matches
   "Hawaiʻi"; modifier letters of other scripts (Japanese ー, 々) are letters of their words and stay.
2. Lowercase; dates written as "17 December 1913", "December 17, 1913", "Dec. 17th, 1913" or "1913-12-17"
   become one form; a trailing Wikipedia disambiguator such as "(film)" or "(2012 album)" is dropped.
3. Every dash (hyphen, en dash, em dash, minus) and slash becomes a space, so "1950-1953" matches
   "1950–1953" (the official script deletes ASCII hyphens and keeps en dashes, so these never matched).
4. ASCII and Unicode punctuation deleted; the articles a/an/the dropped; whitespace collapsed.

Token F1 keeps the official rule that yes/no/noanswer predictions score 0 against a different gold. Against
several gold answers (aliases) the best score counts.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Literal

__all__ = [
    "QA_REWARDS",
    "QAReward",
    "exact_match",
    "f1_score",
    "fold_unicode",
    "normalize_answer",
    "qa_reward",
    "score_answer",
    "token_f1",
]

QAReward = Literal["em", "f1"]

_FOLD = str.maketrans({"ø": "o", "Ø": "O", "æ": "ae", "Æ": "AE", "œ": "oe", "Œ": "OE", "ß": "ss", "ł": "l",
                       "Ł": "L", "đ": "d", "Đ": "D", "ð": "d", "Ð": "D", "þ": "th", "Þ": "Th", "ı": "i",
                       "ħ": "h", "Ħ": "H", "ŋ": "ng"})
_ASCII_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SPECIAL = frozenset({"yes", "no", "noanswer"})
_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december")
_MONTH_OF = {**{m: m for m in _MONTHS}, **{m[:3]: m for m in _MONTHS}, "sept": "september"}
_MONTH = r"(" + "|".join(sorted(_MONTH_OF, key=len, reverse=True)) + r")\.?"
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_DAY_MONTH_YEAR = re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}\s*,?\s+(\d{{1,4}})\b")
_MONTH_DAY_YEAR = re.compile(rf"\b{_MONTH}\s+{_DAY}\s*,?\s+(\d{{1,4}})\b")
_ISO_DATE = re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b")
_DISAMBIGUATOR = re.compile(
    r"\s*\((?:\d{4}\s+)?(?:film|movie|album|song|single|band|novel|book|play|musical|tv series|series|"
    r"video game|game|opera|magazine|newspaper|company|ship|river|city|town|village|actor|actress|singer|"
    r"musician|footballer|politician|writer|director|artist)\)\s*$")


def _is_mark(ch: str) -> bool:
    """A combining mark, or a spacing modifier letter or accent of U+02B0-U+02FF (module docstring, rule 1)."""
    return bool(unicodedata.combining(ch)) or ("\u02b0" <= ch <= "\u02ff" and unicodedata.category(ch) in ("Lm", "Sk"))


def fold_unicode(text: str) -> str:
    """Accents and ligatures to plain letters: NFKD, combining marks and spacing modifiers dropped, then the letters
    NFKD keeps."""
    decomposed = unicodedata.normalize("NFKD", text.translate(_FOLD))
    return "".join(ch for ch in decomposed if not _is_mark(ch))


def _date(day: str, month: str, year: str) -> str:
    return f"{int(day)} {_MONTH_OF[month]} {int(year)}"


def _canonical_dates(text: str) -> str:
    """Lowercased text with every full date as "<day> <month> <year>" (no leading zeros)."""
    def iso(m: re.Match[str]) -> str:
        year, month, day = m.groups()
        return _date(day, _MONTHS[int(month) - 1], year) if 1 <= int(month) <= 12 else m.group(0)

    text = _ISO_DATE.sub(iso, text)
    text = _MONTH_DAY_YEAR.sub(lambda m: _date(m.group(2), m.group(1), m.group(3)), text)
    return _DAY_MONTH_YEAR.sub(lambda m: _date(m.group(1), m.group(2), m.group(3)), text)


def _is_punct(ch: str) -> bool:
    return ch in _ASCII_PUNCT or unicodedata.category(ch).startswith("P")


def _is_separator(ch: str) -> bool:
    return ch in "/\\" or ch == "\u2212" or unicodedata.category(ch) == "Pd"


def normalize_answer(text: str) -> str:
    """The normalised form every metric compares (see the module docstring)."""
    text = _DISAMBIGUATOR.sub("", _canonical_dates(fold_unicode(str(text)).lower()))
    text = "".join(" " if _is_separator(ch) else "" if _is_punct(ch) else ch for ch in text)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, gold: str) -> float:
    """Token-level F1 between one prediction and one gold answer (after normalisation)."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if (pred in _SPECIAL or ref in _SPECIAL) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    common = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred_tokens)
    recall = common / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def _golds(gold: str | Sequence[str]) -> list[str]:
    return [gold] if isinstance(gold, str) else [str(g) for g in gold]


def f1_score(prediction: str, gold: str | Sequence[str]) -> float:
    return max((token_f1(prediction, g) for g in _golds(gold)), default=0.0)


def score_answer(prediction: str, gold: str | Sequence[str], threshold: float = 0.3) -> dict[str, float]:
    """{"em", "f1", "accuracy"}: best over the gold answer and its aliases; accuracy = f1 >= threshold (the
    TRACE paper's QA accuracy)."""
    golds = _golds(gold)
    em = max((exact_match(prediction, g) for g in golds), default=0.0)
    f1 = f1_score(prediction, golds)
    return {"em": em, "f1": f1, "accuracy": float(f1 >= threshold)}


QA_REWARDS: dict[str, Callable[[dict[str, float]], float]] = {
    "em": lambda scores: scores["em"],
    "f1": lambda scores: scores["accuracy"],
}
"""Training rewards by name, from ``score_answer``'s scores: "em" (the default: normalised exact match against
the gold answer or an alias) and "f1" (the paper's F1 >= 0.3; a hedge or padded answer passes it)."""


def qa_reward(name: str, scores: dict[str, float]) -> float:
    return QA_REWARDS[name](scores)
