"""Scripted experts (`trace_gym.experts.Expert`, written per env) exposed through the `Policy` protocol."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from trace_gym.agents.chat import encode
from trace_gym.agents.policy import Generation, Request, SamplingParams, row_seed
from trace_gym.errors import ConfigError
from trace_gym.experts import Expert


class ExpertPolicy:
    """A `Policy` whose turns come from `expert.act(request.task, request.messages)`.

    Requests must carry `messages` and `task`. With a tokenizer the text is also encoded (plus the end-of-turn
    token) so that expert turns can be recorded like sampled ones; logprobs stay empty (an expert does not
    score its text). Sampling parameters other than `n` do not apply: the expert's own seeded noise decides.

    Pass an expert factory (`seed -> Expert`) instead of an expert to make every turn depend on its request
    alone, as the Policy contract asks: each sample then comes from a fresh expert seeded with the row's seed
    (`row_seed`, as every backend samples), whatever the batching or the worker. One shared expert draws from one
    generator, so its noise depends on the order requests arrive in.
    """

    def __init__(self, expert: Expert | Callable[[int], Expert], tokenizer=None):
        self.expert = expert
        self.tokenizer = tokenizer

    def generate(self, requests: Sequence[Request], sampling: SamplingParams) -> list[Generation]:
        """The expert's next turn for every request (``sampling.n`` each); requests carry ``messages`` and ``task``."""
        out = []
        for i, req in enumerate(requests):
            if req.messages is None or req.task is None:
                raise ConfigError("expected a Request with messages and task for a scripted expert, got "
                                  f"messages={'set' if req.messages is not None else None}, task={req.task}; "
                                  "fix: Request(messages=info['messages'], task=env.task)")
            for j in range(sampling.n):
                seed = row_seed(req, sampling, i, j) or 0
                expert = self.expert if isinstance(self.expert, Expert) else self.expert(seed)
                text = expert.act(req.task, list(req.messages))
                ids: list[int] = []
                if self.tokenizer is not None:
                    ids = [*encode(self.tokenizer, text), self.tokenizer.eos_token_id]
                out.append(Generation(text=text, token_ids=ids, logprobs=[], finish_reason="stop",
                                      prompt_tokens=0, request_index=i, sample_index=j))
        return out
