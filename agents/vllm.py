"""vLLM backend: the offline `LLM` engine with automatic prefix caching, and weight updates from the trainer.

Deviations from a plain `LLM.generate` wrapper, and why:
1. Every (request, sample) pair is its own engine request with its own seed (`policy.row_seed`), so results
   do not depend on batch composition; identical prompts still share their KV blocks through prefix caching.
2. `logprobs_mode="processed_logprobs"`: the logprob after temperature, which is the `policy.py` convention
   exactly when top_k=0 and top_p=1 (the RL default). With top-k/top-p on, vLLM reports the logprob under the
   truncated, renormalised distribution instead.
3. Weights travel to the engine's workers through a worker extension (`WeightSync`) as raw bytes (the RPC
   layer cannot pickle tensor buffers), one host copy: fine on one node, not a multi-node path. The prefix
   cache is reset after each update because its blocks hold the old weights' keys.

Create engines under `if __name__ == "__main__":` in scripts: the engine core starts with spawn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_gym.agents.chat import encode, end_of_turn_ids, render_prompt
from trace_gym.agents.policy import Generation, Request, SamplingParams, row_seed


class WeightSync:
    """vLLM worker extension (mixed into each worker): load named tensors into the served model."""

    def trace_gym_load_weights(self, packed: list[tuple[str, str, list[int], bytes]]) -> int:
        import torch

        weights = [(name, torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(getattr(torch, dtype))
                    .reshape(shape)) for name, dtype, shape, raw in packed]
        runner = self.model_runner  # type: ignore[attr-defined]
        if hasattr(runner, "reload_weights"):
            # In-place reload: re-runs the post-load processing that CPU/quantized kernels apply to weights
            # (a plain model.load_weights fails on such processed parameters).
            from vllm.config import set_current_vllm_config

            with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
                runner.reload_weights(weights_iterator=iter(weights))
        else:
            runner.model.load_weights(weights=weights)
        return len(weights)


@dataclass
class PrefixCacheStats:
    queries: int = 0
    """Prompt tokens looked up in the prefix cache."""
    hits: int = 0
    """Of which found cached."""

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class VLLMPolicy:
    """`Policy` over a `vllm.LLM` engine; `from_pretrained` builds one for a local model folder. ``native_tools``:
    the collector offers the env's tools through the chat template and reads Hermes calls and plain replies as a
    server's answer is read, as for `HFPolicy` (agents/native_tools.py)."""

    def __init__(self, llm, tokenizer=None, native_tools: bool = False):
        self.llm = llm
        self.native_tools = native_tools
        self.tokenizer = tokenizer if tokenizer is not None else llm.get_tokenizer()
        self.stop_ids = sorted(end_of_turn_ids(self.tokenizer))
        self.last_prefix_cache = PrefixCacheStats()

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: str = "auto", max_model_len: int = 4096,
                        gpu_memory_utilization: float = 0.5, enforce_eager: bool = False, seed: int = 0,
                        **kwargs: Any) -> VLLMPolicy:
        """Start a vLLM engine on the model folder ``path`` with prefix caching and the weight-sync extension."""
        from vllm import LLM

        llm = LLM(model=str(path), dtype=dtype, max_model_len=max_model_len, enable_prefix_caching=True,
                  gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager, seed=seed,
                  logprobs_mode="processed_logprobs", disable_log_stats=False,
                  worker_extension_cls=f"{WeightSync.__module__}.{WeightSync.__qualname__}", **kwargs)
        return cls(llm)

    def prompt_ids(self, request: Request) -> list[int]:
        """The ids of ``request``'s prompt: its ``prompt_ids``, else its messages through the chat template."""
        if request.prompt_ids is not None:
            return [int(t) for t in request.prompt_ids]
        return encode(self.tokenizer, render_prompt(self.tokenizer, request.messages or [], request.tools))

    def generate(self, requests: Sequence[Request], sampling: SamplingParams) -> list[Generation]:
        """Sample ``sampling.n`` continuations of every request (the ``Policy`` contract), one seeded engine request
        each."""
        from vllm import SamplingParams as VSampling
        from vllm.inputs import TokensPrompt

        prompts = [self.prompt_ids(r) for r in requests]
        keys = [(i, j) for i in range(len(requests)) for j in range(sampling.n)]
        params = []
        for i, j in keys:
            seed = row_seed(requests[i], sampling, i, j)
            params.append(VSampling(
                n=1, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or -1,
                max_tokens=sampling.max_new_tokens, min_tokens=sampling.min_new_tokens, stop=list(sampling.stop),
                stop_token_ids=self.stop_ids, include_stop_str_in_output=sampling.include_stop_str_in_output,
                seed=None if seed is None else seed % (2**63), logprobs=0, skip_special_tokens=True))
        before = self.prefix_cache_stats()
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=prompts[i]) for i, _ in keys], params,
                                 use_tqdm=False)
        after = self.prefix_cache_stats()
        self.last_prefix_cache = PrefixCacheStats(after.queries - before.queries, after.hits - before.hits)
        gens = []
        for (i, j), out in zip(keys, outs):
            c = out.outputs[0]
            ids = list(c.token_ids)
            logps = [float(step[t].logprob) for t, step in zip(ids, c.logprobs or [])]
            gens.append(Generation(text=c.text, token_ids=ids, logprobs=logps,
                                   finish_reason="length" if c.finish_reason == "length" else "stop",
                                   prompt_tokens=len(prompts[i]), prompt_ids=prompts[i], request_index=i,
                                   sample_index=j))
        return gens

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Load new weights (HF parameter names, as `model.state_dict()` gives them) into every worker."""
        import torch

        packed = []
        for name, value in state_dict.items():
            t = value.detach().to("cpu").contiguous()
            packed.append((name, str(t.dtype).removeprefix("torch."), list(t.shape),
                           t.view(-1).view(torch.uint8).numpy().tobytes()))
        self.llm.collective_rpc("trace_gym_load_weights", args=(packed,))
        self.llm.reset_prefix_cache()

    def prefix_cache_stats(self) -> PrefixCacheStats:
        """Cumulative prefix-cache queries and hits (tokens) since the engine started; zeros for an engine built
        without stat logging (another trainer's, such as TRL's colocated one)."""
        stats = PrefixCacheStats()
        if not getattr(getattr(self.llm, "llm_engine", None), "log_stats", True):
            return stats
        for metric in self.llm.get_metrics():
            if metric.name == "vllm:prefix_cache_queries":
                stats.queries += int(metric.value)
            elif metric.name == "vllm:prefix_cache_hits":
                stats.hits += int(metric.value)
        return stats
