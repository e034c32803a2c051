"""The plans of the named allocators, pinned: on the simulation env, with fixed seeds and either fixed predictor
values or the predictor their config builds, each step's root counts and continuation counts are written out
below. The allocators, the predictor and the step are reached only through the names a run uses
(``make_allocator``, ``make_predictor``, ``take_step``), so code may move between modules while a row of the
learning benchmark (``benchmarks/learning.py``: allocator and predictor overrides) keeps its plans exactly.

The plans are computed in a child process with a fixed ``PYTHONHASHSEED``: the text predictor visits each
feature group's tokens as a set, whose order follows the string hash, and a different summation order moves its
values in the last bits, enough to tip a tie in the prefix solver now and then."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trace_gym.training.allocation.allocators import make_allocator
from trace_gym.training.allocation.predictor import Prefix
from trace_gym.training.config import StepBudget, load_config
from trace_gym.training.driver.builders import make_predictor
from trace_gym.training.simulation import SimCollector, make_tasks
from trace_gym.training.step import take_step

CALIBRATED = ("predictor.target=children", "predictor.calibrate=true", "predictor.replay=4")
"""The predictor overrides of the learning benchmark's trace_plus, trace_root and trace_root_uniform rows."""

Plan = tuple[dict[str, int], dict[str, dict[int, int]]]
"""One step: {task id: root rollouts} (refunded roots included), {task id: {node id: continuations}}."""


