"""Several envs in one run (`env.mix`): the weighted draw across envs, the config, the predictor's env feature
and a real two-env training run on the nano model (per-env metrics, held-out success per env, resume)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.training.parity_env import ENTRY_POINT
from trace_gym.env_mix import EnvMix, env_of, qualify, short_name, weighted_order
from trace_gym.errors import ConfigError
from trace_gym.tasks import Task
from trace_gym.training.allocation.predictor import FeaturePredictor, Prefix
from trace_gym.training.config import TrainConfig, apply_overrides
from trace_gym.training.driver.metrics_log import read_metrics
from trace_gym.training.driver.mix import MixedStream
from trace_gym.training.driver.trainer import TaskStream, Trainer


@pytest.mark.parametrize("weights", [{"a": 1.0, "b": 1.0}, {"a": 3.0, "b": 1.0}, {"a": 0.2, "b": 0.5, "c": 0.3}])
def test_the_weighted_draw_keeps_every_env_within_one_of_its_share(weights):
    order = weighted_order(weights, {}, 200)
    total = sum(weights.values())
    for n in range(1, 201):
        for key, w in weights.items():
            assert abs(order[:n].count(key) - n * w / total) < 1


def test_the_weighted_draw_continues_from_its_counts_alone():
    weights = {"a": 2.0, "b": 1.0, "c": 1.0}
    first = weighted_order(weights, {}, 7)
    rest = weighted_order(weights, {k: first.count(k) for k in weights}, 13)
    assert first + rest == weighted_order(weights, {}, 20)


def test_a_split_by_weight_sums_to_the_whole():
    mix = EnvMix.of({"a": (ENTRY_POINT, {}, 2.0), "b": (ENTRY_POINT, {}, 1.0)})
    assert mix.split(9) == {"a": 6, "b": 3} and mix.split(10) == {"a": 7, "b": 3} and mix.split(0) == {"a": 0, "b": 0}


def test_task_ids_are_namespaced_by_their_env_key():
    assert short_name("trace/Arithmetic-v0") == "Arithmetic" and short_name("my_envs:CapitalsEnv") == "CapitalsEnv"
    task = qualify("math", Task("train-3", "Compute 1+2."))
    assert task.id == "math/train-3" and env_of(task.id) == "math" and task.prompt == "Compute 1+2."
    mix = EnvMix.of({"even": (ENTRY_POINT, {"n_tasks": 2}, 1.0)})
    assert [t.id for t in mix.tasks()["even"]] == ["even/p0-0", "even/p0-1"]
    with pytest.raises(ConfigError, match="operator's env keys"):
        mix.factory_of("trace/Arithmetic-v0/x")


def test_the_mixed_stream_draws_by_weight_and_resumes_from_its_positions():
    mix = EnvMix.of({"a": (ENTRY_POINT, {"n_tasks": 6}, 2.0), "b": (ENTRY_POINT, {"n_tasks": 6, "task_seed": 1}, 1.0)})
    stream = MixedStream.of(mix, 0, TaskStream)
    pools = [stream.take(3) for _ in range(4)]
    assert all([env_of(t.id) for t in pool].count("a") == 2 for pool in pools)
    # Each env's prompts come in its own seeded shuffle: every prompt of "a" once in its first 6 draws.
    assert sorted(t.id for pool in pools[:3] for t in pool if env_of(t.id) == "a") == [f"a/p0-{i}" for i in range(6)]
    again = MixedStream.of(mix, 0, TaskStream)
    again.positions = {"a": 4, "b": 2}
    assert stream.positions == {"a": 8, "b": 4} and again.take(6) == [t for pool in pools[2:] for t in pool]
    with pytest.raises(ConfigError, match=r"resume with the env\.mix"):
        again.positions = {"a": 1}


def test_config_mix_entries_and_their_errors():
    entries = [{"id": "trace/Arithmetic-v0", "weight": 2}, {"id": "trace/ArithmeticChain-v0"}]
    cfg = TrainConfig.from_dict({"env": {"mix": entries}})
    assert [(e.key_name, e.weight) for e in cfg.env.mix] == [("Arithmetic", 2.0), ("ArithmeticChain", 1.0)]
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg  # config.yaml round-trips
    data = apply_overrides({"env": {"mix": entries}}, ["env.mix.1.weight=3", "env.mix.0.kwargs.n_tasks=5"])
    assert data["env"]["mix"][1]["weight"] == 3 and data["env"]["mix"][0]["kwargs"] == {"n_tasks": 5}
    with pytest.raises(ConfigError, match="an index below 2"):
        apply_overrides({"env": {"mix": entries}}, ["env.mix.2.weight=3"])
    cases = {"not both": {"id": ENTRY_POINT, "mix": entries}, "distinct name": {"mix": [entries[0], entries[0]]},
             r"weight > 0": {"mix": [{"id": ENTRY_POINT, "weight": 0}]},
             "name as": {"mix": [{"id": ENTRY_POINT, "name": "../x"}]}}
    for message, env in cases.items():
        with pytest.raises(ConfigError, match=message):
            TrainConfig.from_dict({"env": env})


def test_the_predictor_learns_an_env_apart_only_when_told_the_env():
    """Prompts of one text in two envs, one always solved and one never: the env feature carries that to
    prompts never seen; without it (a one-env run) the features are as they always were."""
    train = [Prefix(f"{env}/t{i}", "Same words.") for env in ("easy", "hard") for i in range(20)]
    targets = np.array([1.0] * 20 + [0.0] * 20)
    unseen = [Prefix("easy/new", "Same words."), Prefix("hard/new", "Same words.")]
    told, plain = FeaturePredictor(steps=200, lr=0.05, env_feature=True), FeaturePredictor(steps=200, lr=0.05)
    told.fit(train, targets, np.ones(40))
    plain.fit(train, targets, np.ones(40))
    easy, hard = told.predict(unseen)
    assert easy > 0.7 and hard < 0.3
    assert abs(float(np.subtract(*plain.predict(unseen)))) < 1e-9
    cols_told, _ = told.features(unseen[0])
    cols_plain, _ = plain.features(unseen[0])
    assert len(cols_told) == len(cols_plain) + 1 and set(cols_plain) < set(cols_told)


def test_the_hidden_state_predictor_reads_the_env_only_when_told(nano_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_gym.training.driver.builders import hidden_state_fn

    model = AutoModelForCausalLM.from_pretrained(nano_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(nano_dir)
    same = [Prefix("easy/t1", "Same words."), Prefix("hard/t1", "Same words.")]
    plain, told = hidden_state_fn(model, tokenizer)(same), hidden_state_fn(model, tokenizer, env_tag=True)(same)
    assert torch.equal(plain[0], plain[1]) and not torch.allclose(told[0], told[1])
    alone = hidden_state_fn(model, tokenizer)([Prefix("easy/t1", "[easy]\nSame words.")])
    assert torch.allclose(told[0], alone[0], atol=1e-5)  # the key leads the text, nothing else changes


@pytest.fixture(scope="module")
def nano_dir(tmp_path_factory):
    from trace_gym.agents.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("nano"), size="nano", seed=0)


def mixed_config(run_dir, model_dir, steps: int = 1) -> TrainConfig:
    return TrainConfig.from_dict({
        "run_dir": str(run_dir), "seed": 0, "steps": steps, "model": {"path": str(model_dir)},
        "env": {"workers": 2, "mix": [
            {"id": ENTRY_POINT, "name": "even", "kwargs": {"n_tasks": 8}, "eval_kwargs": {"task_seed": 1}},
            {"id": ENTRY_POINT, "name": "other", "weight": 1.0, "kwargs": {"n_tasks": 8, "task_seed": 2},
             "eval_kwargs": {"task_seed": 3}}]},
        "rollout": {"max_new_tokens": 6, "max_context": 512},
        "alloc": {"allocator": "trace", "roots": 6, "multiplier": 1, "pool_size": 4, "group_size": 3, "cap": 4},
        "optim": {"lr": 1e-3, "mini_batch": 8, "micro_batch": 4},
        "eval": {"every": 0, "tasks": 2},
        "checkpoint": {"every": 1}, "log": {"progress": False, "plots": False},
    })


def _run(cfg, resume=None):
    trainer = Trainer(cfg, resume=resume)
    try:
        return trainer.train()
    finally:
        trainer.close()


def test_a_two_env_run_reports_each_env_and_resumes_exactly(tmp_path, nano_dir):
    summary = _run(mixed_config(tmp_path / "full", nano_dir, steps=2))
    rows = read_metrics(tmp_path / "full")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for env in ("even", "other"):
        assert rows[1][f"alloc/{env}/pool"] == 2 and rows[2][f"alloc/{env}/pool"] == 2
        for row in (rows[0], rows[-1]):
            assert 0 <= row[f"eval/{env}/success"] <= 1
        assert summary["envs"][env]["tasks"] == 2
        assert summary["envs"][env]["success_after"] == rows[-1][f"eval/{env}/success"]
    for row in rows[1:]:
        played = [e for e in ("even", "other") if f"rollout/{e}/trajectories" in row]
        assert sum(row[f"rollout/{e}/trajectories"] for e in played) == row["rollout/trajectories"]
    # Held-out success over both envs is the mean of the envs' (each holds 2 of the 4 prompts).
    assert rows[0]["eval/success"] == pytest.approx((rows[0]["eval/even/success"] + rows[0]["eval/other/success"]) / 2)
    # `trace-gym eval --checkpoint` of the run plays each env's held-out prompts on their own env.
    from trace_gym.training.driver.evaluation import evaluate_config

    result = evaluate_config(mixed_config(tmp_path / "full", nano_dir, steps=2), tmp_path / "full")
    assert sorted(o.task_id for o in result.tasks) == ["even/p1-0", "even/p1-1", "other/p3-0", "other/p3-1"]
    _run(mixed_config(tmp_path / "part", nano_dir, steps=1))
    _run(mixed_config(tmp_path / "part", nano_dir, steps=2), resume=tmp_path / "part")
    part = read_metrics(tmp_path / "part")
    keep = [k for k in rows[2] if k.startswith(("alloc/", "rollout/", "eval/")) and not k.endswith("_s")]
    assert {k: part[-1][k] for k in keep} == {k: rows[2][k] for k in keep}


def test_the_train_command_checks_every_env_of_a_mix_before_the_warm_start(tmp_path):
    from trace_gym.training.cli.train import check_env

    data = mixed_config(tmp_path, tmp_path).to_dict()
    check_env(TrainConfig.from_dict(data))
    data["env"]["mix"][1]["eval_kwargs"] = {"n_tasks": 0}  # the second env's held-out split is empty
    with pytest.raises(ConfigError, match="empty dataset"):
        check_env(TrainConfig.from_dict(data))
