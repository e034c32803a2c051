"""Native tool calling over HTTP against a real local server that answers the OpenAI way (tool_calls with content
null, the final answer a plain message): episodes score what the text form scores, requests carry the env's
tools, its native system message and the call ids, no answer text can become a tool call, and an answer the
backend cannot map is an error, never an empty turn."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.agents.calc_env import CalcEnv
from tests.agents.openai_server import ExpertScript, ScriptedServer, message_reply
from trace_gym.actions import HermesParser, TagParser
from trace_gym.agents.native_tools import ToolFormat
from trace_gym.agents.openai_backend import OpenAIPolicy
from trace_gym.agents.policy import Request, SamplingParams
from trace_gym.agents.specs import PolicyOptions, policy_from_spec
from trace_gym.env import NATIVE_INSTRUCTIONS
from trace_gym.env_specs import env_factory
from trace_gym.errors import ServerError
from trace_gym.tools import ToolCall
from trace_gym.training.rollout.evaluate import evaluate_policy

ROOT = Path(__file__).resolve().parents[2]
GREEDY = SamplingParams(temperature=0, max_new_tokens=32, seed=3)


def make_calc():
    return CalcEnv(split="test", n=12)


def _play(shape: str, tool_calls: str, env_args: dict | None = None):
    """The Arithmetic env's noisy expert behind a server, played through the HTTP backend; the chat requests."""
    make_env = env_factory("trace/Arithmetic-v0", env_args or {"n_tasks": 8, "max_turns": 3})
    with ScriptedServer(ExpertScript(make_env, shape, noise=0.4)) as server:
        policy = policy_from_spec("openai:m", PolicyOptions(base_url=server.url, tool_calls=tool_calls), make_env)
        result = evaluate_policy(policy, make_env, 8, samples=2, sampling=GREEDY, workers=2)
    return result, [r for r in server.requests if r["path"].endswith("/chat/completions")]


@pytest.mark.parametrize("shape", ["openai", "tools"])
def test_native_tool_calls_score_what_the_text_form_scores(shape):
    native, requests = _play(shape, "native")
    text, _ = _play("text", "text")
    assert [t.row() for t in native.tasks] == [t.row() for t in text.tasks]
    assert 0.0 < native.success < 1.0  # the expert's noise: both outcomes occur, identically
    assert any(r["body"]["messages"][-1]["role"] == "tool" for r in requests)


def test_a_plain_final_answer_is_scored_in_both_action_formats():
    """The OpenAI way ends with a message without tool calls and without tags: it is the answer, whatever the env's
    own text format (tags or Hermes JSON)."""
    for fmt in ("tags", "hermes"):
        result, requests = _play("openai", "native", {"n_tasks": 8, "max_turns": 3, "action_format": fmt})
        final = [r for r in requests if r["body"]["messages"][-1]["role"] == "tool"]
        assert final and result.success > 0.0, fmt
        assert all(a and "<answer>" not in a for t in result.tasks for a in t.answers)  # the plain reply, read


def test_requests_carry_the_env_tools_and_answer_each_call_by_its_id():
    _, requests = _play("openai", "native")
    first, second = requests[0]["body"], next(r["body"] for r in requests if len(r["body"]["messages"]) > 2)
    assert [t["function"]["name"] for t in first["tools"]] == ["python"]
    assistant, result = second["messages"][-2:]
    assert assistant["content"] is None and assistant["tool_calls"][0]["id"].startswith("chatcmpl-tool-")
    assert result == {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"],
                      "content": result["content"]}


@pytest.mark.parametrize("fmt", ["tags", "hermes"])
def test_the_native_system_message_teaches_no_text_tool_format(fmt):
    _, requests = _play("openai", "native", {"n_tasks": 8, "max_turns": 3, "action_format": fmt})
    systems = {r["body"]["messages"][0]["content"] for r in requests}
    assert len(systems) == 1
    (system,) = systems
    assert NATIVE_INSTRUCTIONS in system
    assert not any(m in system for m in ("<tools>", "<tool_call>", "<python>", "<answer>"))
    _, text_requests = _play("text", "text", {"n_tasks": 8, "max_turns": 3, "action_format": fmt})
    assert "<python>" in text_requests[0]["body"]["messages"][0]["content"] or fmt == "hermes"


