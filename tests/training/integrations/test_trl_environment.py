"""TRL's GRPOTrainer takes trace-gym envs through its environment_factory too (`trl_environment`): the env's tools
are methods whose schemas transformers reads back as the env declares them, an episode played through them is
scored by the env on the final answer, and a real GRPOTrainer takes a step on the tiny model with one env per
rollout, each reset to its row's task."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from transformers.utils import get_json_schema

from trace_gym import Task, Tool, ToolEnv
from trace_gym.errors import ConfigError
from trace_gym.training.integrations.trl_environment import trl_environment

HERE = "tests.training.integrations.test_trl_environment"


class TypedToolsEnv(ToolEnv):
    """Answer with a + b, computed with the add tool."""

    system_prompt = "Add the numbers with the add tool, then answer."

    def load_tasks(self):
        return [Task(id=f"t{i}", prompt=f"Add {i} and {i + 1}.", answer=str(2 * i + 1)) for i in range(3)]

    def tools(self):
        return [Tool.from_function(self.add), Tool.from_function(self.note)]

    def add(self, a: int, b: int, scale: float = 1.0) -> str:
        """Add two integers.

        Args:
            a: the first number
            b: the second number
            scale: a factor for the sum
        """
        return str((a + b) * scale)

    def note(self, text: str, tags: list | None = None) -> str:
        """Keep a note."""
        return "noted"

    def verify(self, task, answer):
        return float(answer.strip() in (task.answer, task.answer + ".0")), {}


class ResetToolEnv(TypedToolsEnv):
    def tools(self):
        return [Tool.from_function(self.add, name="reset")]


def _function(schema: dict) -> dict:
    fn = dict(schema["function"])
    fn.pop("return", None)
    return fn


def test_the_methods_are_the_envs_tools_as_transformers_reads_them():
    Env = trl_environment(f"{HERE}:TypedToolsEnv")
    env = Env()
    try:
        declared = {t["function"]["name"]: t["function"] for t in env.session.tools}
        read = {name: _function(get_json_schema(getattr(env, name))) for name in declared}
        for name, fn in declared.items():
            assert read[name]["name"] == name and read[name]["description"].startswith(fn["description"][:12])
            assert set(read[name]["parameters"]["properties"]) == set(fn["parameters"]["properties"])
            assert set(read[name]["parameters"].get("required", [])) == set(fn["parameters"].get("required", []))
        assert read["add"]["parameters"]["properties"]["a"]["type"] == "integer"
        assert read["add"]["parameters"]["properties"]["a"]["description"] == "the first number"
    finally:
        env._close()


def test_an_episode_played_through_the_methods_is_scored_by_the_env_on_the_final_answer():
    Env = trl_environment("trace/Arithmetic-v0", {"n_tasks": 2})
    rows = Env.dataset()
    assert rows[0]["prompt"][0]["role"] == "system" and "<python>" not in rows[0]["prompt"][0]["content"]
    right, wrong = Env(), Env()
    try:
        for env in (right, wrong):
            env.reset(**rows[0])
        expression = rows[0]["prompt"][-1]["content"].removeprefix("Compute ").removesuffix(".")
        value = right.python(code=f"print({expression})").strip()
        completion = [{"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {
            "name": "python", "arguments": {"code": "..."}}}]}, {"role": "tool", "content": value},
            {"role": "assistant", "content": value}]
        assert Env.reward([completion, [{"role": "assistant", "content": "12345"}]], [right, wrong]) == [1.0, 0.0]
        assert right.python(code="print(1)").startswith("The episode has ended")
    finally:
        right._close()
        wrong._close()


def test_a_tool_that_cannot_be_a_method_is_refused_with_the_other_way_in():
    with pytest.raises(ConfigError, match="TraceGymRollout"):
        trl_environment(f"{HERE}:ResetToolEnv")


def test_grpo_trainer_takes_a_step_with_the_environment_factory(tmp_path, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_chat_template

    from trace_gym.agents.tiny import build_tiny_model

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tiny = build_tiny_model(tmp_path / "tiny", size="tiny", seed=0)
    Env = trl_environment("trace/Arithmetic-v0", {"n_tasks": 4})
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    tokenizer.chat_template = qwen3_chat_template  # a template TRL knows how to read tool calls from
    seen: list[list[tuple[str, bool]]] = []

    def reward(completions, environments, **kwargs):
        out = Env.reward(completions, environments)
        seen.append([(env.task_id, env.done) for env in environments])
        return out

    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=1, per_device_train_batch_size=4,
                      num_generations=2, max_completion_length=8, learning_rate=1e-3, logging_steps=1,
                      save_strategy="no", report_to="none", seed=0, bf16=False)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32), args=args,
                          processing_class=tokenizer, train_dataset=Env.dataset(), environment_factory=Env,
                          reward_funcs=reward)
    trainer.train()
    assert trainer.state.global_step == 1 and len(seen) == 1
    assert sorted(tid for tid, _ in seen[0]) == ["arith-0", "arith-0", "arith-1", "arith-1"]  # 2 rows x 2
    assert all(done for _, done in seen[0])  # every rollout's episode was scored by its env
