"""How often a gamed answer passes each QA reward, and how often a correct answer written differently does.

Cases are built from the bundled QA samples (train and dev files with gold answers):
- hedge: a 2WikiMultihopQA comparison question whose gold is one of its two entities, answered "A or B" (both
  orders);
- wrong year: every gold that is a full date, with the year changed by one;
- padding: every one-token gold followed by four words ("X, as the passages say");
- accents stripped: every gold with a non-ASCII letter, written in ASCII;
- dash: every gold holding a year range written with an en dash, written with a hyphen; and every full-date
  gold written the other way round ("December 25, 1506" for "25 December 1506").
Rewards: the previous default (the official HotpotQA normalisation, token F1 >= 0.3), "f1" (the same threshold
with this project's normalisation) and "em" (the default: normalised exact match). Prints a table and writes
benchmarks/results/qa_rewards.json.
"""

from __future__ import annotations

import json
import re
import string
import unicodedata
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from trace_gym.environments.qa.data import BUNDLED, load_bundled
from trace_gym.environments.qa.metrics import fold_unicode, normalize_answer, qa_reward, score_answer

RESULTS = Path(__file__).parent / "results"
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
_FULL_DATE = re.compile(rf"^(\d{{1,2}}) ({'|'.join(_MONTHS)}) (\d{{3,4}})$")


def official_f1_reward(prediction: str, golds: list[str]) -> float:
    """The reward before this change: HotpotQA's official normalisation and token F1 >= 0.3."""
    def norm(text: str) -> str:
        text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
        return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())

    def f1(pred: str, gold: str) -> float:
        p, g = norm(pred).split(), norm(gold).split()
        if (norm(pred) in ("yes", "no", "noanswer") or norm(gold) in ("yes", "no", "noanswer")) and p != g:
            return 0.0
        common = sum((Counter(p) & Counter(g)).values())
        return 0.0 if common == 0 else 2 * common / (len(p) + len(g))

    return float(max(f1(prediction, g) for g in golds) >= 0.3)


def gold_sets() -> list[tuple[str, str, list[str], dict]]:
    """(dataset, question, golds, meta) of every bundled task with a gold answer."""
    out = []
    for dataset, splits in BUNDLED.items():
        for split in splits:
            out += [(dataset, t.prompt, list(t.answer), dict(t.meta)) for t in load_bundled(dataset, split).tasks]
    return out


def cases() -> dict[str, list[tuple[str, list[str]]]]:
    tasks = gold_sets()
    found: dict[str, list[tuple[str, list[str]]]] = {k: [] for k in
                                                       ("hedge", "wrong year", "padding", "accents stripped",
                                                        "en dash -> hyphen", "date order")}
    for dataset, _, golds, meta in tasks:
        gold = golds[0]
        if dataset == "2wiki" and meta.get("type") == "comparison":
            entities = meta.get("supporting_titles", [])
            others = [e for e in entities if normalize_answer(e) != normalize_answer(gold)]
            if len(entities) == 2 and len(others) == 1:
                found["hedge"] += [(f"{others[0]} or {gold}", golds), (f"{gold} or {others[0]}", golds)]
        date = _FULL_DATE.match(gold)
        if date:
            day, month, year = date.groups()
            found["wrong year"].append((f"{day} {month} {int(year) + 1}", golds))
            found["date order"].append((f"{month} {day}, {year}", golds))
        if len(normalize_answer(gold).split()) == 1 and normalize_answer(gold) not in ("yes", "no"):
            found["padding"].append((f"{gold}, as the passages say", golds))
        if any(ord(ch) > 127 and unicodedata.category(ch).startswith("L") for ch in gold):
            found["accents stripped"].append((fold_unicode(gold), golds))
        if re.search(r"\d\s*–\s*\d", gold):
            found["en dash -> hyphen"].append((gold.replace("–", "-"), golds))
    return found


def main() -> None:
    rows = []
    for case, items in cases().items():
        row = {"case": case, "n": len(items), "gamed": case in ("hedge", "wrong year", "padding")}
        row["previous (official F1>=0.3)"] = sum(official_f1_reward(a, g) for a, g in items)
        for name in ("f1", "em"):
            row[name] = sum(qa_reward(name, score_answer(a, g)) for a, g in items)
        rows.append(row)
    table = Table("case", "kind", "answers", "previous default: official F1 >= 0.3", "f1 (normalised)", "em (default)",
                  title="Answers that score 1, per reward (gamed answers should not; legitimate ones should)")
    for r in rows:
        counts = (f"{r[k]:.0f} ({r[k] / max(r['n'], 1):.0%})" for k in ("previous (official F1>=0.3)", "f1", "em"))
        table.add_row(r["case"], "gamed" if r["gamed"] else "legitimate", str(r["n"]), *counts)
    console = Console(width=140)
    console.print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "qa_rewards.json"
    out.write_text(json.dumps(rows, indent=2))
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
