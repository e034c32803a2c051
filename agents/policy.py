"""The `Policy` protocol and the plain data it exchanges: requests, sampling parameters, generations.

Logprob convention (every backend follows it, the trainer must match it): `Generation.logprobs[i]` is
`log_softmax(logits / T)[token_ids[i]]` where `logits` is the model's unmodified output at that position and
`T` is the sampling temperature (`T = 1` for greedy decoding). Top-k, top-p and `min_new_tokens` shape which
token is drawn but not the recorded logprob, so a trainer that divides its own logits by the same `T`
reproduces the behaviour logprobs from a plain forward pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from trace_gym.errors import ConfigError
from trace_gym.seeds import derive

FinishReason = Literal["stop", "length", "error"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample; one object per `generate` call."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax)."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]; 1 disables it."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 disables it."""
    max_new_tokens: int = 256
    """Upper bound on sampled tokens per generation (finish_reason "length" when reached)."""
    min_new_tokens: int = 0
    """End-of-sequence and stop strings are suppressed before this many tokens (a testing aid)."""
    stop: tuple[str, ...] = ()
    """Strings that end the turn when they appear in the sampled text (besides the end-of-turn token)."""
    include_stop_str_in_output: bool = True
    """Keep the matched stop string in `Generation.text` (the env then sees e.g. the closing tag)."""
    n: int = 1
    """Samples per request; they share the request's prefix computation."""
    seed: int | None = None
    """Seed for reproducible sampling; each (request, sample) pair gets its own derived stream."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"expected temperature >= 0, got {self.temperature}; fix: use 0 for greedy")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"expected 0 < top_p <= 1, got {self.top_p}; fix: use 1.0 to disable")
        if self.top_k < 0:
            raise ConfigError(f"expected top_k >= 0, got {self.top_k}; fix: use 0 to disable")
        if self.max_new_tokens < 1 or self.min_new_tokens < 0 or self.min_new_tokens > self.max_new_tokens:
            raise ConfigError(
                f"expected 0 <= min_new_tokens <= max_new_tokens >= 1, got {self.min_new_tokens}, "
                f"{self.max_new_tokens}; fix: raise max_new_tokens"
            )
        if self.n < 1:
            raise ConfigError(f"expected n >= 1, got {self.n}")
        if isinstance(self.stop, str):
            raise ConfigError("expected stop to be a tuple of strings, got a str; fix: stop=(s,)")
        if any(not s for s in self.stop):
            raise ConfigError("expected non-empty stop strings, got an empty one")

    @property
    def greedy(self) -> bool:
        """Whether sampling is greedy (temperature 0)."""
        return self.temperature == 0

    @property
    def logprob_temperature(self) -> float:
        """The T in the logprob convention (module docstring)."""
        return 1.0 if self.greedy else self.temperature


@dataclass(frozen=True)
class Request:
    """What to continue: chat messages (+ tool schemas) rendered with the chat template, or raw prompt ids.

    Give exactly one of `messages` and `prompt_ids`. Token-id prompts are how multi-turn rollouts keep the
    exact sampled ids (see `chat.Conversation`).
    """

    messages: Sequence[Mapping[str, Any]] | None = None
    tools: Sequence[Mapping[str, Any]] | None = None
    prompt_ids: Sequence[int] | None = None
    task: Any = None
    """The env's `Task`, for policies that read it (scripted experts); model backends ignore it."""
    seed: int | None = None
    """Overrides `SamplingParams.seed` for this request (its samples then do not depend on its index)."""

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt_ids is None):
            raise ConfigError(
                "expected exactly one of messages and prompt_ids, got "
                f"{'both' if self.messages is not None else 'neither'}; fix: pass one"
            )
        if self.prompt_ids is not None and len(self.prompt_ids) == 0:
            raise ConfigError("expected a non-empty prompt_ids, got []")


@dataclass
class Generation:
    """One sampled continuation."""

    text: str
    """Decoded sampled tokens without special tokens (and the stop string unless kept by the params)."""
    token_ids: list[int]
    """Every sampled id, including a final end-of-turn token; exactly what training should see."""
    logprobs: list[float]
    """One per token id, by the convention in the module docstring; empty when the policy cannot score
    its text (scripted experts)."""
    finish_reason: FinishReason
    """"stop" (end-of-turn token or stop string), "length" (max_new_tokens) or "error" (no generation: see
    ``error``)."""
    prompt_tokens: int
    """Length of the prompt the tokens continue."""
    prompt_ids: list[int] = field(default_factory=list)
    """The prompt ids themselves (empty when a backend cannot report them, e.g. some HTTP servers)."""
    request_index: int = 0
    """Index of the request in the `generate` call."""
    sample_index: int = 0
    """Index among the request's `n` samples."""
    error: str | None = None
    """Why this row has no generation: a server request that failed after its retries (the HTTP backend). The
    caller ends that episode with the error on record (reward 0) and goes on with the others."""


@runtime_checkable
class Policy(Protocol):
    """A batched text generator.

    Contract: `generate` returns `len(requests) * sampling.n` generations ordered request-major (all samples
    of request 0, then request 1, ...), each with `request_index`/`sample_index` set. It never raises on model
    output, nor for one row whose request failed (that row carries `Generation.error`); a setup failure (a server
    never reached, a wrong model name or key) raises. With a seed, the result for a (request, sample) pair does
    not depend on the batch it came in.
    """

    def generate(self, requests: Sequence[Request], sampling: SamplingParams) -> list[Generation]:
        """``len(requests) * sampling.n`` generations, request-major (the contract above)."""


def row_seed(request: Request, sampling: SamplingParams, request_index: int, sample_index: int) -> int | None:
    """The seed a backend uses for one (request, sample) row."""
    if request.seed is not None:
        return derive(request.seed, 0, sample_index)
    return None if sampling.seed is None else derive(sampling.seed, request_index, sample_index)

