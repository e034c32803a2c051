"""SmolLM2-135M-Instruct (as `trace-gym model fetch smollm2-135m` leaves it in the cache) served by `vllm serve`
with the Hermes tool-call parser, evaluated through the OpenAI backend with native tool calls (make test-vllm,
which fetches it first and sets TRACE_GYM_REQUIRE_REAL=1; elsewhere an absent model skips)."""

from __future__ import annotations

import os

import pytest

from tests.vllm.conftest import serve
from trace_gym.agents.fetch import DONE, cached_model
from trace_gym.agents.policy import SamplingParams
from trace_gym.agents.specs import PolicyOptions, policy_from_spec
from trace_gym.env_specs import env_factory
from trace_gym.training.rollout.evaluate import evaluate_policy


@pytest.fixture(scope="module")
def real_server(tmp_path_factory):
    folder = cached_model("smollm2-135m")
    if not (folder / DONE).is_file():
        if os.environ.get("TRACE_GYM_REQUIRE_REAL") == "1":
            pytest.fail(f"TRACE_GYM_REQUIRE_REAL=1 but no fetched model at {folder}; fix: trace-gym model fetch "
                        "smollm2-135m")
        pytest.skip("SmolLM2-135M not fetched (make test-vllm fetches it)")
    with serve(folder, tmp_path_factory.mktemp("serve-real") / "serve.log", ("smollm2",), 2048) as url:
        yield url


def test_the_served_real_model_plays_the_env_through_native_tool_calls(real_server):
    make_env = env_factory("trace/Arithmetic-v0", {"n_tasks": 8, "max_turns": 3})
    policy = policy_from_spec("openai:smollm2", PolicyOptions(base_url=real_server, tool_calls="native"), make_env)
    result = evaluate_policy(policy, make_env, 4, sampling=SamplingParams(temperature=0, max_new_tokens=64),
                             keep_trees=True, workers=2)
    assert len(result.tasks) == 4 and not any(e for t in result.tasks for e in t.errors)  # no server errors
    leaves = [n for t in result.trees for n in t.nodes[1:] if n.is_terminal]
    # a plain reply is the final answer (the server returns no tool_calls): every episode ends with one or a cut
    assert leaves and all(n.info.get("stop_reason") in ("answer", "max_turns", "max_context") for n in leaves)
