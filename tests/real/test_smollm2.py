"""SmolLM2-135M-Instruct through the whole pipeline on a CPU (`make test-real`, ~10 minutes on 2 cores): the
fetched folder, held-out evaluation with text and native tool calls, two SFT steps, two RL steps with LoRA
from configs/smollm2_arithmetic.yaml, and the token record against the real tokenizer."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import torch

from trace_gym.agents.hf import HFPolicy, sequence_logprobs
from trace_gym.agents.native_tools import ToolFormat
from trace_gym.agents.policy import SamplingParams
from trace_gym.env_specs import env_factory
from trace_gym.training.rollout.collector import context_ids, path_tokens
from trace_gym.training.rollout.evaluate import evaluate_policy

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "smollm2_arithmetic.yaml"
MAKE_ENV = env_factory("trace/Arithmetic-v0", {"n_tasks": 20, "max_turns": 3})


def trace_gym(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trace_gym.training.cli.main", *argv], capture_output=True,
                          text=True, cwd=cwd, timeout=1200)


def test_the_fetched_model_is_smollm2_in_fp32_with_its_chat_template(real_dir, real_policy, tmp_path):
    model, tok = real_policy.model, real_policy.tokenizer
    cfg = model.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == ("llama", 30, 576, 49152)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008 and model.dtype == torch.float32
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    # the command copies the cached folder: no download, no second conversion
    result = trace_gym("model", "fetch", "smollm2-135m", "--out", str(tmp_path / "copy"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "cached at" in result.stdout and (tmp_path / "copy" / "model.safetensors").stat().st_size > 5e8


def test_eval_plays_text_and_native_tool_calls(real_dir, real_policy, tmp_path):
    greedy = SamplingParams(temperature=0, max_new_tokens=48)
    text = evaluate_policy(real_policy, MAKE_ENV, 3, sampling=greedy, keep_trees=True, workers=2)
    native_policy = HFPolicy(real_policy.model, real_policy.tokenizer, max_batch_size=16, native_tools=True)
    native = evaluate_policy(native_policy, MAKE_ENV, 3, sampling=greedy, keep_trees=True, workers=2)
    fmt = ToolFormat.of_env(MAKE_ENV())
    assert fmt is not None
    for tree in native.trees:  # a reply without call markup is the final answer, never a format error
        for node in tree.nodes[1:]:
            if fmt.text_action(real_policy.tokenizer.decode(node.token_ids)).startswith("<answer>"):
                assert node.is_terminal and node.info.get("stop_reason") == "answer"
    assert len(text.tasks) == len(native.tasks) == 3
    # the command line's native form runs as well
    result = trace_gym("eval", "--policy", f"hf:{real_dir}", "--tool-calls", "native", "--env", "trace/Arithmetic-v0",
                       "--env-arg", "n_tasks=20", "--tasks", "2", "--max-new-tokens", "32", "--json",
                       "--out", str(tmp_path / "eval"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["episodes"] == 2


def test_two_sft_steps_with_lora_change_the_weights(real_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from trace_gym.agents.sft import SFTSettings, sft
    from trace_gym.training.driver.warm_start import collect_expert_episodes

    data = collect_expert_episodes(MAKE_ENV, 8)
    result = sft(real_dir, data, tmp_path / "sft", SFTSettings(steps=2, batch_size=4, warmup_steps=1, lora_r=8),
                 progress=False)
    assert len(result.losses) == 2 and all(math.isfinite(x) and x > 0 for x in result.losses)
    before = AutoModelForCausalLM.from_pretrained(real_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "sft").state_dict()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert set(after) == set(before) and not torch.equal(before[name], after[name])


def test_two_rl_steps_with_lora_from_the_config(real_dir, tmp_path):
    from trace_gym.training.driver.metrics_log import read_metrics

    result = trace_gym("train", "--config", str(CONFIG), f"run_dir={tmp_path}/rl", f"model.path={real_dir}",
                       "sft.enabled=false", "steps=2", "alloc.roots=4", "alloc.pool_size=4", "eval.tasks=2",
                       "rollout.max_new_tokens=32", "env.kwargs.n_tasks=40", "env.eval_kwargs.n_tasks=4",
                       "log.progress=false")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    rows = read_metrics(tmp_path / "rl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all("rollout/success" in r for r in rows[1:])
    # the raw model rarely scores, so a step may have no advantage to train on (no loss); one that trains is finite
    assert all(math.isfinite(r["loss/total"]) for r in rows if "loss/total" in r)


def test_the_token_record_is_what_the_model_saw_and_sampled(real_policy):
    """Each node's context plus its sampled ids reproduce its recorded logprobs under the model; the root is the
    chat template's rendering."""
    sampling = SamplingParams(temperature=1.0, max_new_tokens=48, seed=0)
    result = evaluate_policy(real_policy, MAKE_ENV, 3, samples=2, sampling=sampling, keep_trees=True, workers=2)
    nodes = 0
    for tree in result.trees:
        for node in tree.nodes[1:]:
            if not node.token_ids:
                continue
            ids = context_ids(tree, node.id) + list(node.token_ids)
            with torch.no_grad():
                ref = sequence_logprobs(real_policy.model, torch.tensor([ids]))[0, -len(node.token_ids):]
            torch.testing.assert_close(ref, torch.tensor(node.logprobs), atol=2e-3, rtol=0)
            nodes += 1
        leaf = tree.nodes[-1]
        record, _ = path_tokens(tree, leaf.id)
        assert record[:len(tree.root.prompt_ids)] == tree.root.prompt_ids
    assert nodes >= 3
