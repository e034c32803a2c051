"""Building a run's parts from its config (env specs themselves: tests/trace_gym/test_env_specs.py)."""

from __future__ import annotations

import sys

import pytest

from trace_gym.errors import SetupError
from trace_gym.training.allocation.predictor import FeaturePredictor
from trace_gym.training.config import TrainConfig
from trace_gym.training.driver.builders import make_policy, make_predictor


def test_the_feature_predictor_never_asks_for_hidden_states():
    cfg = TrainConfig.from_dict({"predictor": {"kind": "features", "lr": 0.02, "steps": 7}})
    predictor = make_predictor(cfg, lambda: pytest.fail("hidden states are not needed"))
    assert isinstance(predictor, FeaturePredictor) and (predictor.lr, predictor.steps) == (0.02, 7)


def test_logprob_features_read_the_tiers_of_the_tasks_that_carry_one():
    from trace_gym.tasks import Task

    tasks = [Task("a", "p", meta={"tier": "guess"}), Task("b", "p"), Task("c", "p", meta={"tier": "hard"})]
    cfg = TrainConfig.from_dict({"predictor": {"logprob_features": True}})
    predictor = make_predictor(cfg, lambda: pytest.fail("hidden states are not needed"), tasks)
    assert isinstance(predictor, FeaturePredictor) and predictor.logprob_features
    assert predictor.tiers == {"a": "guess", "c": "hard"}
    plain = make_predictor(TrainConfig.from_dict({}), lambda: pytest.fail("not needed"), tasks)
    assert isinstance(plain, FeaturePredictor) and not plain.logprob_features


HUNGRY_ENVS = """
from trace_gym import Task, TextEnv, Turn
from trace_gym.limits import Footprint


class HungryEnv(TextEnv):
    def load_tasks(self):
        return [Task("t", "say anything")]

    def turn(self, action):
        return Turn("ok", reward=1.0, terminated=True)

    @staticmethod
    def host_footprint(branching):
        return Footprint(processes=0, descriptors=10**9, namespaces=0, memory_bytes=0)
"""


def test_a_users_module_colon_class_env_has_its_footprint_checked(tmp_path, monkeypatch):
    from trace_gym.agents.policy import SamplingParams
    from trace_gym.env_specs import env_factory
    from trace_gym.errors import ConfigError
    from trace_gym.training.driver.builders import make_collector

    (tmp_path / "hungry_envs.py").write_text(HUNGRY_ENVS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "hungry_envs", raising=False)
    cfg = TrainConfig.from_dict({"env": {"id": "hungry_envs:HungryEnv"}})
    with pytest.raises(ConfigError, match="fix: ulimit -n"):
        make_collector(cfg, None, env_factory(cfg.env.id), [], SamplingParams(), None, "")
    sys.modules.pop("hungry_envs", None)


def test_the_vllm_backend_without_vllm_is_a_setup_error_with_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError, whether it is installed or not
    cfg = TrainConfig.from_dict({"model": {"backend": "vllm"}})
    with pytest.raises(SetupError, match=r"fix: pip install -e '\.\[vllm\]'.*model\.backend=hf"):
        make_policy(cfg, None, None, "runs/model")


def test_packed_hidden_state_features_equal_one_forward_per_prefix(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_gym.agents.tiny import build_tiny_model
    from trace_gym.training.allocation.predictor import Prefix
    from trace_gym.training.driver.builders import hidden_state_fn

    path = build_tiny_model(tmp_path / "nano", size="nano", seed=0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    # A step's prefixes: one prompt, its turns, a sibling turn, and another prompt.
    prefixes = [Prefix("a", "What is 3*4?"), Prefix("a", "What is 3*4?", (("<python>print(3*4)</python>", "12"),)),
                Prefix("a", "What is 3*4?", (("<python>print(3*5)</python>", "15"),)), Prefix("b", "Add 2 and 9.")]
    packed = hidden_state_fn(model, tokenizer)(prefixes)
    with torch.no_grad():  # the obvious reference: one forward per prefix over the same rendering
        single = torch.stack([
            model(input_ids=torch.tensor([tokenizer("\n".join([p.prompt, *(f"{a}\n{o}" for a, o in p.turns)]),
                                                    add_special_tokens=False)["input_ids"]]),
                  output_hidden_states=True).hidden_states[-1][0, -1] for p in prefixes])
    assert packed.shape == (4, model.config.hidden_size)
    torch.testing.assert_close(packed, single, atol=1e-5, rtol=1e-4)
