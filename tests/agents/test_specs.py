"""Policy specs: every backend a spec names, and a one-line ConfigError for each kind of wrong spec."""

from __future__ import annotations

import sys

import pytest

from tests.agents.openai_server import ScriptedServer
from trace_gym.agents.hf import HFPolicy
from trace_gym.agents.openai_backend import OpenAIPolicy
from trace_gym.agents.policy import Request, SamplingParams
from trace_gym.agents.scripted import ExpertPolicy
from trace_gym.agents.specs import PolicyOptions, backend_of, check_model_folder, policy_from_spec
from trace_gym.env_specs import env_factory
from trace_gym.errors import ConfigError, SetupError
from trace_gym.training.rollout.evaluate import evaluate_policy

ARITHMETIC = env_factory("trace/Arithmetic-v0", {"n_tasks": 8})


def test_expert_spec_plays_the_envs_scripted_expert():
    policy = policy_from_spec("expert", make_env=ARITHMETIC)
    assert isinstance(policy, ExpertPolicy)
    result = evaluate_policy(policy, ARITHMETIC, 4)
    assert result.success == 1.0 and all(n >= 2 for t in result.tasks for n in t.turns)


def test_expert_noise_in_the_spec_makes_it_err():
    policy = policy_from_spec("expert:1.0", make_env=ARITHMETIC)
    assert evaluate_policy(policy, ARITHMETIC, 8, seed=0).success < 1.0


@pytest.mark.parametrize("spec", ["expert:abc", "expert:1.5"])
def test_a_bad_expert_noise_is_a_config_error(spec):
    with pytest.raises(ConfigError, match=r"expert:0\.3"):
        policy_from_spec(spec, make_env=ARITHMETIC)


def test_expert_without_an_env_says_how_to_pass_one():
    with pytest.raises(ConfigError, match="make_env"):
        policy_from_spec("expert")


def test_a_model_folder_is_a_transformers_policy(nano_dir):
    for spec in (str(nano_dir), f"hf:{nano_dir}"):
        policy = policy_from_spec(spec, PolicyOptions(device="cpu"))
        assert isinstance(policy, HFPolicy)
        out = policy.generate([Request(prompt_ids=[5, 6])], SamplingParams(temperature=0, max_new_tokens=3,
                                                                            min_new_tokens=3))
        assert len(out[0].token_ids) == 3


def test_a_folder_that_is_not_a_model_says_what_is_missing(tmp_path):
    with pytest.raises(ConfigError, match=r"config\.json"):
        policy_from_spec(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="tokenizer files"):
        check_model_folder(tmp_path)


def test_an_unknown_spec_lists_the_forms(tmp_path):
    with pytest.raises(ConfigError, match="vllm:PATH"):
        policy_from_spec(str(tmp_path / "nothing-here"))


