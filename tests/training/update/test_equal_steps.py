"""Equal optimiser steps per RL step (``optim.mini_batches``) whatever the number of trained nodes, and the
shuffled-advantage control (``optim.shuffle_advantages``), on the real learner with the nano model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trace_gym.training.config import ModelConfig, OptimConfig
from trace_gym.training.update.learner import Learner, mini_batches
from trace_gym.training.update.samples import Sample


@pytest.fixture(scope="module")
def nano_dir(tmp_path_factory):
    from trace_gym.agents.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("nano"), size="nano", seed=0)


def samples(n: int, seed: int = 0) -> list[Sample]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        context = rng.integers(5, 200, size=int(rng.integers(4, 12))).tolist()
        action = rng.integers(5, 200, size=int(rng.integers(2, 6))).tolist()
        out.append(Sample(context, action, [-3.0] * len(action), float(rng.normal()) + (1.0 if i % 2 else -1.0)))
    return out


def learner(model_dir, **optim) -> Learner:
    cfg = OptimConfig(**{"lr": 1e-3, "mini_batch": 4, "micro_batch": 4, "update": "rows", **optim})
    return Learner(ModelConfig(path=str(model_dir)), cfg, str(model_dir), torch.device("cpu"))


def test_mini_batches_cut_the_order_into_equal_parts_or_fixed_sizes() -> None:
    assert mini_batches(range(10), 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    parts = mini_batches(range(10), 4, count=3)
    assert [len(p) for p in parts] == [4, 3, 3] and [i for p in parts for i in p] == list(range(10))
    assert mini_batches(range(2), 4, count=3) == [[0], [1]]  # fewer nodes than steps: one node each


def test_a_fixed_count_takes_the_same_optimiser_steps_for_few_and_many_nodes(nano_dir) -> None:
    for n in (6, 23):
        stats = learner(nano_dir, mini_batches=3, epochs=2).update(samples(n), seed=0, pad_id=0)
        assert stats["loss/optimizer_steps"] == 6 and stats["loss/nodes"] == n
    stats = learner(nano_dir).update(samples(23), seed=0, pad_id=0)
    assert stats["loss/optimizer_steps"] == 6  # ceil(23 / 4) with mini_batch alone


def test_shuffled_advantages_keep_the_values_and_change_the_update(nano_dir) -> None:
    batch = samples(16, seed=1)
    states = {}
    for shuffle in (False, True):
        lrn = learner(nano_dir, shuffle_advantages=shuffle, optimizer="sgd", lr=0.5)
        stats = lrn.update(batch, seed=3, pad_id=0)
        states[shuffle] = {k: v.clone() for k, v in lrn.model.state_dict().items()}
        assert stats["loss/advantage_abs_mean"] == pytest.approx(np.mean([abs(s.advantage) for s in batch]))
    moved = sum(float((states[True][k] - states[False][k]).abs().sum()) for k in states[True])
    assert moved > 0
    assert [s.advantage for s in batch] == [s.advantage for s in samples(16, seed=1)]  # the caller's untouched