def test_a_tool_call_becomes_the_env_action_in_its_own_format():
    fmt = ToolFormat.of_env(CalcEnv())
    msg = {"content": None, "tool_calls": [{"id": "a", "type": "function",
                                            "function": {"name": "python", "arguments": '{"code": "2+3"}'}}]}
    assert fmt.action(msg) == "<python>2+3</python>"
    hermes = ToolFormat(fmt.tools, HermesParser())
    assert HermesParser().parse(hermes.action(msg), {"python": fmt.tools[0]}).calls == (ToolCall("python",
                                                                                                 {"code": "2+3"}),)


def test_text_beside_the_calls_stays_in_front_of_them():
    fmt = ToolFormat.of_env(CalcEnv())
    msg = {"content": "Let me compute.", "tool_calls": [
        {"id": "a", "function": {"name": "python", "arguments": {"code": "2+3"}}}]}
    assert fmt.action(msg) == "Let me compute.\n<python>2+3</python>"


@pytest.mark.parametrize("arguments", ['{"code": ', '{"code": 5}', '{"code": "1+1", "x": "2"}',
                                       '{"code": ' + "9" * 5000 + "}", "[" * 100_000])
def test_a_call_the_env_cannot_run_is_an_error_observation_not_a_crash(arguments):
    env = CalcEnv()
    env.reset(seed=0)
    action = ToolFormat.of_env(env).action({"tool_calls": [{"id": "a", "function": {"name": "python",
                                                                                    "arguments": arguments}}]})
    _, reward, terminated, _, info = env.step(action)
    assert reward == 0 and not terminated and info["error"]


def test_history_goes_back_as_the_server_sent_it_and_foreign_turns_get_ids():
    fmt = ToolFormat(ToolFormat.of_env(CalcEnv()).tools, TagParser())
    sent = {"content": None, "tool_calls": [{"id": "srv-1", "type": "function",
                                             "function": {"name": "python", "arguments": '{"code":"1+1"}'}}]}
    mine = fmt.action(sent)
    history = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
               {"role": "assistant", "content": mine}, {"role": "tool", "name": "python", "content": "2"},
               {"role": "assistant", "content": "<python>2*3</python>"}, {"role": "tool", "content": "6"},
               {"role": "assistant", "content": "oops"}, {"role": "tool", "content": "Error: no tag"}]
    wire = fmt.wire_messages(history)
    assert wire[2]["tool_calls"] == sent["tool_calls"] and wire[3] == {"role": "tool", "tool_call_id": "srv-1",
                                                                        "content": "2"}
    assert wire[4]["tool_calls"][0]["id"] == "call_1_0"
    assert json.loads(wire[4]["tool_calls"][0]["function"]["arguments"]) == {"code": "2*3"}
    assert wire[5]["tool_call_id"] == "call_1_0"
    assert wire[6] == {"role": "assistant", "content": "oops"} and wire[7] == {"role": "user",
                                                                                "content": "Error: no tag"}


@pytest.mark.parametrize("message", [{"role": "assistant", "content": None},
                                     {"role": "assistant", "content": None, "tool_calls": [{"id": "a"}]},
                                     {"role": "assistant", "content": None, "tool_calls": "python(2+3)"}])
def test_an_answer_the_backend_cannot_map_is_a_server_error(message):
    with ScriptedServer(lambda path, body: message_reply(message)) as server, pytest.raises(ServerError):
        policy = policy_from_spec("openai:m", PolicyOptions(base_url=server.url), make_calc)
        policy.generate([Request(messages=[{"role": "user", "content": "What is 1 + 1?"}])], GREEDY)


def test_tool_calls_without_an_env_format_are_a_server_error_that_says_how():
    reply = {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "function": {"name": "python",
                                                                                         "arguments": "{}"}}]}
    with ScriptedServer(lambda path, body: message_reply(reply)) as server, \
            pytest.raises(ServerError, match="make_env"):
        OpenAIPolicy(server.url, "m").generate([Request(messages=[{"role": "user", "content": "hi"}])], GREEDY)


