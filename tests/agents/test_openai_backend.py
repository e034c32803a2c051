"""The HTTP backend's retries (shown as they happen), in-flight limit, request fields and error messages, against
a real local HTTP server (tests/agents/openai_server.py). The real `vllm serve` tests are in tests/vllm (make
test-vllm)."""

from __future__ import annotations

import json
import logging
import socket
import threading

import pytest

from tests.agents.openai_server import ScriptedServer, chat, openai_error
from trace_gym.agents.openai_backend import OpenAIPolicy
from trace_gym.agents.policy import Request, SamplingParams
from trace_gym.errors import ServerError, UserError

MSGS = [{"role": "user", "content": "2+2?"}]
# The request fields of the OpenAI API's /chat/completions and /completions that the backend sends.
STANDARD = {"model", "messages", "prompt", "n", "temperature", "top_p", "max_tokens", "seed", "stop", "logprobs",
            "top_logprobs", "tools", "tool_choice"}


def _failing_first(times: int, status: int, headers: dict[str, str] | None = None):
    seen = {"n": 0}

    def script(path, body):
        seen["n"] += 1
        if seen["n"] <= times:
            return status, headers or {}, b'{"error": "busy"}'
        return chat()

    return script


def test_transient_failures_are_retried_until_the_answer_and_each_retry_is_shown(caplog):
    with ScriptedServer(_failing_first(2, 503)) as server, caplog.at_level(logging.WARNING):
        policy = OpenAIPolicy(server.url, "m", max_retries=3)
        out = policy.generate([Request(messages=MSGS)], SamplingParams(max_new_tokens=4))
    posts = [r for r in server.requests if r["path"].endswith("/chat/completions")]
    assert out[0].text == "<answer>4</answer>" and len(posts) == 3
    shown = [r.getMessage() for r in caplog.records]
    assert [m.split(": ", 1)[1] for m in shown if "/chat/completions" in m] == ["HTTP 503; retry 1 of 3",
                                                                                 "HTTP 503; retry 2 of 3"]


def test_rate_limited_requests_with_retry_after_are_retried():
    with ScriptedServer(_failing_first(1, 429, {"Retry-After": "0.05"})) as server:
        out = OpenAIPolicy(server.url, "m", server="openai").generate([Request(messages=MSGS)], SamplingParams())
    assert out[0].text == "<answer>4</answer>" and len(server.requests) == 2


def test_a_refused_request_is_not_retried_and_carries_the_servers_message():
    refuse = ScriptedServer(lambda path, body: (404, {}, b'{"error": "model m does not exist"}'))
    with refuse as server, pytest.raises(ServerError, match="model m does not exist"):
        OpenAIPolicy(server.url, "m", server="openai").generate([Request(messages=MSGS)], SamplingParams())
    assert len(server.requests) == 1


def test_a_request_failing_after_its_retries_is_that_rows_error_and_the_others_answer():
    seen = {"n": 0}

    def second_fails(path, body):
        seen["n"] += 1
        return (502, {}, b'{"error": "down"}') if body["messages"][0]["content"] == "fail" else chat()

    with ScriptedServer(second_fails) as server:
        out = OpenAIPolicy(server.url, "m", max_retries=2, server="openai", concurrency=1).generate(
            [Request(messages=MSGS), Request(messages=[{"role": "user", "content": "fail"}]), Request(messages=MSGS)],
            SamplingParams())
    assert [g.error is None for g in out] == [True, False, True] and seen["n"] == 5
    assert out[1].finish_reason == "error" and out[1].text == "" and "after 2 retries" in out[1].error


def test_a_conversation_past_the_context_is_that_rows_error_but_other_refusals_raise():
    too_long = b'{"error": "This model\'s maximum context length is 4096 tokens"}'
    with ScriptedServer(lambda path, body: (400, {}, too_long)) as server:
        out = OpenAIPolicy(server.url, "m", server="openai").generate([Request(messages=MSGS)], SamplingParams())
    assert "max-model-len" in out[0].error
    with ScriptedServer(lambda path, body: (401, {}, b'{"error": "bad key"}')) as server, \
            pytest.raises(UserError, match="bad key"):
        OpenAIPolicy(server.url, "m", server="openai").generate([Request(messages=MSGS)], SamplingParams())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_never_reached_is_an_error_at_once_not_after_retries(caplog):
    policy = OpenAIPolicy(f"http://127.0.0.1:{_free_port()}/v1", "m", max_retries=5)
    with caplog.at_level(logging.WARNING), pytest.raises(ServerError, match="not retried: it never answered"):
        policy.generate([Request(messages=MSGS)], SamplingParams())
    assert not [r for r in caplog.records if "retry" in r.getMessage()]


