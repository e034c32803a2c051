"""The trainer with a data-parallel update (2 gloo ranks, DDP and FSDP2, LoRA) makes the same step as one
process; an FSDP2 run resumes exactly; torchrun and Ray start such runs from the command line and the API."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.training.driver.test_trainer import comparable, tiny_config
from trace_gym.training.config import TrainConfig
from trace_gym.training.driver.metrics_log import read_metrics
from trace_gym.training.driver.trainer import Trainer
from trace_gym.training.update.parallel import spawn

pytest.importorskip("peft")

SCENARIOS = {  # name -> config overrides
    "ddp": {"strategy": "ddp"},
    "fsdp": {"strategy": "fsdp"},
    "lora_ddp": {"strategy": "ddp", "lora_r": 4, "lora_alpha": 8},
}


@pytest.fixture(scope="module")
def nano_dir(tmp_path_factory):
    from trace_gym.agents.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("nano"), size="nano", seed=0)


def config(run_dir: Path, model_dir: Path, steps: int = 1, **model: object) -> dict:
    data = tiny_config(run_dir, model_dir).to_dict()
    data["model"].update(model)
    data["steps"] = steps
    return data


def train(data: dict, resume: Path | None = None) -> dict:
    trainer = Trainer(TrainConfig.from_dict(data), resume=resume)
    try:
        return trainer.train()
    finally:
        trainer.close()


def _ranks(rank: int, world_size: int, root: str, model_dir: str) -> None:
    for name, model in SCENARIOS.items():
        train(config(Path(root) / name, Path(model_dir), **model))
    full = config(Path(root) / "fsdp_full", Path(model_dir), steps=2, strategy="fsdp")
    train(full)
    part = config(Path(root) / "fsdp_part", Path(model_dir), steps=1, strategy="fsdp")
    train(part)
    train({**part, "steps": 2}, resume=Path(root) / "fsdp_part")


@pytest.fixture(scope="module")
def ranked(tmp_path_factory, nano_dir) -> Path:
    root = tmp_path_factory.mktemp("ranks")
    spawn(_ranks, 2, str(root), str(nano_dir), backend="gloo")
    return root


def weights(run_dir: Path, step: int = 1) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run_dir / "checkpoints" / f"step_{step:06d}" / "model" / "model.safetensors")


def assert_same_step(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], start: dict[str, torch.Tensor],
                     lr: float) -> None:
    """Same update direction and size; AdamW's first step is ~lr·sign(g), so gradients equal up to float
    summation order differ only where |g| is near Adam's epsilon."""
    assert got.keys() == want.keys()
    d_got = torch.cat([(got[k] - start[k]).flatten() for k in sorted(want)])
    d_want = torch.cat([(want[k] - start[k]).flatten() for k in sorted(want)])
    assert float(d_want.abs().max()) > 0.5 * lr  # the step moved the weights: the comparison is not vacuous
    cosine = float(d_got @ d_want / (d_got.norm() * d_want.norm()))
    assert cosine > 0.999
    assert float((d_got - d_want).abs().mean()) < 0.01 * float(d_want.abs().mean())


def start_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(model_dir).state_dict().items()}


@pytest.mark.parametrize("scenario", ["ddp", "fsdp"])
def test_data_parallel_trainer_step_equals_one_process(ranked, scenario, nano_dir, tmp_path):
    train(config(tmp_path / "single", nano_dir))
    want = weights(tmp_path / "single")
    lr = tiny_config(tmp_path, nano_dir).optim.lr
    assert_same_step(weights(ranked / scenario), want, start_weights(nano_dir), lr)
    ranked_rows, single_rows = read_metrics(ranked / scenario), read_metrics(tmp_path / "single")
    for key in ("rollout/trajectories", "rollout/tokens", "loss/tokens", "loss/nodes"):
        assert ranked_rows[0][key] == single_rows[0][key], key
    assert ranked_rows[0]["loss/total"] == pytest.approx(single_rows[0]["loss/total"], rel=1e-4, abs=1e-6)


