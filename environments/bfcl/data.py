"""BFCL v4 data: bundled JSON Lines files (see environments/data/bfcl/SOURCE.md), splits and tasks."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any, Literal

from trace_gym.environments.records import read_records

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "bfcl"

MULTI_TURN_CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                         "multi_turn_long_context")
SINGLE_TURN_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")

# bfcl_eval/constants/executable_backend_config.py MULTI_TURN_FUNC_DOC_FILE_MAPPING, the eight offline classes.
FUNC_DOC_FILES = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}

Split = Literal["train", "test", "all"]
TRAIN_FRACTION = 0.8
SPLIT_SEED = "trace-gym-bfcl-split-v0"


@cache
def load_entries(category: str) -> tuple[dict[str, Any], ...]:
    """Question records of one category, each with its `ground_truth` (if any) merged in."""
    if category not in MULTI_TURN_CATEGORIES + SINGLE_TURN_CATEGORIES:
        raise ValueError(f"expected a bundled BFCL category {MULTI_TURN_CATEGORIES + SINGLE_TURN_CATEGORIES}, "
                         f"got {category!r}; fix: pick one of those")
    entries = read_records(DATA_DIR / f"BFCL_v4_{category}.json")
    answer_path = DATA_DIR / "possible_answer" / f"BFCL_v4_{category}.json"
    if answer_path.exists():
        answers = {a["id"]: a["ground_truth"] for a in read_records(answer_path)}
        for e in entries:
            e["ground_truth"] = answers[e["id"]]
    return tuple(entries)


@cache
def func_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """BFCL function docs of one multi-turn backend class."""
    return tuple(read_records(DATA_DIR / "multi_turn_func_doc" / FUNC_DOC_FILES[class_name]))


def entry_functions(entry: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """(docs visible from the start, {turn index: docs revealed at that turn}) for a multi-turn entry.

    Mirrors bfcl_eval.utils.populate_test_cases_with_predefined_functions: docs of every involved class, minus
    the miss_func held-out ones, which come back at their turn."""
    docs = [dict(d) for c in entry["involved_classes"] for d in func_docs(c)]
    held: dict[int, list[dict[str, Any]]] = {}
    for turn, names in entry.get("missed_function", {}).items():
        for name in names:
            i = next(i for i, d in enumerate(docs) if d["name"] == name)
            held.setdefault(int(turn), []).append(docs.pop(i))
    return docs, held


def split_ids(ids: Sequence[str], split: Split, seed: str = SPLIT_SEED) -> list[str]:
    """Deterministic 80/20 split: order ids by a seeded hash, the first 80% are train.

    A hash (not a shuffle) keeps an id's side fixed whatever else is in the list."""
    if split not in ("train", "test", "all"):
        raise ValueError(f"expected split 'train', 'test' or 'all', got {split!r}; fix: use one of those")
    if split == "all":
        return list(ids)
    ranked = sorted(ids, key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).hexdigest())
    n_train = round(TRAIN_FRACTION * len(ranked))
    chosen = set(ranked[:n_train] if split == "train" else ranked[n_train:])
    return [i for i in ids if i in chosen]
