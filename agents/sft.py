"""Supervised fine-tuning on given episodes (message lists or recorded conversations), assistant tokens only.

The episodes come from elsewhere: `trace_gym.training.driver.warm_start` collects scripted-expert episodes through
the rollout collector and evaluates the result.

Deviations from common SFT recipes, and why:
1. Loss is the mean over all assistant tokens of the batch (token-level), the same normalisation as the RL
   loss, so that long episodes are not down-weighted.
2. Training stops on a step count, never on wall time (docs/measured.md: the tiny model learns to copy tool
   output between steps 250 and 400, so time-based stopping gives machine-dependent models).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from trace_gym import threads
from trace_gym.agents.chat import Conversation, tokenize_episode
from trace_gym.agents.hf import sequence_logprobs
from trace_gym.agents.padding import attention_mask, pad_rows
from trace_gym.errors import ConfigError
from trace_gym.progress import Progress


@dataclass(frozen=True)
class SFTSettings:
    """Supervised fine-tuning settings; defaults suit the tiny model on Arithmetic (docs/measured.md)."""

    steps: int = 400
    """Optimizer steps."""
    batch_size: int = 32
    """Episodes per step."""
    lr: float = 2e-3
    """Peak AdamW learning rate (linear warmup, constant, cosine decay to 10% at the end)."""
    warmup_steps: int = 20
    """Linear warmup length."""
    decay_fraction: float = 0.2
    """Share of the steps, at the end, over which the learning rate decays (cosine) to 10%."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Max gradient norm."""
    max_length: int = 2048
    """Episodes longer than this many tokens are dropped."""
    seed: int = 0
    """Seed of batch sampling."""
    log_every: int = 10
    """Steps between loss log lines."""

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ConfigError(f"expected steps >= 1 and batch_size >= 1, got {self.steps}, {self.batch_size}")
        if self.lr <= 0:
            raise ConfigError(f"expected lr > 0, got {self.lr}")
        if not 0.0 <= self.decay_fraction <= 1.0:
            raise ConfigError(f"expected decay_fraction in [0, 1], got {self.decay_fraction}")


@dataclass
class SFTResult:
    losses: list[float]
    """Mean assistant-token loss per step."""
    out_dir: Path
    sequences: int
    """Training sequences used (after length filtering)."""
    log: list[dict[str, Any]] = field(default_factory=list)


def to_sequences(tokenizer, episodes: Sequence[Sequence[Mapping[str, Any]] | Conversation],
                 max_length: int) -> list[tuple[list[int], list[bool]]]:
    """Episodes (message lists or recorded conversations) -> (ids, trainable mask) pairs."""
    out = []
    for ep in episodes:
        conv = ep if isinstance(ep, Conversation) else tokenize_episode(tokenizer, ep)
        if len(conv.ids) <= max_length:
            out.append((conv.ids, conv.action_mask()))
    return out


def masked_lm_loss(model, ids: torch.Tensor, mask: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss over positions whose target is trainable. (B, T) padded tensors."""
    weight = mask[:, 1:].float()
    nll = -sequence_logprobs(model, ids, attention)
    return (nll * weight).sum() / weight.sum().clamp(min=1.0)


def _batch(seqs: list[tuple[list[int], list[bool]]], pad: int) -> tuple[torch.Tensor, ...]:
    ids = pad_rows([s for s, _ in seqs], pad)  # right padding: positions start at 0 for every row
    mask = pad_rows([m for _, m in seqs], False, torch.bool, width=ids.shape[1])
    return ids, mask, attention_mask([s for s, _ in seqs])


def sft(model_dir: str | Path, episodes: Sequence[Sequence[Mapping[str, Any]] | Conversation],
        out_dir: str | Path | None = None, config: SFTSettings | None = None, progress: bool = True,
        on_step: Callable[[int, float, Any], None] | None = None) -> SFTResult:
    """Fine-tune the model in `model_dir` on `episodes`, training only assistant tokens; save to `out_dir`
    (default: `model_dir`, in place) with a `sft_log.jsonl` of the losses. `on_step(step, loss, model)` runs
    after each optimiser step with the model in training mode (a callback that evaluates it switches back)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = config or SFTSettings()
    out = Path(out_dir or model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    seqs = to_sequences(tokenizer, episodes, config.max_length)
    if not seqs:
        raise ConfigError(f"expected episodes of at most {config.max_length} tokens, got none; "
                          "fix: raise max_length or collect shorter episodes")
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, config))
    gen = torch.Generator().manual_seed(config.seed)
    model.train()
    losses: list[float] = []
    log: list[dict[str, Any]] = []
    with Progress("sft", total=config.steps, unit="step", enabled=progress) as bar:
        for step in range(config.steps):
            threads.adapt()
            idx = torch.randint(len(seqs), (config.batch_size,), generator=gen).tolist()
            ids, mask, att = _batch([seqs[i] for i in idx], tokenizer.pad_token_id)
            loss = masked_lm_loss(model, ids, mask, att)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            if on_step is not None:
                on_step(step, losses[-1], model)
            if step % config.log_every == 0 or step == config.steps - 1:
                log.append({"step": step, "loss": losses[-1], "lr": sched.get_last_lr()[0]})
            bar.update(advance=1, loss=losses[-1])
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    with open(out / "sft_log.jsonl", "w") as f:
        f.write(json.dumps({"config": asdict(config), "sequences": len(seqs)}) + "\n")
        f.writelines(json.dumps(row) + "\n" for row in log)
    return SFTResult(losses, out, len(seqs), log)


def _lr_factor(step: int, config: SFTSettings) -> float:
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    # Constant, then a cosine over the last `decay_fraction` of the steps: the tiny model learns to copy tool
    # output late (docs/measured.md: steps 250-400), and a decay over the whole run slowed that jump.
    decay_start = config.steps * (1 - config.decay_fraction)
    frac = (step - decay_start) / max(1.0, config.steps - decay_start)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(max(frac, 0.0), 1.0)))