def test_a_server_lost_after_answering_is_retried_then_an_error(caplog):
    with ScriptedServer() as server:
        policy = OpenAIPolicy(server.url, "m", max_retries=1)
        policy.generate([Request(messages=MSGS)], SamplingParams())
    with caplog.at_level(logging.WARNING):
        out = policy.generate([Request(messages=MSGS)], SamplingParams())
    assert "after 1 retries" in out[0].error and "ConnectError" in out[0].error
    assert any("retry 1 of 1" in r.getMessage() for r in caplog.records)


def test_a_response_that_is_not_json_says_to_check_the_base_url():
    html = ScriptedServer(lambda path, body: (200, {"Content-Type": "text/html"}, b"<html>hi</html>"))
    with html as server, pytest.raises(ServerError, match="/v1"):
        OpenAIPolicy(server.url, "m").generate([Request(messages=MSGS)], SamplingParams())


def test_a_response_without_choices_is_a_server_error():
    no_choices = ScriptedServer(lambda path, body: (200, {}, json.dumps({"object": "list"}).encode()))
    with no_choices as server, pytest.raises(ServerError, match="choices"):
        OpenAIPolicy(server.url, "m").generate([Request(messages=MSGS)], SamplingParams())


def test_the_in_flight_limit_holds_over_threads_sharing_the_policy():
    with ScriptedServer(hold=0.05) as server:
        policy = OpenAIPolicy(server.url, "m", concurrency=3, server="openai")
        threads = [threading.Thread(target=policy.generate, args=([Request(messages=MSGS)] * 6, SamplingParams()))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(server.requests) == 24 and 1 <= server.max_in_flight <= 3


def test_token_prompts_go_to_completions_and_keep_the_token_ids():
    with ScriptedServer(owned_by="vllm") as server:
        out = OpenAIPolicy(server.url, "m").generate([Request(prompt_ids=[1, 2, 3])], SamplingParams(seed=5))
    sent = next(r for r in server.requests if r["path"].endswith("/completions"))
    assert sent["body"]["return_tokens_as_token_ids"] is True
    assert sent["path"] == "/v1/completions" and sent["body"]["prompt"] == [1, 2, 3]
    assert out[0].token_ids == [7, 8] and out[0].logprobs == [-0.5, -0.5] and out[0].prompt_tokens == 3


def test_the_api_key_goes_in_the_authorization_header():
    with ScriptedServer() as server:
        OpenAIPolicy(server.url, "m", api_key="sk-test").generate([Request(messages=MSGS)], SamplingParams())
    assert server.requests[-1]["headers"]["Authorization"] == "Bearer sk-test"


def test_models_lists_what_the_server_serves():
    with ScriptedServer(models=("a", "b")) as server:
        assert OpenAIPolicy(server.url, "").models() == ["a", "b"]



@pytest.mark.parametrize("owner", ["openai", "sglang"])
def test_a_server_not_known_to_be_vllm_gets_the_standard_fields_only(owner):
    sampling = SamplingParams(top_k=5, min_new_tokens=1, stop=("\n",), seed=1)
    with ScriptedServer(owned_by=owner) as server:
        OpenAIPolicy(server.url, "m").generate([Request(messages=MSGS), Request(prompt_ids=[1, 2])], sampling)
    posts = [r["body"] for r in server.requests if r["path"] != "/v1/models"]
    assert len(posts) == 2 and all(set(body) <= STANDARD for body in posts)


def test_a_vllm_server_gets_its_extra_fields_for_exact_token_ids():
    with ScriptedServer(owned_by="vllm") as server:
        policy = OpenAIPolicy(server.url, "m")
        policy.generate([Request(messages=MSGS)], SamplingParams(top_k=5))
    body = server.requests[-1]["body"]
    assert policy.server == "vllm" and body["top_k"] == 5 and body["return_tokens_as_token_ids"] is True
    assert sum(r["path"] == "/v1/models" for r in server.requests) == 1  # asked once


# ----------------------------------------------------------------------------- hosted reasoning models


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "refuses" in r.getMessage()]


