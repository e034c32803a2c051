"""`trace-gym eval` against a real local HTTP server that refuses fields as OpenAI's hosted reasoning models do
(tests/agents/openai_server.py, ``mode="reasoning"``): evaluated with no extra flag, each adaptation said once;
``--extra-body`` passes fields through, and a bad one is one line; the policy flags' common slips get one line
that names the fix."""

from __future__ import annotations

import json
import logging

from tests.agents.openai_server import ExpertScript, ScriptedServer, reasoning_refusal
from trace_gym.env_specs import env_factory
from trace_gym.training.cli.main import main

ARITH = ["--env", "trace/Arithmetic-v0", "--env-arg", "n_tasks=4"]


def _one_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(err) == 1 and "fix: " in err[0], err
    return err[0]


def test_an_endpoint_refusing_max_tokens_and_logprobs_is_evaluated_with_no_extra_flag(capsys, caplog):
    make_env = env_factory("trace/Arithmetic-v0", {"n_tasks": 4})
    with ScriptedServer(ExpertScript(make_env, "openai"), mode="reasoning") as server, \
            caplog.at_level(logging.WARNING):
        assert main(["eval", *ARITH, "--policy", "openai:gpt-5", "--base-url", server.url, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["episodes"], summary["errors"], summary["success"]) == (4, 0, 1.0)
    said = sorted(r.getMessage().split(" refuses ")[1].split(" ")[0] for r in caplog.records
                  if " refuses " in r.getMessage())
    assert said == ["logprobs", "max_tokens", "temperature"]  # eval's greedy temperature 0 too, each said once
    answered = [r["body"] for r in server.requests if r["path"] == "/v1/chat/completions"
                and reasoning_refusal(r["body"]) is None]
    assert answered and all(b["max_completion_tokens"] == 256 and "logprobs" not in b for b in answered)


def test_extra_body_passes_fields_to_every_request(capsys):
    make_env = env_factory("trace/Arithmetic-v0", {"n_tasks": 4})
    with ScriptedServer(ExpertScript(make_env, "openai")) as server:
        assert main(["eval", *ARITH, "--policy", "openai:m", "--base-url", server.url, "--extra-body",
                     '{"reasoning_effort": "low", "metadata": {"run": "a"}}', "--json"]) == 0
    posts = [r["body"] for r in server.requests if r["path"] == "/v1/chat/completions"]
    assert posts and all(b["reasoning_effort"] == "low" and b["metadata"] == {"run": "a"} for b in posts)


def test_extra_body_that_is_not_a_json_object_is_one_line(capsys):
    line = _one_line(capsys, ["eval", *ARITH, "--policy", "openai:m", "--base-url", "http://127.0.0.1:9/v1",
                              "--extra-body", "reasoning_effort=low"])
    assert "--extra-body" in line and "JSON object" in line


def test_extra_body_with_a_policy_that_sends_no_requests_is_one_line(capsys):
    line = _one_line(capsys, ["eval", *ARITH, "--policy", "expert", "--extra-body", "{}"])
    assert "drop --extra-body" in line


def test_a_litellm_style_model_name_gets_the_colon_form(capsys):
    line = _one_line(capsys, ["eval", *ARITH, "--policy", "openai/gpt-4o"])
    assert "did you mean openai:gpt-4o?" in line


def test_a_missing_base_url_names_the_flag(capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    line = _one_line(capsys, ["eval", *ARITH, "--policy", "openai:gpt-4o"])
    assert "--base-url" in line and "OPENAI_BASE_URL" in line and "PolicyOptions" not in line
