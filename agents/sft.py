"""Supervised fine-tuning on given episodes (message lists or recorded conversations), assistant tokens only.

The episodes come from elsewhere: `trace_gym.training.driver.warm_start` collects scripted-expert episodes through
the rollout collector and evaluates the result.

Deviations from common SFT recipes, and why:
1. Loss is the mean over all assistant tokens of the batch (token-level), the same normalisation as the RL
   loss, so that long episodes are not down-weighted.
2. Training stops on a step count, never on wall time (docs/measured.md: the tiny model learns to copy tool
   output between steps 250 and 400, so time-based stopping gives machine-dependent models).
3. Logits are computed only at the positions whose next token is trained, a chunk at a time, and recomputed in the
   backward pass (`masked_lm_loss`): the whole vocabulary at every position of a batch is most of the memory of
   a small-vocabulary-heavy model (fp32, 49k vocabulary: 1.6 GB per 8k tokens, before its gradient).
4. The learning rate and batch size left unset follow the model's size (`SFTSettings.resolved`): the tiny model
   wants 2e-3 over 32 episodes, a pretrained 100M+ model forgets what it knew at that rate.
5. A small model trains in one process per usable core (at most 4), one thread each, summing gradients once a step
   (`agents.data_parallel`): its operators are too small to split over threads without waiting at each, which
   beside other work costs more than half the rate. A large model keeps one process and torch's threads (its
   operators are large, and a copy per process would double its memory).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from trace_gym import threads
from trace_gym.agents import data_parallel
from trace_gym.agents.chat import Conversation, tokenize_episode
from trace_gym.agents.hf import sequence_logprobs, taken_logprobs
from trace_gym.agents.padding import attention_mask, pad_rows
from trace_gym.errors import ConfigError
from trace_gym.progress import Progress


@dataclass(frozen=True)
class SFTSettings:
    """Supervised fine-tuning settings; defaults suit the tiny model on Arithmetic (docs/measured.md)."""

    steps: int = 400
    """Optimizer steps."""
    batch_size: int | None = None
    """Episodes per step; None: by model size (32 below `SMALL` parameters, else 8)."""
    lr: float | None = None
    """Peak AdamW learning rate (linear warmup, constant, cosine decay to 10% at the end); None: by model size
    (2e-3 below `SMALL` parameters; above, 5e-5 for all weights and 5e-4 with LoRA)."""
    processes: int | None = None
    """Processes that split each batch, one thread each (`agents.data_parallel`, note 5); None: the usable cores, at
    most `MAX_PROCESSES`, for a model below `SMALL` parameters; 1 above it or when the user set a thread count
    (``OMP_NUM_THREADS``)."""
    lora_r: int = 0
    """LoRA rank on the attention and MLP projections (0: all weights), as `model.lora_r` in RL; the saved model
    has the adapter merged into its weights."""
    lora_alpha: int = 32
    """LoRA scale numerator (the adapter is scaled by lora_alpha / lora_r)."""
    logits_chunk: int = 1024
    """Trained positions whose logits are computed at once (note 3); 0: the whole vocabulary at every position."""
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
        if self.steps < 1 or (self.batch_size is not None and self.batch_size < 1):
            raise ConfigError(f"expected steps >= 1 and batch_size >= 1, got {self.steps}, {self.batch_size}")
        if self.processes is not None and self.processes < 1:
            raise ConfigError(f"expected processes >= 1, got {self.processes}; fix: processes=1 (or leave it unset)")
        if self.lr is not None and self.lr <= 0:
            raise ConfigError(f"expected lr > 0, got {self.lr}")
        if self.lora_r < 0 or self.lora_alpha <= 0 or self.logits_chunk < 0:
            raise ConfigError(f"expected lora_r >= 0, lora_alpha > 0 and logits_chunk >= 0, got {self.lora_r}, "
                              f"{self.lora_alpha}, {self.logits_chunk}; fix: lora_r=0 (or 16), lora_alpha=32")
        if not 0.0 <= self.decay_fraction <= 1.0:
            raise ConfigError(f"expected decay_fraction in [0, 1], got {self.decay_fraction}")


    def resolved(self, parameters: int) -> SFTSettings:
        """These settings with an unset lr, batch size and process count chosen for a model of ``parameters``
        weights (notes 4 and 5); at most one process per sequence of a batch."""
        small = parameters < SMALL
        lr = self.lr if self.lr is not None else 2e-3 if small else 5e-4 if self.lora_r else 5e-5
        batch = self.batch_size if self.batch_size is not None else 32 if small else 8
        processes = (self.processes if self.processes is not None else
                     min(threads.usable_cores(), MAX_PROCESSES) if small and threads.requested() is None else 1)
        return replace(self, lr=lr, batch_size=batch, processes=min(processes, batch))


# The projections a LoRA adapter wraps, as in RL (training/update/models.py)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SMALL = 20_000_000
"""Parameters below which a model counts as small for the default SFT settings (the tiny model has 0.8M)."""
MAX_PROCESSES = 4
"""Most processes a small model's SFT uses by default: each holds an interpreter with torch and transformers
(about 0.8 GB), and the gain over threads was measured on 2 cores only."""


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


def masked_lm_loss(model, ids: torch.Tensor, mask: torch.Tensor, attention: torch.Tensor,
                   chunk: int = 0) -> torch.Tensor:
    """Mean next-token loss over positions whose target is trainable. (B, T) padded tensors. ``chunk`` > 0 computes
    logits at the trained positions only, ``chunk`` of them at a time, recomputed in the backward pass (note 3);
    0 (and a model whose logits are more than its head applied to the last hidden state) the whole vocabulary."""
    head_model = _causal_lm(model)
    if chunk <= 0 or head_model is None:
        weight = mask[:, 1:].float()
        nll = -sequence_logprobs(model, ids, attention)
        return (nll * weight).sum() / weight.sum().clamp(min=1.0)
    positions = None
    if not bool((attention[:, 1:] <= attention[:, :-1]).all()):  # right padding needs no mask (sequence_logprobs)
        positions = (attention.long().cumsum(-1) - 1).clamp(min=0)
    hidden = head_model.get_decoder()(input_ids=ids, attention_mask=attention if positions is not None else None,
                                      position_ids=positions, use_cache=False).last_hidden_state  # (B, T, H)
    chosen = mask[:, 1:].bool()
    states, targets = hidden[:, :-1][chosen], ids[:, 1:][chosen]  # (N, H), (N,)
    head = head_model.get_output_embeddings()
    total = states.sum() * 0.0  # in the graph even without trained targets (a rank's rows may have none)
    for start in range(0, len(targets), chunk):
        total = total + checkpoint(_chunk_nll, head, states[start:start + chunk], targets[start:start + chunk],
                                   use_reentrant=False)
    return total / max(len(targets), 1)


def _chunk_nll(head: torch.nn.Module, states: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed negative log-likelihood of ``targets`` (N,) under ``head(states)`` (N, H) -> (N, vocab)."""
    return -taken_logprobs(head(states), targets).sum()


