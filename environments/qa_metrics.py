"""Answer scoring as in the official HotpotQA evaluation: normalised exact match and token F1.

Normalisation: lowercase, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace. A
prediction of yes/no/noanswer scores F1 0 against a different gold answer (the official rule: these
one-token answers must match exactly). Against several gold answers (aliases) the best score counts.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

__all__ = ["exact_match", "f1_score", "normalize_answer", "score_answer", "token_f1"]

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SPECIAL = frozenset({"yes", "no", "noanswer"})


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
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
    """{"em", "f1", "success"}: best over the gold answer and its aliases; success = f1 >= threshold."""
    golds = _golds(gold)
    em = max((exact_match(prediction, g) for g in golds), default=0.0)
    f1 = f1_score(prediction, golds)
    return {"em": em, "f1": f1, "success": float(f1 >= threshold)}
