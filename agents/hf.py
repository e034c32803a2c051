"""transformers backend: an explicit batched sampling loop over a causal LM with a `DynamicCache`.

A hand-written loop (instead of `model.generate`) gives exact per-token logprobs by the convention in
`policy.py`, per-row seeded sampling (a row's result does not depend on its batch), and prefix sharing:
identical prompts in one call (n samples, or K branches of one tree node) are prefilled once and the KV cache
is fanned out to their rows with `reorder_cache`; finished rows leave the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trace_gym import threads
from trace_gym.agents.chat import encode, end_of_turn_ids, render_prompt
from trace_gym.agents.padding import attention_mask, pad_rows
from trace_gym.agents.policy import FinishReason, Generation, Request, SamplingParams, row_seed
from trace_gym.errors import ConfigError


@dataclass
class GenerationStats:
    """Work done by the last `generate` call (for benchmarks and logs)."""

    prefill_tokens: int = 0
    """Prompt tokens run through the model (padding excluded)."""
    decode_tokens: int = 0
    """Tokens sampled."""
    rows: int = 0
    unique_prompts: int = 0


class HFPolicy:
    """`Policy` over a transformers causal LM on CPU or GPU.

    `share_prefix=False` prefills every row separately (the reference the cached path is tested against).
    `native_tools=True` has the collector offer the env's tools through the chat template and read the model's
    turn as a server's answer is read (Hermes calls, a plain reply as the final answer: agents/native_tools.py).
    """

    def __init__(self, model, tokenizer, max_batch_size: int = 64, share_prefix: bool = True,
                 native_tools: bool = False):
        if tokenizer.pad_token_id is None:
            raise ConfigError("expected a tokenizer with a pad token, got none; fix: set tokenizer.pad_token "
                              "to a token that is not end-of-turn")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.share_prefix = share_prefix
        self.native_tools = native_tools
        self.stop_ids = end_of_turn_ids(tokenizer) | _config_eos(model)
        self.stats = GenerationStats()

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str | torch.device = "cpu",
                        dtype: torch.dtype | str = "auto", **kwargs: Any) -> HFPolicy:
        """Load any local model directory (tiny model, Qwen3-8B, ...); hub ids work only when online."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        # The ignore: transformers wraps PreTrainedModel.to in functools.wraps(nn.Module.to), whose type keeps
        # the unbound `self` as the first parameter.
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()  # type: ignore[arg-type]
        return cls(model, tokenizer, **kwargs)

    def update_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load new weights from the trainer (a no-op when the trainer updates `self.model` in place)."""
        self.model.load_state_dict(state_dict, strict=False)

    def prompt_ids(self, request: Request) -> list[int]:
        """The ids of ``request``'s prompt: its ``prompt_ids``, else its messages through the chat template."""
        if request.prompt_ids is not None:
            return [int(t) for t in request.prompt_ids]
        return encode(self.tokenizer, render_prompt(self.tokenizer, request.messages or [], request.tools))

    @torch.no_grad()
    def generate(self, requests: Sequence[Request], sampling: SamplingParams) -> list[Generation]:
        """Sample ``sampling.n`` continuations of every request (the ``Policy`` contract), in batches of
        ``max_batch_size`` rows."""
        threads.adapt()  # between batches of work: the load may have changed
        prompts = [self.prompt_ids(r) for r in requests]
        rows = [(i, j) for i in range(len(prompts)) for j in range(sampling.n)]
        self.stats = GenerationStats()
        out: list[Generation] = []
        # Sampling runs in eval mode whatever mode a trainer left the model in: in training mode a model with
        # gradient checkpointing (TRL's default) drops the KV cache, and each decoded token would see only itself.
        training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(rows), self.max_batch_size):
                chunk = rows[start:start + self.max_batch_size]
                seeds = [row_seed(requests[i], sampling, i, j) for i, j in chunk]
                out.extend(self._generate_rows([prompts[i] for i, _ in chunk], chunk, seeds, sampling))
        finally:
            self.model.train(training)
        return out

    def _generate_rows(self, prompts: list[list[int]], keys: list[tuple[int, int]], seeds: list[int | None],
                       sampling: SamplingParams) -> list[Generation]:
        device = self.model.device
        if self.share_prefix:
            unique: dict[tuple[int, ...], int] = {}
            row_src = [unique.setdefault(tuple(p), len(unique)) for p in prompts]
            uniq = [list(p) for p in unique]
        else:
            row_src, uniq = list(range(len(prompts))), prompts
        pad = self.tokenizer.pad_token_id
        # left padding: every row's last prompt token is at column -1
        ids, mask = pad_rows(uniq, pad, left=True).to(device), attention_mask(uniq, left=True).to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        self.stats.prefill_tokens += sum(len(p) for p in uniq)
        self.stats.rows += len(prompts)
        self.stats.unique_prompts += len(uniq)

        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                            use_cache=True, logits_to_keep=1).logits[:, -1, :].float()
        src = torch.tensor(row_src, device=device)
        if len(uniq) != len(prompts) or row_src != list(range(len(prompts))):
            # Fan the shared prefix out to its rows: (U, ...) -> (R, ...). The ignore: transformers annotates the
            # index as torch.LongTensor, a legacy type that no tensor has statically.
            cache.reorder_cache(src)  # type: ignore[arg-type]
        logits, mask = logits[src], mask[src]
        next_pos = positions[src, -1] + 1

        n_rows = len(prompts)
        gens = [torch.Generator(device=device) for _ in range(n_rows)]
        for r, seed in enumerate(seeds):
            gens[r].manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
        tokens: list[list[int]] = [[] for _ in range(n_rows)]
        logps: list[list[float]] = [[] for _ in range(n_rows)]
        finish: list[FinishReason | None] = [None] * n_rows
        stop_pos: list[int | None] = [None] * n_rows
        active = list(range(n_rows))  # row ids still generating, in batch order
        stop_ids = torch.tensor(sorted(self.stop_ids), device=device)
        max_stop = max((len(s) for s in sampling.stop), default=0)

        for step in range(sampling.max_new_tokens):
            chosen, logp = self._sample(logits, [gens[r] for r in active], sampling, stop_ids,
                                        suppress_stop=step < sampling.min_new_tokens)
            keep: list[int] = []
            for b, r in enumerate(active):
                tok = int(chosen[b])
                tokens[r].append(tok)
                logps[r].append(float(logp[b]))
                if step >= sampling.min_new_tokens and tok in self.stop_ids:
                    finish[r] = "stop"
                elif max_stop and step >= sampling.min_new_tokens and self._hit_stop(tokens[r], sampling):
                    finish[r], stop_pos[r] = "stop", len(tokens[r])
                elif step + 1 == sampling.max_new_tokens:
                    finish[r] = "length"
                else:
                    keep.append(b)
            if not keep:
                break
            keep_t = torch.tensor(keep, device=device)
            if len(keep) != len(active):
                cache.batch_select_indices(keep_t)
                mask, next_pos, chosen = mask[keep_t], next_pos[keep_t], chosen[keep_t]
            active = [active[b] for b in keep]
            mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
            logits = self.model(input_ids=chosen[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                                past_key_values=cache, use_cache=True).logits[:, -1, :].float()
            next_pos = next_pos + 1
        self.stats.decode_tokens += sum(len(t) for t in tokens)

        out = []
        for r, (i, j) in enumerate(keys):
            text = self.tokenizer.decode(tokens[r], skip_special_tokens=True)
            if stop_pos[r] is not None:
                text = _cut_at_stop(text, sampling)
            out.append(Generation(text=text, token_ids=tokens[r], logprobs=logps[r],
                                  finish_reason=finish[r] or "length", prompt_tokens=len(prompts[r]),
                                  prompt_ids=list(prompts[r]), request_index=i, sample_index=j))
        return out

    def _hit_stop(self, toks: list[int], sampling: SamplingParams) -> bool:
        # Only the tail can contain a new match; a window of (longest stop + 4) tokens covers it since every
        # token decodes to >= 0 chars and matches are checked after each token.
        tail = self.tokenizer.decode(toks[-(max(len(s) for s in sampling.stop) + 4):], skip_special_tokens=True)
        return any(s in tail for s in sampling.stop)

    @staticmethod
    def _sample(logits: torch.Tensor, gens: list[torch.Generator], sampling: SamplingParams,
                stop_ids: torch.Tensor, suppress_stop: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, V) logits -> chosen ids (B,) and their logprobs by the `policy.py` convention."""
        logprobs = torch.log_softmax(logits / sampling.logprob_temperature, dim=-1)
        work = logits.clone()
        if suppress_stop:
            work[:, stop_ids] = float("-inf")
        if sampling.greedy:
            chosen = work.argmax(-1)
        else:
            work = work / sampling.temperature
            if sampling.top_k:
                kth = torch.topk(work, min(sampling.top_k, work.shape[-1]), dim=-1).values[:, -1:]
                work = work.masked_fill(work < kth, float("-inf"))
            if sampling.top_p < 1.0:
                sorted_logits, order = torch.sort(work, descending=True, dim=-1)
                probs = torch.softmax(sorted_logits, dim=-1)
                drop = probs.cumsum(-1) - probs > sampling.top_p  # keep the smallest set with mass >= top_p
                work = work.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
            # Gumbel-max with one generator per row: a row's draw does not depend on the other rows.
            u = torch.stack([torch.rand(work.shape[-1], generator=g, device=work.device) for g in gens])
            gumbel = -torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))
            chosen = (work + gumbel).argmax(-1)
        return chosen, logprobs.gather(-1, chosen[:, None]).squeeze(-1)


def _config_eos(model) -> set[int]:
    ids: set[int] = set()
    for cfg in (getattr(model, "generation_config", None), model.config):
        eos = getattr(cfg, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(int(e) for e in eos)
    return ids


def _cut_at_stop(text: str, sampling: SamplingParams) -> str:
    hits = [(text.find(s), s) for s in sampling.stop if s in text]
    if not hits:
        return text
    pos, s = min(hits)
    return text[:pos + len(s)] if sampling.include_stop_str_in_output else text[:pos]


def sequence_logprobs(model, ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      temperature: float = 1.0) -> torch.Tensor:
    """Logprob of each token given the ones before it: (B, T) ids -> (B, T-1), by the policy.py convention.

    With padding pass `attention_mask`; positions then count real tokens only, as in generation. A right-padded
    mask (every row's ones come first) is dropped: the causal mask alone keeps real tokens from seeing the pads
    after them, and the fused causal attention kernel runs ~1.5x faster on CPU than with an explicit mask.
    """
    positions = None
    if attention_mask is not None and bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all()):
        attention_mask = None
    if attention_mask is not None:
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attention_mask, position_ids=positions,
                   use_cache=False).logits[:, :-1]
    return taken_logprobs(logits, ids[:, 1:], temperature)


def taken_logprobs(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """(..., vocab) logits and (...) ids -> (...) log-probability of each id, by the policy.py convention."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    # gather - logsumexp instead of log_softmax: no second (..., vocab) tensor, which matters at 152k vocab
    return logits.gather(-1, ids[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