def test_a_reasoning_model_endpoint_is_adapted_to_once_with_a_warning_per_field(caplog):
    """The server refuses max_tokens, logprobs and temperature 0 one at a time, as OpenAI's o-series and gpt-5 do:
    the first request learns each, every later one is sent adapted, and each field is said once."""
    sampling = SamplingParams(temperature=0.0, max_new_tokens=64)
    with ScriptedServer(mode="reasoning") as server, caplog.at_level(logging.WARNING):
        policy = OpenAIPolicy(server.url, "gpt-5", server="openai", concurrency=1)
        first = policy.generate([Request(messages=MSGS)] * 3, sampling)
        second = policy.generate([Request(messages=MSGS)] * 2, sampling)
    posts = [r["body"] for r in server.requests if r["path"] == "/v1/chat/completions"]
    assert [g.text for g in first + second] == ["<answer>4</answer>"] * 5 and all(g.error is None for g in first)
    assert len(posts) == 4 + 4  # the first request sent 4 times (3 fields learnt), then one each
    adapted = posts[-1]
    assert adapted["max_completion_tokens"] == 64 and not {"max_tokens", "logprobs", "top_logprobs",
                                                           "temperature"} & set(adapted)
    assert policy.adapted == {"max_tokens": "max_completion_tokens", "logprobs": None, "top_logprobs": None,
                              "temperature": None}
    said = _warnings(caplog)
    assert len(said) == 3 and ["max_completion_tokens" in said[0], "without log-probabilities" in said[1],
                               "temperature" in said[2]] == [True, True, True]
    assert first[0].logprobs == [] and first[0].token_ids == []  # what is lost without them


def test_threads_that_meet_the_same_refusal_together_adapt_once_and_say_it_once(caplog):
    with ScriptedServer(mode="reasoning", hold=0.05) as server, caplog.at_level(logging.WARNING):
        policy = OpenAIPolicy(server.url, "o3", server="openai", concurrency=8)
        out = policy.generate([Request(messages=MSGS)] * 16, SamplingParams(temperature=1.0))
    assert all(g.text == "<answer>4</answer>" for g in out)
    said = _warnings(caplog)
    assert sorted(s.split(" refuses ")[1].split(" ")[0] for s in said) == ["logprobs", "max_tokens"]


def test_a_server_that_takes_the_standard_fields_is_never_adapted(caplog):
    with ScriptedServer() as server, caplog.at_level(logging.WARNING):
        policy = OpenAIPolicy(server.url, "gpt-4o", server="openai")
        out = policy.generate([Request(messages=MSGS)], SamplingParams(max_new_tokens=8))
    assert policy.adapted == {} and not _warnings(caplog) and out[0].logprobs == [-0.1]
    assert server.requests[-1]["body"]["max_tokens"] == 8 and server.requests[-1]["body"]["logprobs"] is True


def test_extra_body_fields_go_with_every_request_as_given():
    with ScriptedServer(mode="reasoning") as server:
        policy = OpenAIPolicy(server.url, "gpt-5", server="openai",
                              extra_body={"reasoning_effort": "low", "max_completion_tokens": 2048})
        policy.generate([Request(messages=MSGS)], SamplingParams(temperature=1.0, max_new_tokens=8))
    sent = server.requests[-1]["body"]
    assert sent["reasoning_effort"] == "low" and sent["max_completion_tokens"] == 2048 and "max_tokens" not in sent


def test_a_refused_field_of_extra_body_is_not_adapted_but_named():
    with ScriptedServer(mode="reasoning") as server, pytest.raises(UserError, match="drop logprobs from extra_body"):
        OpenAIPolicy(server.url, "gpt-5", server="openai", extra_body={"logprobs": True}).generate(
            [Request(messages=MSGS)], SamplingParams(temperature=1.0))


def test_an_unsupported_field_the_policy_cannot_leave_out_is_a_refusal():
    def refuse_stop(path, body):
        if "stop" in body:
            return openai_error("stop", "unsupported_parameter", "Unsupported parameter: 'stop' is not supported "
                                "with this model.")
        return chat()

    with ScriptedServer(refuse_stop) as server, pytest.raises(UserError, match="'stop' is not supported"):
        OpenAIPolicy(server.url, "o3", server="openai").generate([Request(messages=MSGS)],
                                                                 SamplingParams(stop=("\n",)))
    assert len(server.requests) == 1


@pytest.mark.parametrize("extra", [{"model": "other"}, {"messages": []}, ["not", "an", "object"]])
def test_extra_body_may_not_replace_the_request(extra):
    with pytest.raises(UserError, match="extra_body"):
        OpenAIPolicy("http://127.0.0.1:9/v1", "m", extra_body=extra)  # type: ignore[arg-type]