def _causal_lm(model) -> Any:
    """The transformers causal LM inside ``model`` (a peft wrapper's base model), when its logits are its output
    embeddings applied to its decoder's last hidden state; None for one that scales or caps them."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if (not callable(getattr(base, "get_decoder", None)) or base.get_output_embeddings() is None
            or getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None)
            or getattr(config, "logits_scaling", None)):
        return None
    return base


def _batch(seqs: list[tuple[list[int], list[bool]]], pad: int) -> tuple[torch.Tensor, ...]:
    ids = pad_rows([s for s, _ in seqs], pad)  # right padding: positions start at 0 for every row
    mask = pad_rows([m for _, m in seqs], False, torch.bool, width=ids.shape[1])
    return ids, mask, attention_mask([s for s, _ in seqs])


def sft(model_dir: str | Path, episodes: Sequence[Sequence[Mapping[str, Any]] | Conversation],
        out_dir: str | Path | None = None, config: SFTSettings | None = None, progress: bool = True,
        on_step: Callable[[int, float, Any], None] | None = None) -> SFTResult:
    """Fine-tune the model in `model_dir` on `episodes`, training only assistant tokens; save to `out_dir`
    (default: `model_dir`, in place) with a `sft_log.jsonl` of the losses. `on_step(step, loss, model)` runs
    after each optimiser step with the model in training mode (a callback that evaluates it switches back); with
    several processes it runs in this one, rank 0, on one torch thread, while the others wait."""
    out = Path(out_dir or model_dir)
    tokenizer = _tokenizer(model_dir)
    model, config = _load(model_dir, config or SFTSettings())
    assert config.processes is not None
    seqs = to_sequences(tokenizer, episodes, config.max_length)
    if not seqs:
        raise ConfigError(f"expected episodes of at most {config.max_length} tokens, got none; "
                          "fix: raise max_length or collect shorter episodes")
    with Progress("sft", total=config.steps, unit="step", enabled=progress) as bar:
        if config.processes == 1:
            losses, log = _steps(model, seqs, config, tokenizer.pad_token_id, on_step=on_step, bar=bar)
        else:
            losses, log = _steps_with_team(model, str(model_dir), seqs, config, tokenizer.pad_token_id, on_step,
                                           bar)
    model.eval()
    if config.lora_r:
        model = model.merge_and_unload()  # a plain model folder: RL, eval and engines load it as any other
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    with open(out / "sft_log.jsonl", "w") as f:
        f.write(json.dumps({"config": asdict(config), "sequences": len(seqs)}) + "\n")
        f.writelines(json.dumps(row) + "\n" for row in log)
    return SFTResult(losses, out, len(seqs), log)


def _tokenizer(model_dir: str | Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def _load(model_dir: str | Path, config: SFTSettings) -> tuple[Any, SFTSettings]:
    """The model to train (under a LoRA adapter when ``lora_r``) and the settings resolved for its size."""
    from transformers import AutoModelForCausalLM

    # Any: the Hugging Face model, or peft's wrapper of it under LoRA (whose merge_and_unload gives it back)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = config.resolved(sum(p.numel() for p in model.parameters()))
    if config.lora_r:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, bias="none",
                                                 target_modules=list(LORA_TARGETS)))
    return model, config


def _steps_with_team(model: Any, model_dir: str, seqs: list[tuple[list[int], list[bool]]], config: SFTSettings,
                     pad: int, on_step: Callable[[int, float, Any], None] | None,
                     bar: Progress) -> tuple[list[float], list[dict[str, Any]]]:
    """`_steps` as rank 0 of ``config.processes`` (`agents.data_parallel`), each on one thread."""
    assert config.processes is not None
    trained = [p for p in model.parameters() if p.requires_grad]
    before = torch.get_num_threads()
    with data_parallel.Team(config.processes, trained) as team:
        team.start(_rank, model_dir, seqs, config, pad)
        torch.set_num_threads(1)
        try:
            result = _steps(model, seqs, config, pad, team.shared, 0, on_step, bar)
            team.finish(trained)
        finally:
            torch.set_num_threads(before)
    return result


def _rank(rank: int, shared: data_parallel.Shared, model_dir: str, seqs: list[tuple[list[int], list[bool]]],
          config: SFTSettings, pad: int) -> None:
    """A spawned rank: the same model from rank 0's weights, the same steps on its rows of each batch."""
    torch.manual_seed(config.seed + rank)  # its own dropout draws, the same on every run
    model, _ = _load(model_dir, config)
    trained = [p for p in model.parameters() if p.requires_grad]
    data_parallel.begin(shared, trained)
    _steps(model, seqs, config, pad, shared, rank)
    data_parallel.end(shared, rank, trained)


