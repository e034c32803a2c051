"""The HTTP backend's retries, in-flight limit and error messages, against a real local HTTP server
(tests/agents/openai_server.py). The real `vllm serve` tests are in tests/vllm (make test-vllm)."""

from __future__ import annotations

import json
import threading

import pytest

from tests.agents.openai_server import ScriptedServer, chat
from trace_gym.agents.openai_backend import OpenAIPolicy, _retry_after
from trace_gym.agents.policy import Request, SamplingParams
from trace_gym.errors import ServerError, UserError

MSGS = [{"role": "user", "content": "2+2?"}]


def _failing_first(times: int, status: int, headers: dict[str, str] | None = None):
    seen = {"n": 0}

    def script(path, body):
        seen["n"] += 1
        if seen["n"] <= times:
            return status, headers or {}, b'{"error": "busy"}'
        return chat()

    return script


def test_transient_failures_are_retried_until_the_answer():
    with ScriptedServer(_failing_first(2, 503)) as server:
        policy = OpenAIPolicy(server.url, "m", max_retries=3, backoff=0.01)
        out = policy.generate([Request(messages=MSGS)], SamplingParams(max_new_tokens=4))
    assert out[0].text == "<answer>4</answer>" and len(server.requests) == 3


def test_rate_limited_requests_with_retry_after_are_retried():
    with ScriptedServer(_failing_first(1, 429, {"Retry-After": "0"})) as server:
        out = OpenAIPolicy(server.url, "m", backoff=0.01).generate([Request(messages=MSGS)], SamplingParams())
    assert out[0].text == "<answer>4</answer>" and len(server.requests) == 2


def test_retry_after_reads_seconds_and_ignores_dates():
    assert _retry_after("3") == 3.0 and _retry_after(None) == 0.0
    assert _retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0


def test_a_refused_request_is_not_retried_and_carries_the_servers_message():
    refuse = ScriptedServer(lambda path, body: (404, {}, b'{"error": "model m does not exist"}'))
    with refuse as server, pytest.raises(ServerError, match="model m does not exist"):
        OpenAIPolicy(server.url, "m", backoff=0.01).generate([Request(messages=MSGS)], SamplingParams())
    assert len(server.requests) == 1


def test_giving_up_after_the_retries_is_a_user_error():
    with ScriptedServer(_failing_first(99, 502)) as server, pytest.raises(UserError, match="after 2 retries"):
        OpenAIPolicy(server.url, "m", max_retries=2, backoff=0.01).generate([Request(messages=MSGS)],
                                                                            SamplingParams())
    assert len(server.requests) == 3


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
        policy = OpenAIPolicy(server.url, "m", concurrency=3)
        threads = [threading.Thread(target=policy.generate, args=([Request(messages=MSGS)] * 6, SamplingParams()))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(server.requests) == 24 and 1 <= server.max_in_flight <= 3


def test_token_prompts_go_to_completions_and_keep_the_token_ids():
    with ScriptedServer() as server:
        out = OpenAIPolicy(server.url, "m").generate([Request(prompt_ids=[1, 2, 3])], SamplingParams(seed=5))
    sent = server.requests[0]
    assert sent["path"] == "/v1/completions" and sent["body"]["prompt"] == [1, 2, 3]
    assert out[0].token_ids == [7, 8] and out[0].logprobs == [-0.5, -0.5] and out[0].prompt_tokens == 3


def test_the_api_key_goes_in_the_authorization_header():
    with ScriptedServer() as server:
        OpenAIPolicy(server.url, "m", api_key="sk-test").generate([Request(messages=MSGS)], SamplingParams())
    assert server.requests[0]["headers"]["Authorization"] == "Bearer sk-test"


def test_models_lists_what_the_server_serves():
    with ScriptedServer(models=("a", "b")) as server:
        assert OpenAIPolicy(server.url, "").models() == ["a", "b"]