def test_a_server_refusing_tools_says_to_enable_its_tool_parser():
    refuse = ScriptedServer(lambda path, body: (400, {}, b'{"error": "\\"auto\\" tool choice requires '
                                                        b'--enable-auto-tool-choice and --tool-call-parser"}'))
    with refuse as server, pytest.raises(ServerError, match="--tool-calls text"):
        policy_from_spec("openai:m", PolicyOptions(base_url=server.url), make_calc).generate(
            [Request(messages=[{"role": "user", "content": "What is 1 + 1?"}])], GREEDY)


def test_native_answers_keep_the_exact_sampled_token_ids():
    reply = {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "function": {
        "name": "python", "arguments": '{"code": "1+1"}'}}]}
    with ScriptedServer(lambda path, body: message_reply(reply, "tool_calls", (5, 6, 7))) as server:
        policy = policy_from_spec("openai:m", PolicyOptions(base_url=server.url), make_calc)
        gen = policy.generate([Request(messages=[{"role": "user", "content": "What is 1 + 1?"}])], GREEDY)[0]
    assert (gen.text, gen.token_ids, gen.logprobs, gen.finish_reason) == ("<python>1+1</python>", [5, 6, 7],
                                                                          [-0.25] * 3, "stop")


@pytest.mark.slow
def test_trace_gym_eval_scores_a_tool_calling_server_as_a_text_server(tmp_path):
    """The command, end to end, on the sandboxed Arithmetic env: a server answering the OpenAI way (tool calls, then
    a plain final answer) and one answering in text give the same rows."""
    make_env = env_factory("trace/Arithmetic-v0", {"n_tasks": 6, "max_turns": 3})
    rows = {}
    for shape, mode in (("openai", "native"), ("text", "text")):
        with ScriptedServer(ExpertScript(make_env, shape, noise=0.3)) as server:
            out = tmp_path / mode
            result = subprocess.run(
                [sys.executable, "-m", "trace_gym.training.cli.main", "eval", "--env", "trace/Arithmetic-v0",
                 "--env-arg", "n_tasks=6", "--env-arg", "max_turns=3", "--policy", "openai:m", "--base-url",
                 server.url, "--server", "openai", "--tool-calls", mode, "--tasks", "6", "--samples", "2",
                 "--out", str(out), "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        rows[mode] = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
        summary = json.loads(result.stdout)
        assert summary["episodes"] == 12 and summary["success"] is not None
    assert rows["native"] == rows["text"] and any(r["success"] > 0 for r in rows["native"])


@settings(derandomize=True, max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["<", ">", "/", "python", "answer", "tool_call", "{", "}", '"', " ", "x", "name",
                                  ":", "&lt;"]), max_size=30).map("".join))
def test_no_final_answer_text_becomes_a_tool_call(content):
    """Whatever a plain reply says, the env reads it as the answer: markup of the env's format in it is made inert,
    in the tag and the Hermes format alike."""
    for parser in (TagParser(), HermesParser()):
        fmt = ToolFormat(ToolFormat.of_env(CalcEnv()).tools, parser)
        parsed = parser.parse(fmt.action({"role": "assistant", "content": content}), {"python": fmt.tools[0]})
        assert parsed.error is None and not parsed.calls and parsed.answer is not None


def test_a_reply_in_the_envs_own_answer_form_goes_as_written():
    fmt = ToolFormat.of_env(CalcEnv())
    assert fmt.action({"content": "It is <answer>5</answer>"}) == "It is <answer>5</answer>"
    assert fmt.action({"content": " 5 "}) == "<answer>5</answer>"
    assert fmt.action({"content": "run <python>1</python>"}) == "<answer>run &lt;python>1&lt;/python></answer>"
    assert fmt.action({"content": "-685<|im_end|>"}) == "<answer>-685</answer>"  # a parser that kept special tokens