class FixedValues:
    """A predictor whose value of a prefix is a fixed function of its task id and turns; it never learns."""

    def predict(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        return np.array([zlib.crc32(f"{p.task_id}|{p.turns}".encode()) % 1000 / 1000 for p in prefixes])

    def fit(self, prefixes: Sequence[Prefix], targets: np.ndarray, weights: np.ndarray) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


def plans(allocator: str, predictor: str) -> list[Plan]:
    """Three steps of ``allocator`` on overlapping pools of the simulation's tasks; ``predictor`` is "fixed"
    (`FixedValues`) or "config" (built from the allocator's row overrides, learning from step to step)."""
    overrides = CALIBRATED if allocator in ("trace_plus", "trace_root", "trace_root_uniform") else ()
    cfg = load_config(None, [f"alloc.allocator={allocator}", *overrides])
    alloc = make_allocator(cfg.alloc.allocator, cfg.alloc.group_size, cfg.alloc.cap)
    pred = FixedValues() if predictor == "fixed" else make_predictor(cfg, lambda: pytest.fail("no hidden states"))
    tasks = make_tasks(24, seed=3)
    collector = SimCollector(tasks)
    out: list[Plan] = []
    for step in (1, 2, 3):
        pool = tasks[(step - 1) * 6 : (step - 1) * 6 + 12]
        result = take_step(
            collector, alloc, pred, pool, StepBudget(8, 2), seed=11, step=step, predictor_target=cfg.predictor.target
        )
        continuations: dict[str, dict[int, int]] = {}
        for (tid, node), k in sorted(result.plan.counts().items()):
            continuations.setdefault(tid, {})[node] = k
        out.append((dict(sorted(result.roots.counts.items())), continuations))
    return out


CASES = [(name, "fixed") for name in ("trace_plus", "trace", "pcl", "grpo", "treepo")] + [
    (name, "config") for name in ("trace_plus", "trace_root", "trace_root_uniform", "trace", "pcl", "grpo", "treepo")
]

EXPECTED: dict[tuple[str, str], list[Plan]] = {
    ("trace_plus", "fixed"): [
        (
            {"sim-1": 3, "sim-10": 2, "sim-11": 3, "sim-3": 3, "sim-4": 2, "sim-6": 3},
            {"sim-1": {0: 2}, "sim-10": {0: 2, 1: 2}, "sim-3": {0: 2}},
        ),
        (
            {"sim-10": 3, "sim-12": 3, "sim-16": 2},
            {
                "sim-10": {0: 2, 1: 1, 2: 1, 3: 2},
                "sim-12": {1: 1, 3: 1, 6: 1, 7: 1, 9: 1, 11: 1},
                "sim-16": {2: 2, 3: 1, 4: 1},
            },
        ),
        (
            {"sim-12": 3, "sim-14": 2, "sim-15": 2, "sim-16": 3},
            {
                "sim-12": {1: 1, 3: 1, 6: 1, 7: 1},
                "sim-14": {1: 1, 3: 1, 5: 1, 7: 1},
                "sim-16": {0: 1, 1: 1, 3: 1, 5: 1, 7: 1, 11: 1},
            },
        ),
    ],
    ("trace", "fixed"): [
        ({"sim-1": 3, "sim-10": 2, "sim-3": 3}, {"sim-1": {0: 6}, "sim-10": {1: 4}, "sim-3": {0: 6}}),
        (
            {"sim-10": 3, "sim-12": 3, "sim-16": 2},
            {
                "sim-10": {1: 2, 2: 2, 3: 2},
                "sim-12": {1: 1, 3: 1, 6: 1, 7: 1, 9: 1, 11: 1},
                "sim-16": {2: 2, 3: 1, 4: 1},
            },
        ),
        (
            {"sim-12": 3, "sim-14": 2, "sim-16": 3},
            {
                "sim-12": {1: 1, 3: 2, 6: 1, 7: 2},
                "sim-14": {1: 1, 3: 1, 5: 1, 7: 1},
                "sim-16": {1: 1, 3: 1, 5: 1, 7: 1, 9: 1, 11: 1},
            },
        ),
    ],
    ("pcl", "fixed"): [
        ({"sim-1": 8, "sim-10": 8, "sim-3": 8}, {}),
        ({"sim-10": 8, "sim-12": 8, "sim-16": 8}, {}),
        ({"sim-12": 8, "sim-14": 8, "sim-16": 8}, {}),
    ],
    ("grpo", "fixed"): [
        ({"sim-11": 8, "sim-2": 8, "sim-3": 8}, {}),
        ({"sim-14": 8, "sim-15": 8, "sim-7": 8}, {}),
        ({"sim-12": 8, "sim-14": 8, "sim-22": 8}, {}),
    ],
    ("treepo", "fixed"): [
        ({"sim-3": 8}, {"sim-3": {3: 7, 4: 5, 5: 2, 11: 2}}),
        ({"sim-7": 8}, {"sim-7": {1: 1, 2: 2, 3: 1, 6: 5, 9: 1, 12: 3, 14: 3}}),
        ({"sim-12": 8}, {"sim-12": {1: 2, 3: 1, 11: 1, 15: 1, 16: 2, 18: 1, 19: 1, 24: 1, 26: 3, 27: 2, 28: 1}}),
    ],
    ("trace_plus", "config"): [
        (
            {"sim-0": 3, "sim-1": 3, "sim-2": 2, "sim-3": 2},
            {"sim-0": {1: 1, 2: 1, 3: 1, 6: 1, 7: 1, 8: 1}, "sim-1": {0: 2, 2: 2}, "sim-2": {1: 1, 2: 1, 3: 1, 5: 1}},
        ),
        (
            {"sim-11": 3, "sim-15": 2, "sim-17": 3, "sim-6": 3, "sim-8": 3, "sim-9": 2},
            {"sim-15": {1: 1, 2: 1, 3: 1}, "sim-17": {3: 1, 4: 1, 5: 1}, "sim-6": {0: 1, 2: 1}},
        ),
        (
            {"sim-12": 3, "sim-14": 2, "sim-22": 3},
            {
                "sim-12": {1: 1, 2: 1, 3: 1, 5: 1, 6: 1, 7: 1},
                "sim-14": {0: 1, 2: 1, 3: 1, 7: 1},
                "sim-22": {0: 1, 1: 2, 3: 2, 5: 1},
            },
        ),
    ],
    ("trace_root", "config"): [
        (
            {"sim-0": 3, "sim-1": 3, "sim-2": 2},
            {"sim-0": {1: 1, 2: 1, 3: 1, 6: 1, 7: 1, 8: 1}, "sim-1": {0: 3, 2: 3}, "sim-2": {1: 1, 2: 1, 3: 1, 5: 1}},
        ),
        (
            {"sim-11": 2, "sim-6": 3, "sim-8": 3},
            {"sim-11": {0: 2, 2: 1, 3: 1}, "sim-6": {0: 3, 2: 3}, "sim-8": {1: 1, 5: 2, 6: 1, 7: 1, 9: 1}},
        ),
        (
            {"sim-12": 3, "sim-14": 2, "sim-16": 3},
            {
                "sim-12": {1: 1, 2: 1, 3: 1, 5: 1, 6: 1, 7: 1},
                "sim-14": {0: 1, 2: 1, 3: 1, 7: 1},
                "sim-16": {0: 1, 2: 1, 3: 1, 6: 1, 7: 1, 11: 1},
            },
        ),
    ],
    ("trace_root_uniform", "config"): [
        (
            {"sim-0": 3, "sim-1": 3, "sim-2": 2},
            {"sim-0": {2: 3, 3: 2, 7: 1}, "sim-1": {0: 5, 2: 1}, "sim-2": {2: 3, 3: 1}},
        ),
        (
            {"sim-11": 2, "sim-6": 3, "sim-8": 3},
            {"sim-11": {0: 1, 2: 2, 3: 1}, "sim-6": {0: 5, 2: 1}, "sim-8": {2: 1, 5: 3, 9: 1, 10: 1}},
        ),
        (
            {"sim-12": 3, "sim-14": 2, "sim-16": 3},
            {"sim-12": {1: 3, 2: 1, 5: 1, 7: 1}, "sim-14": {3: 2, 7: 2}, "sim-16": {0: 1, 1: 1, 3: 1, 9: 1, 10: 2}},
        ),
    ],
    ("trace", "config"): [
        (
            {"sim-0": 3, "sim-1": 3, "sim-2": 2},
            {"sim-0": {1: 1, 2: 1, 3: 1, 6: 1, 7: 1, 8: 1}, "sim-1": {2: 6}, "sim-2": {1: 1, 2: 1, 3: 1, 5: 1}},
        ),
        (
            {"sim-13": 3, "sim-17": 2, "sim-9": 3},
            {
                "sim-13": {2: 1, 5: 1, 6: 1, 7: 1, 9: 1, 10: 1},
                "sim-17": {1: 1, 2: 1, 3: 1, 5: 1},
                "sim-9": {1: 2, 3: 2, 5: 2},
            },
        ),
        (
            {"sim-12": 3, "sim-14": 2, "sim-22": 3},
            {
                "sim-12": {1: 1, 2: 1, 3: 1, 5: 1, 6: 1, 7: 1},
                "sim-14": {1: 1, 2: 1, 5: 1, 6: 1},
                "sim-22": {1: 2, 3: 2, 5: 2},
            },
        ),
    ],
    ("pcl", "config"): [
        ({"sim-0": 8, "sim-5": 8, "sim-9": 8}, {}),
        ({"sim-10": 8, "sim-6": 8, "sim-8": 8}, {}),
        ({"sim-12": 8, "sim-13": 8, "sim-14": 8}, {}),
    ],
    ("grpo", "config"): [
        ({"sim-11": 8, "sim-2": 8, "sim-3": 8}, {}),
        ({"sim-14": 8, "sim-15": 8, "sim-7": 8}, {}),
        ({"sim-12": 8, "sim-14": 8, "sim-22": 8}, {}),
    ],
    ("treepo", "config"): [
        ({"sim-3": 8}, {"sim-3": {3: 7, 4: 5, 5: 2, 11: 2}}),
        ({"sim-7": 8}, {"sim-7": {1: 1, 2: 2, 3: 1, 6: 5, 9: 1, 12: 3, 14: 3}}),
        ({"sim-12": 8}, {"sim-12": {1: 2, 3: 1, 11: 1, 15: 1, 16: 2, 18: 1, 19: 1, 24: 1, 26: 3, 27: 2, 28: 1}}),
    ],
}


ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def computed() -> dict[tuple[str, str], list[Plan]]:
    """Every case's plans, from one child process with PYTHONHASHSEED=0 (module docstring)."""
    code = "from tests.training.allocation.test_pinned_plans import main; main()"
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=True
    ).stdout
    rows = json.loads(out)
    return {
        (a, p): [(roots, {tid: {int(n): k for n, k in c.items()} for tid, c in cont.items()}) for roots, cont in steps]
        for a, p, steps in rows
    }


def main() -> None:
    """Print every case's plans as JSON (what `computed` reads)."""
    print(json.dumps([(a, p, plans(a, p)) for a, p in CASES]))


@pytest.mark.parametrize(("allocator", "predictor"), CASES)
def test_an_allocators_plans_are_the_pinned_ones(
    computed: dict[tuple[str, str], list[Plan]], allocator: str, predictor: str
) -> None:
    assert computed[(allocator, predictor)] == EXPECTED[(allocator, predictor)]
