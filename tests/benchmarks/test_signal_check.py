"""The shuffled-advantage check: its pieces, and one run on the nano model that leaves the trainer unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.studies.signal_check import shuffled, signal_check
from tests.training.driver.test_trainer import nano_dir, tiny_config  # noqa: F401 - the module-scoped model fixture
from trace_gym.training.driver.trainer import Trainer
from trace_gym.training.rollout.evaluate import expert_sequences
from trace_gym.training.stats import PairedDifference
from trace_gym.training.update.samples import Sample


def test_shuffled_permutes_advantages_and_keeps_the_tokens():
    samples = [Sample([1, 2], [3 + i], [-0.5], float(a)) for i, a in enumerate([1.0, -1.0, 0.5, -0.5, 2.0])]
    out = shuffled(samples, np.random.default_rng(0))
    assert sorted(s.advantage for s in out) == sorted(s.advantage for s in samples)
    assert [(s.context, s.action, s.logprobs) for s in out] == [(s.context, s.action, s.logprobs) for s in samples]
    assert [s.advantage for s in out] != [s.advantage for s in samples]


@pytest.mark.slow
def test_signal_check_reports_paired_arms_and_restores_the_trainer(tmp_path, nano_dir):  # noqa: F811
    cfg = tiny_config(tmp_path / "run", nano_dir)
    trainer = Trainer(cfg)
    try:
        before = [p.detach().clone() for p in trainer.model.parameters()]
        position, predictor = trainer.stream.position, trainer.predictor.state_dict()
        out = signal_check(trainer, repeats=2, tasks=4, samples=2, measure="sampled")
        assert out["tasks"] == 4 and out["repeats"] == 2 and out["nodes"] > 0
        for key in ("true_vs_before", "shuffled_vs_before", "true_vs_shuffled"):
            assert isinstance(out[key], PairedDifference)
            assert out[key].tasks == 4 and -1.0 <= out[key].mean <= 1.0
        assert out["true_vs_shuffled"].mean == pytest.approx(out["true"] - out["shuffled"])
        assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
        assert trainer.stream.position == position and not trainer.learner.optimizer.state
        assert np.array_equal(trainer.predictor.state_dict()["w"], predictor["w"])  # the step's fit undone
    finally:
        trainer.close()


def test_expert_sequences_follow_the_task_order_and_mask_only_the_experts_turns(tmp_path, nano_dir):  # noqa: F811
    from transformers import AutoTokenizer

    from trace_gym.env_specs import env_factory, env_tasks

    make_env = env_factory("trace/Arithmetic-v0", {"n_tasks": 6, "task_seed": 3})
    tasks = env_tasks(make_env)[::-1][:3]
    tok = AutoTokenizer.from_pretrained(nano_dir)
    seqs = expert_sequences(make_env, tasks, tok)
    assert len(seqs) == 3
    for (ids, mask), task in zip(seqs, tasks):
        assert len(ids) == len(mask) and any(mask) and not all(mask)
        assert str(task.answer) in tok.decode([i for i, m in zip(ids, mask) if m])
