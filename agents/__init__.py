"""Policies: the `Policy` protocol, chat formatting with exact token records, and the backends.

    from trace_gym.agents import Request, SamplingParams
    from trace_gym.agents.hf import HFPolicy                 # transformers, CPU or GPU
    policy = HFPolicy.from_pretrained("/models/Qwen3-8B", device="cuda", dtype="bfloat16")
    # or: from trace_gym.agents.vllm import VLLMPolicy;    VLLMPolicy.from_pretrained("/models/Qwen3-8B")
    # or: from trace_gym.agents.openai_backend import OpenAIPolicy
    #     OpenAIPolicy("http://127.0.0.1:8000/v1", "Qwen3-8B", tokenizer=AutoTokenizer.from_pretrained(...))
    gens = policy.generate([Request(messages=info["messages"])], SamplingParams(temperature=0.7, n=4))

Backends import torch/vllm lazily through their own modules; this package imports neither.
"""

from trace_gym.agents.chat import Conversation, Segment, tokenize_episode
from trace_gym.agents.policy import Generation, Policy, Request, SamplingParams

__all__ = ["Conversation", "Generation", "Policy", "Request", "SamplingParams", "Segment", "tokenize_episode"]
