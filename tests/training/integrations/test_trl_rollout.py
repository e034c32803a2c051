"""TRL's GRPOTrainer trains the tiny model on trace-gym envs through `TraceGymRollout` (its rollout_func): a few
real optimizer steps on the CPU on a user's own env (named module:Class, as the env-spec resolver takes it), whose
episodes are whole multi-turn env episodes with exact tokens; the token record on the sandboxed Arithmetic env;
TRL's max_completion_length holding over whole episodes; and the generation backend following use_vllm (the real
colocated engine runs in tests/vllm, make test-vllm)."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

import torch

from tests.training.parity_env import ENTRY_POINT
from trace_gym.training.integrations.trl_rollout import TraceGymRollout


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from trace_gym.agents.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), size="tiny", seed=0)


def test_grpo_trainer_takes_real_steps_on_env_episodes(tiny_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    # The parity env rewards an even-length second turn: an untrained model gets both outcomes, so GRPO's
    # advantages are not all zero.
    rollout = TraceGymRollout(ENTRY_POINT, {"n_tasks": 8}, max_new_tokens=6, max_context=512, workers=1)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    seen: list[int] = []

    def traced(prompts, trainer):
        seen.append(len(prompts))
        return rollout(prompts, trainer)

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, max_steps=2, per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=64, learning_rate=1e-3, temperature=1.0,
                      logging_steps=1, save_strategy="no", report_to="none", seed=0, bf16=False)
    trainer = GRPOTrainer(model=model, args=args, processing_class=tokenizer, train_dataset=rollout.dataset(),
                          reward_funcs=rollout.reward, rollout_func=traced)
    trainer.train()
    assert trainer.state.global_step == 2 and seen == [8, 8]  # 2 prompts x 4 generations per step
    assert rollout.last["turns"] == [2] * 8 and 0 < sum(rollout.last["rewards"]) < 8
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed  # the optimizer moved the weights
    assert any(float(row["reward_std"]) > 0 for row in trainer.state.log_history if "reward_std" in row)


def test_the_rollout_returns_exact_tokens_with_the_env_masked(tiny_dir):
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM, AutoTokenizer

    rollout = TraceGymRollout("trace/Arithmetic-v0", {"n_tasks": 3, "max_turns": 3}, max_new_tokens=16,
                              max_context=512, workers=1)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    trainer = SimpleNamespace(model=model, processing_class=AutoTokenizer.from_pretrained(tiny_dir),
                              accelerator=SimpleNamespace(unwrap_model=lambda m: m), state=SimpleNamespace(
                                  global_step=0), args=SimpleNamespace(temperature=1.0, top_p=1.0, seed=0))
    prompts = [row["prompt"] for row in rollout.dataset()] * 2
    out = rollout(prompts, trainer)
    assert len(out["completion_ids"]) == 6 and out["env_reward"] == [0.0] * 6  # an untrained model
    for ids, mask, logps in zip(out["completion_ids"], out["env_mask"], out["logprobs"]):
        assert len(ids) == len(mask) == len(logps) and mask[0] == 1
        assert all(lp <= 0 for lp, m in zip(logps, mask) if m) and all(lp == 0 for lp, m in zip(logps, mask) if not m)
    multi = [m for m in out["env_mask"] if 0 in m]
    assert multi and all(1 in m[m.index(0):] for m in multi)  # a turn after the env's answer


def test_max_completion_length_holds_over_whole_episodes(tiny_dir, tmp_path, monkeypatch, caplog):
    """A real GRPOTrainer with max_completion_length=16 on episodes of three turns of up to 16 tokens: every
    completion it gets is at most 16 tokens, the cut ones are flagged and scored 0, and a warning says so."""
    import logging

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    rollout = TraceGymRollout("trace/Arithmetic-v0", {"n_tasks": 4, "max_turns": 3}, max_new_tokens=64,
                              max_context=512, workers=1)
    outputs = []

    def traced(prompts, trainer):
        outputs.append(rollout(prompts, trainer))
        return outputs[-1]

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, max_steps=1, per_device_train_batch_size=4,
                      num_generations=2, max_completion_length=16, learning_rate=1e-4, logging_steps=1,
                      save_strategy="no", report_to="none", seed=0, bf16=False)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32), args=args,
                          processing_class=AutoTokenizer.from_pretrained(tiny_dir), train_dataset=rollout.dataset(),
                          reward_funcs=rollout.reward, rollout_func=traced)
    with caplog.at_level(logging.WARNING, logger="trace_gym.training.integrations.trl_rollout"):
        trainer.train()
    (out,) = outputs
    assert all(len(ids) <= 16 and len(ids) == len(m) == len(lp)
               for ids, m, lp in zip(out["completion_ids"], out["env_mask"], out["logprobs"]))
    cut = [i for i, flag in enumerate(out["env_truncated"]) if flag]
    assert cut and all(out["env_reward"][i] == 0.0 for i in cut)
    assert any("cut at max_completion_length=16" in r.getMessage() for r in caplog.records)
    logged = next(row for row in trainer.state.log_history if "completions/max_length" in row)
    assert logged["completions/max_length"] <= 16


def test_use_vllm_modes_the_multi_turn_rollout_cannot_drive_are_refused_with_the_fix():
    """The checks read only the trainer's vLLM settings (TRL builds no engine without vllm installed)."""
    from types import SimpleNamespace

    from trace_gym.errors import ConfigError
    from trace_gym.training.integrations.trl_rollout import trainer_policy

    for settings in ({"mode": "server"}, {"mode": "colocate", "tensor_parallel_size": 2},
                     {"mode": "colocate", "enable_sleep_mode": True}):
        trainer = SimpleNamespace(use_vllm=True, processing_class=None, vllm_generation=SimpleNamespace(**settings))
        with pytest.raises(ConfigError, match="vllm_mode='colocate'"):
            trainer_policy(trainer)