def test_lora_trainer_on_two_ranks_equals_lora_in_one_process(ranked, nano_dir, tmp_path):
    single = config(tmp_path / "single", nano_dir, lora_r=4, lora_alpha=8)
    train(single)
    want = weights(tmp_path / "single")
    start = start_weights(nano_dir)
    from safetensors.torch import load_file

    assert set(want) == set(load_file(nano_dir / "model.safetensors"))  # a plain model folder: LoRA merged
    assert_same_step(weights(ranked / "lora_ddp"), want, start, single["optim"]["lr"])
    frozen = "model.embed_tokens.weight"
    assert torch.equal(want[frozen], start[frozen])  # LoRA leaves the embeddings alone


def test_lora_policy_generates_with_the_merged_weights(nano_dir, tmp_path):
    trainer = Trainer(TrainConfig.from_dict(config(tmp_path / "run", nano_dir, lora_r=4, lora_alpha=8)))
    try:
        assert trainer.policy.model is not trainer.model  # a separate generation copy (choice 2)
        trainer.step()
        merged = trainer.learner.weights()
        assert merged is not None
        for name, value in trainer.policy.model.state_dict().items():
            torch.testing.assert_close(value, merged[name], msg=name)
        moved = [k for k in merged if not torch.equal(merged[k], start_weights(nano_dir)[k])]
        assert any("q_proj" in k for k in moved)
    finally:
        trainer.close()


def test_fsdp_resume_repeats_the_uninterrupted_run(ranked):
    full, part = read_metrics(ranked / "fsdp_full"), read_metrics(ranked / "fsdp_part")
    assert [r["step"] for r in part] == [1, 2]
    assert comparable(full) == comparable(part)
    final_full, final_part = weights(ranked / "fsdp_full", 2), weights(ranked / "fsdp_part", 2)
    for key in final_full:
        torch.testing.assert_close(final_part[key], final_full[key], msg=key)


def test_torchrun_launches_a_data_parallel_run(nano_dir, tmp_path):
    data = config(tmp_path / "run", nano_dir, strategy="ddp")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[3])}
    # Its own session, so that a hang kills torchrun's ranks too, not only torchrun.
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "-m", "trace_gym.training.cli.main", "train", "--config", str(path)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["trajectories"] == 12
    assert stdout.count("trace-gym train:") == 1  # only the lead prints the table


def test_ray_launches_a_data_parallel_run(ray_cluster, nano_dir, tmp_path):
    from trace_gym.training.driver.launch import ray_train

    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules["tests.training.parity_env"])
    summary = ray_train(TrainConfig.from_dict(config(tmp_path / "run", nano_dir, strategy="ddp")), 2)
    assert summary["steps"] == 1 and summary["trajectories"] == 12
    assert (tmp_path / "run" / "checkpoints" / "step_000001" / "model" / "model.safetensors").is_file()


def test_a_data_parallel_strategy_without_a_process_group_says_how_to_launch(nano_dir, tmp_path):
    from trace_gym.errors import ConfigError

    for key in ("RANK", "WORLD_SIZE"):
        assert key not in os.environ
    with pytest.raises(ConfigError, match="torchrun"):
        Trainer(TrainConfig.from_dict(config(tmp_path / "run", nano_dir, strategy="ddp")))


def test_lora_run_resumes_from_its_merged_checkpoint(nano_dir, tmp_path):
    part = config(tmp_path / "run", nano_dir, lora_r=4, lora_alpha=8)
    train(part)
    summary = train({**part, "steps": 2}, resume=tmp_path / "run")
    assert summary["steps"] == 2
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2]
    first, second = weights(tmp_path / "run", 1), weights(tmp_path / "run", 2)
    assert any(not torch.equal(first[k], second[k]) for k in first)  # the fresh adapter trained on