def test_vllm_spec_without_vllm_says_how_to_install_it(nano_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError, whether it is installed or not
    with pytest.raises(SetupError, match=r"\[vllm\]"):
        policy_from_spec(f"vllm:{nano_dir}")


def test_openai_spec_talks_to_the_server_at_the_base_url():
    with ScriptedServer() as server:
        policy = policy_from_spec("openai:my-model", PolicyOptions(base_url=server.url, concurrency=2))
        assert isinstance(policy, OpenAIPolicy) and policy.concurrency == 2
        assert policy.generate([Request(messages=[{"role": "user", "content": "hi"}])], SamplingParams())[0].text
    assert server.requests[-1]["body"]["model"] == "my-model"


def test_openai_base_url_comes_from_the_environment(monkeypatch):
    with ScriptedServer() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        assert policy_from_spec("openai:m").base_url == server.url  # type: ignore[attr-defined]


def test_openai_spec_without_a_base_url_names_the_flag_and_the_variable(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_BASE_URL") as err:
        policy_from_spec("openai:m")
    assert "--base-url" in str(err.value) and "PolicyOptions" not in str(err.value)


@pytest.mark.parametrize(("spec", "meant"), [("openai/gpt-4o", "openai:gpt-4o"), ("vllm/models/tiny",
                                                                                   "vllm:models/tiny")])
def test_a_provider_slash_model_spec_suggests_the_colon_form(spec, meant, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no such folder here
    with pytest.raises(ConfigError, match=f"did you mean {meant}\\?"):
        policy_from_spec(spec)


def test_extra_body_options_reach_every_request():
    with ScriptedServer() as server:
        policy = policy_from_spec("openai:m", PolicyOptions(base_url=server.url,
                                                            extra_body={"reasoning_effort": "low"}))
        policy.generate([Request(messages=[{"role": "user", "content": "hi"}])], SamplingParams())
    assert server.requests[-1]["body"]["reasoning_effort"] == "low"


def test_a_url_spec_uses_the_one_model_the_server_serves():
    with ScriptedServer(models=("only-one",)) as server:
        assert policy_from_spec(server.url).model == "only-one"  # type: ignore[attr-defined]


def test_a_url_spec_on_a_server_of_several_models_asks_for_a_name():
    with ScriptedServer(models=("a", "b")) as server:
        with pytest.raises(ConfigError, match="it serves a, b"):
            policy_from_spec(server.url)
        assert policy_from_spec(server.url, PolicyOptions(model="b")).model == "b"  # type: ignore[attr-defined]


def test_the_api_key_comes_from_the_named_variable(monkeypatch):
    monkeypatch.setenv("MY_SERVER_KEY", "sk-123")
    with ScriptedServer() as server:
        policy = policy_from_spec("openai:m", PolicyOptions(base_url=server.url, api_key_env="MY_SERVER_KEY"))
        policy.generate([Request(messages=[{"role": "user", "content": "hi"}])], SamplingParams())
    assert server.requests[-1]["headers"]["Authorization"] == "Bearer sk-123"


def test_a_named_key_variable_that_is_unset_is_a_config_error(monkeypatch):
    monkeypatch.delenv("MY_SERVER_KEY", raising=False)
    with pytest.raises(ConfigError, match="MY_SERVER_KEY"):
        policy_from_spec("openai:m", PolicyOptions(base_url="http://127.0.0.1:9/v1", api_key_env="MY_SERVER_KEY"))


def test_a_local_tokenizer_sends_token_prompts(nano_dir):
    with ScriptedServer() as server:
        policy = policy_from_spec("openai:m", PolicyOptions(base_url=server.url, tokenizer=str(nano_dir)))
        policy.generate([Request(messages=[{"role": "user", "content": "hi"}])], SamplingParams())
    sent = server.requests[-1]
    assert sent["path"] == "/v1/completions" and all(isinstance(t, int) for t in sent["body"]["prompt"])


def test_a_bare_openai_spec_takes_the_model_option_or_the_one_served():
    with ScriptedServer(models=("only-one",)) as server:
        assert policy_from_spec("openai", PolicyOptions(base_url=server.url)).model == "only-one"  # type: ignore
        named = policy_from_spec("openai", PolicyOptions(base_url=server.url, model="other"))
        assert named.model == "other"  # type: ignore[attr-defined]


def test_two_different_model_names_are_a_config_error():
    with pytest.raises(ConfigError, match="one model name"):
        policy_from_spec("openai:a", PolicyOptions(base_url="http://127.0.0.1:9/v1", model="b"))


@pytest.mark.parametrize(("spec", "backend"), [("expert", "expert"), ("expert:0.3", "expert"), ("hf:org/m", "hf"),
                                               ("vllm:/m", "vllm"), ("openai", "openai"), ("openai:m", "openai"),
                                               ("http://127.0.0.1:8000/v1", "openai")])
def test_the_backend_of_a_spec_comes_from_its_form_alone(spec, backend):
    assert backend_of(spec) == backend


def test_the_backend_of_an_existing_folder_is_transformers(tmp_path):
    assert backend_of(str(tmp_path)) == "hf"
    with pytest.raises(ConfigError, match="vllm:PATH"):
        backend_of(str(tmp_path / "missing"))
