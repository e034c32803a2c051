"""Configs: YAML + dotted overrides load into typed pydantic sections; every invalid value names its fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trace_gym.errors import ConfigError
from trace_gym.training.config import LogConfig, dump_config, load_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_overrides_set_nested_values_parsed_as_yaml():
    cfg = load_config(None, ["optim.lr=1e-4", "alloc.allocator=grpo", "env.kwargs={split: dev}", "steps=3",
                             "log.tensorboard=true"])
    assert cfg.optim.lr == 1e-4 and isinstance(cfg.optim.lr, float)
    assert cfg.alloc.allocator == "grpo" and cfg.env.kwargs == {"split": "dev"} and cfg.steps == 3
    assert cfg.log.tensorboard is True


def test_yaml_exponent_without_dot_is_a_float(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 1e-6\n")  # PyYAML reads this as the string '1e-6'
    assert load_config(path).optim.lr == 1e-6


def test_dump_and_load_round_trip(tmp_path):
    cfg = load_config(None, ["alloc.roots=16", "optim.betas=[0.9,0.95]", "env.eval_kwargs={task_seed: 1}"])
    dump_config(cfg, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == cfg


@pytest.mark.parametrize(("overrides", "fix"), [
    (["optim.lrr=1"], "fix: did you mean optim.lr?"),
    (["alloc.allocator=best"], "fix: alloc.allocator=trace"),
    (["optim.micro_batch=16", "optim.mini_batch=8"], "fix: optim.micro_batch"),
    (["alloc.pool_size=2", "alloc.roots=64", "alloc.cap=4"], "fix: raise alloc.pool_size"),
    (["rollout.max_context=64", "rollout.max_new_tokens=64"], "fix: raise rollout.max_context"),
    (["optim.advantage=ppo"], "fix: optim.advantage=tree_grpo"),
    (["steps=ten"], "fix: steps=100"),
    (["env.snapshot=fork"], "fix: env.snapshot=native"),
    (["optim.lr"], "fix: e.g. optim.lr=1e-4"),
    (["log.save_trees=sometimes"], "fix: log.save_trees=first_last"),
    (["log.save_trees=0"], "fix: log.save_trees=first_last"),
    (["distributed=mpi"], "fix: distributed=none"),
    (["distributed=ray", "ray.workers=0"], "fix: ray.workers=2"),
    (["alloc.flip_scale=true"], "fix: alloc.allocator=trace_plus"),
    (["predictor.kind=hidden", "predictor.logprob_features=true"], "fix: predictor.logprob_features=false"),
])
def test_invalid_values_raise_with_the_fix(overrides, fix):
    with pytest.raises(ConfigError, match="fix") as err:
        load_config(None, overrides)
    assert fix in str(err.value)


def test_missing_config_file_names_the_configs_folder(tmp_path):
    with pytest.raises(ConfigError, match="configs/"):
        load_config(tmp_path / "nope.yaml")


def _leaves(data: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in data.items():
        if isinstance(v, dict) and v and not prefix.startswith(("env.kwargs", "env.eval_kwargs", "sft.expert")) \
                and f"{prefix}{k}" not in ("env.kwargs", "env.eval_kwargs", "sft.expert", "ray.init"):
            out |= _leaves(v, f"{prefix}{k}.")
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):  # env.mix: each entry's own keys
            for i, x in enumerate(v):
                out |= _leaves(x, f"{prefix}{k}.{i}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_hold_every_value_they_write(path):
    from trace_gym.training.config import _read_yaml

    written = _leaves(_read_yaml(path, ()))
    loaded = _leaves(load_config(path).to_dict())
    assert written and {k: loaded[k] for k in written} == {
        k: list(v) if isinstance(v, tuple) else float(v) if isinstance(loaded[k], float) else v
        for k, v in written.items()}


@pytest.mark.parametrize(("value", "want"), [("true", "all"), ("false", "none"), ("first_last", "first_last"),
                                             ("5", 5), ("none", "none")])
def test_save_trees_reads_policies_and_the_older_booleans(value, want, tmp_path):
    cfg = load_config(None, [f"log.save_trees={value}"])
    assert cfg.log.save_trees == want
    dump_config(cfg, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == cfg


@given(policy=st.one_of(st.sampled_from(["none", "all", "first_last"]), st.integers(1, 12)),
       last=st.integers(1, 40))
def test_saved_tree_steps_follow_the_policy(policy, last):
    saved = {s for s in range(1, last + 1) if LogConfig(save_trees=policy).saves_trees(s, last)}
    want = {"none": set(), "all": set(range(1, last + 1)), "first_last": {1, last}}.get(policy) if isinstance(
        policy, str) else {s for s in range(policy, last + 1, policy)} | {last}
    assert saved == want


def test_distributed_ray_validates_with_its_worker_settings(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("distributed: ray\nray:\n  workers: 3\n  gpus_per_worker: 1\n  init: {num_cpus: 4}\n")
    cfg = load_config(path)
    assert cfg.distributed == "ray" and cfg.ray.workers == 3 and cfg.ray.init == {"num_cpus": 4}
    assert isinstance(cfg.ray.gpus_per_worker, float)
    dump_config(cfg, tmp_path / "dumped.yaml")
    assert load_config(tmp_path / "dumped.yaml") == cfg


def test_every_literal_mode_is_checked_against_its_literal_alone():
    from typing import get_args

    from trace_gym.training.config import AdvantageMethod, AllocatorName, AllocConfig, ModelConfig, OptimConfig, choices

    assert choices(AllocConfig)["allocator"] == get_args(AllocatorName)
    assert choices(OptimConfig)["advantage"] == get_args(AdvantageMethod)
    assert choices(ModelConfig) == {"init_size": ("nano", "tiny", None), "backend": ("hf", "vllm"),
                                    "strategy": ("single", "ddp", "fsdp")}
    with pytest.raises(ConfigError, match=r"expected model.strategy in \('single', 'ddp', 'fsdp'\), got 'zero'"):
        ModelConfig(strategy="zero")  # type: ignore[arg-type]  # a bad value given in code, not YAML


@pytest.mark.parametrize(("override", "message"), [
    ("model.device=5", "expected model.device as a string, got 5; fix: model.device=auto"),
    ("env.id=7", "expected env.id as a string, got 7; fix: env.id=trace/Arithmetic-v0"),
    ("optim.betas=0.9", "expected optim.betas as a list of 2 numbers, got 0.9; fix: optim.betas=[0.9,0.999]"),
    ("optim.betas=[0.9,x]", "expected optim.betas as a list of 2 numbers"),
    ("model.bf16=1", "expected model.bf16 as true or false, got 1; fix: model.bf16=false"),
    ("steps=5.5", "expected steps as an integer, got 5.5; fix: steps=100"),
    ("model.init_size=5", "expected model.init_size as a string or null, got 5; fix: model.init_size=null"),
    ("env.kwargs=[1]", "expected env.kwargs as a mapping, got [1]; fix: env.kwargs={}"),
])
def test_values_are_checked_against_the_annotation_in_one_line(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_yaml_forms_convert_to_the_annotated_types():
    cfg = load_config(None, ["optim.betas=[0.8,0.9]", "optim.lr=1", "log.save_trees=true"])
    assert cfg.optim.betas == (0.8, 0.9) and isinstance(cfg.optim.lr, float) and cfg.log.save_trees == "all"