def _steps(model: Any, seqs: list[tuple[list[int], list[bool]]], config: SFTSettings, pad: int,
           shared: data_parallel.Shared | None = None, rank: int = 0,
           on_step: Callable[[int, float, Any], None] | None = None,
           bar: Progress | None = None) -> tuple[list[float], list[dict[str, Any]]]:
    """The optimiser steps: each samples ``batch_size`` sequences (the same ones on every rank), and a rank of
    ``shared``'s team trains on every world-th of them, its loss weighted by its share of the batch's trained
    tokens, so that the summed gradient is the one-process gradient (note 1). Returns the losses and log rows."""
    assert config.lr is not None and config.batch_size is not None
    world = shared.world if shared is not None else 1
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=config.lr, weight_decay=config.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, config))
    gen = torch.Generator().manual_seed(config.seed)
    targets = [sum(mask[1:]) for _, mask in seqs]  # trained tokens per sequence: a rank's share of a batch's
    model.train()
    losses: list[float] = []
    log: list[dict[str, Any]] = []
    for step in range(config.steps):
        if shared is None:
            threads.adapt()
        idx = torch.randint(len(seqs), (config.batch_size,), generator=gen).tolist()
        ids, mask, att = _batch([seqs[i] for i in idx[rank::world]], pad)
        loss = masked_lm_loss(model, ids, mask, att, config.logits_chunk)
        if shared is not None:
            loss = loss * (int(mask[:, 1:].sum()) / max(1, sum(targets[i] for i in idx)))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        value = float(loss.detach())
        if shared is not None:
            value = data_parallel.sum_gradients(shared, rank, step, trained, value)
        torch.nn.utils.clip_grad_norm_(trained, config.grad_clip)
        opt.step()
        sched.step()
        losses.append(value)
        if on_step is not None:
            on_step(step, value, model)
        if step % config.log_every == 0 or step == config.steps - 1:
            log.append({"step": step, "loss": value, "lr": sched.get_last_lr()[0]})
        if bar is not None:
            bar.update(advance=1, loss=value)
    return losses, log


def _lr_factor(step: int, config: SFTSettings) -> float:
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    # Constant, then a cosine over the last `decay_fraction` of the steps: the tiny model learns to copy tool
    # output late (docs/measured.md: steps 250-400), and a decay over the whole run slowed that jump.
    decay_start = config.steps * (1 - config.decay_fraction)
    frac = (step - decay_start) / max(1.0, config.steps - decay_start)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(max(frac, 0.0), 1.0)))