def _mixed(**kwargs):
    return TraceGymRollout(envs={"even": (ENTRY_POINT, {"n_tasks": 4}),
                                 "chain": ("trace/ArithmeticChain-v0", {"n_tasks": 4, "max_turns": 2})},
                           max_new_tokens=6, max_context=512, workers=1, **kwargs)


def test_several_operator_envs_each_play_their_own_prompts(tiny_dir):
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM, AutoTokenizer

    rollout = _mixed()
    rows = list(rollout.dataset({"even": 2, "chain": 1}))
    assert [(r["env"], r["task_id"]) for r in rows] == [("even", "even/p0-0"), ("even", "even/p0-1"),
                                                        ("chain", "chain/chain-0")]
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    trainer = SimpleNamespace(model=model, processing_class=AutoTokenizer.from_pretrained(tiny_dir),
                              accelerator=SimpleNamespace(unwrap_model=lambda m: m), state=SimpleNamespace(
                                  global_step=0), args=SimpleNamespace(temperature=1.0, top_p=1.0, seed=0))
    out = rollout([r["prompt"] for r in rows] * 2, trainer)
    assert rollout.last["envs"] == ["even", "even", "chain"] * 2
    turns = dict(zip(rollout.last["task_ids"], rollout.last["turns"]))
    assert turns["even/p0-0"] == turns["even/p0-1"] == 2  # the parity env ends at turn 2, always
    assert 1 <= turns["chain/chain-0"] <= 2  # the chain env's own turn limit, 2 here
    # Per-env reward functions: each scores its own env's rows and leaves the others to the other function.
    even, chain = rollout.env_rewards()
    envs = [r["env"] for r in rows] * 2
    assert (even.__name__, chain.__name__) == ("env_reward_even", "env_reward_chain")
    scored = [a if a is not None else b for a, b in zip(even(env_reward=out["env_reward"], env=envs),
                                                         chain(env_reward=out["env_reward"], env=envs))]
    assert scored == out["env_reward"]
    assert chain(env_reward=out["env_reward"], env=envs)[:2] == [None, None]


def test_a_row_reaches_only_the_operators_envs():
    from trace_gym.errors import ConfigError

    rollout = _mixed()
    with pytest.raises(ConfigError, match="expected a prompt of"):  # a prompt no operator env holds
        rollout.task_of([{"role": "user", "content": "import os; run trace/Arithmetic-v0"}])
    with pytest.raises(ConfigError, match="one of the operator's env keys"):  # a key the operator did not give
        rollout.dataset({"tests.training.parity_env:ParityEnv": 2})
    with pytest.raises(ConfigError, match="env key of letters"):  # a key is a short word, not a path or a spec
        TraceGymRollout(envs={"../math": ("trace/ArithmeticChain-v0", {})})
    with pytest.raises(ConfigError, match="expected one env spec or envs"):
        TraceGymRollout("trace/ArithmeticChain-v0", envs={"chain": ("trace/ArithmeticChain-v0", {})})


def test_grpo_trainer_logs_a_reward_per_env(tiny_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    rollout = _mixed()
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, max_steps=1, per_device_train_batch_size=8,
                      num_generations=2, max_completion_length=64, learning_rate=1e-3, temperature=1.0,
                      logging_steps=1, save_strategy="no", report_to="none", seed=0, bf16=False)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32), args=args,
                          processing_class=AutoTokenizer.from_pretrained(tiny_dir),
                          train_dataset=rollout.dataset(), reward_funcs=rollout.env_rewards(), rollout_func=rollout)
    trainer.train()
    logged = next(row for row in trainer.state.log_history if "reward" in row)
    played = set(rollout.last["envs"])
    assert played <= {"even", "chain"} and played
    for key in played:
        assert f"rewards/env_reward_{key}/mean" in logged
