"""The learner: the trained model, its optimiser and the policy update, in one process or data-parallel.

`model.strategy` picks how the update runs: ``single`` (one process), ``ddp`` or ``fsdp`` (FSDP2) over the
ranks of a ``torch.distributed`` process group, started by ``torchrun`` or `training.driver.launch.ray_train`;
``model.lora_r > 0`` trains a LoRA adapter instead of all weights (`models.py`). The optimizer step itself is
`optimizer_step.policy_update`; this module turns a step's trained nodes into its batches: packed token tries
(``optim.update=packed``, packing.py: every shared prefix computed once) or one padded row per node.

Rank 0 (the lead) runs everything else of the step: environments, rollouts, predictor, evaluation, logs.
The other ranks only follow: `Learner.follow` receives each command the lead issues (update, weights, save,
stop) and takes part in its collectives, so the ranks never disagree about what comes next.

Choices:
1. Every optimiser step's packs (or rows) are split round-robin over the ranks; packs are cut small enough that
   each rank gets one where the rows allow. A rank left without one runs a pack (row) with its mask zeroed,
   so all ranks issue the same collectives.
2. The generation backend shares the trained module only for ``single`` without LoRA (the quickstart: no
   copy, no sync). Otherwise it holds its own copy (hf) or engine (vllm) and receives the gathered full
   weights, LoRA merged, after every update.
3. Checkpoints hold the full (merged) weights as a plain model folder. Resume is exact for ``single`` and
   ``ddp``, and for ``fsdp`` through the full optimiser state; a LoRA run resumes with a fresh adapter on the
   merged weights and a fresh optimiser (the adapter's moments are not kept).
4. Each epoch orders the nodes along their token trie (`packing.trie_order`: random among siblings, seeded by
   the step) and cuts mini-batches of ``optim.mini_batch`` nodes from that order, for rows and packs alike:
   a mini-batch then holds whole trees where it can, so packing computes each prefix once per epoch, and
   ``optim.update`` changes how the update is computed, never what it is. With ``optim.mini_batches = K`` the
   order is cut into K near-equal consecutive parts instead, so every step takes K optimiser steps per epoch
   whatever its number of trained nodes (the learning benchmark compares allocators at equal steps).
5. ``optim.shuffle_advantages`` (a control) permutes the advantages over the trained nodes with the step's
   generator before the first epoch; everything else about the update is unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
import torch
from torch import nn

from trace_gym.errors import ConfigError
from trace_gym.training.config import ModelConfig, OptimConfig
from trace_gym.training.update.batches import UpdateBatch, update_batch
from trace_gym.training.update.models import LoraSettings, full_state_dict, is_fsdp, prepare_model, unwrap
from trace_gym.training.update.optimizer_step import policy_update
from trace_gym.training.update.optimizers import make_optimizer
from trace_gym.training.update.packing import Pack, pack_batches, packing_unsupported, shard_packs, trie_order
from trace_gym.training.update.parallel import broadcast_object, world
from trace_gym.training.update.samples import Sample

if TYPE_CHECKING:
    from transformers import PreTrainedModel

_Part = TypeVar("_Part", UpdateBatch, Pack)  # MicroBatch, each kind kept apart


def mini_batches(order: Sequence[int], size: int, count: int = 0) -> list[list[int]]:
    """``order`` cut into consecutive mini-batches: ``count`` near-equal parts when ``count > 0`` (fewer only when
    ``order`` is shorter), else parts of ``size`` (choice 4)."""
    order = list(order)
    if count > 0:
        parts = np.array_split(np.asarray(order, dtype=np.int64), min(count, len(order)))
        return [part.tolist() for part in parts if len(part)]
    return [order[start:start + size] for start in range(0, len(order), size)]


class Learner:
    """The trained model and optimiser of one rank; every public method is called on all ranks at once
    (the lead calls it, `follow` makes the other ranks call it too)."""

    def __init__(self, model_cfg: ModelConfig, optim: OptimConfig, model_path: str, device: torch.device, *,
                 seed: int = 0, temperature: float = 1.0, optimizer_state: Mapping[str, Any] | None = None):
        from transformers import AutoModelForCausalLM

        self.model_cfg, self.optim, self.temperature = model_cfg, optim, temperature  # T: SamplingParams' logprob T
        self.rank, self.world_size = world()
        m = model_cfg  # ddp/fsdp without a process group: prepare_model says how to start one
        # The ignore: transformers wraps PreTrainedModel.to in functools.wraps(nn.Module.to), whose type keeps
        # the unbound `self` as the first parameter.
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device)  # type: ignore[arg-type]
        self.config = model.config
        self.ref_model = copy.deepcopy(model).eval().requires_grad_(False) if optim.kl_coef > 0 else None
        self.lora = LoraSettings(r=m.lora_r, alpha=m.lora_alpha) if m.lora_r > 0 else None
        torch.manual_seed(seed)  # the same LoRA initialisation on every rank (FSDP2 does not broadcast)
        param_dtype = torch.bfloat16 if m.bf16 and m.strategy == "fsdp" else None
        self.module = prepare_model(model, m.strategy, lora=self.lora,
                                    gradient_checkpointing=m.gradient_checkpointing, param_dtype=param_dtype)
        self.module.eval()
        self.packed = optim.update == "packed"
        reason = packing_unsupported(self.module) if self.packed else None
        if reason is not None:
            self.packed = False
            if self.rank == 0:
                warnings.warn(f"optim.update=packed is not possible: {reason}; the policy update runs one padded "
                              "row per node instead (as optim.update=rows)", RuntimeWarning, stacklevel=2)
        o = optim
        self.optimizer = make_optimizer([p for p in self.module.parameters() if p.requires_grad], o.optimizer,
                                        lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay,
                                        momentum=o.momentum)
        if optimizer_state is not None:
            self._load_optimizer(optimizer_state)

    # ----------------------------------------------------------------- what the lead asks for
    @property
    def shares_weights(self) -> bool:
        """Whether a generation backend may use `model` itself (no copy, no weight sync)."""
        return self.model_cfg.strategy == "single" and self.lora is None

    @property
    def model(self) -> nn.Module:
        """The Hugging Face model of this rank (LoRA included); under FSDP2 its forward is a collective."""
        return unwrap(self.module)

    def local_model(self) -> nn.Module:
        """A model this rank alone can run forward (not under FSDP2): for hidden-state features."""
        if is_fsdp(self.module):
            raise ConfigError("expected a model one rank can run alone, got FSDP2 shards; fix: "
                              "predictor.kind=features with model.strategy=fsdp")
        return self.model

    def update(self, samples: Sequence[Sample], seed: int, pad_id: int) -> dict[str, float]:
        """`optim.epochs` passes over `samples` in optimiser steps of `optim.mini_batch` nodes."""
        self._command(Learner._update, samples, seed, pad_id)
        return self._update(samples, seed, pad_id)

    def weights(self) -> dict[str, torch.Tensor] | None:
        """Full weights under the base model's names, LoRA merged, on CPU, on the lead (None elsewhere)."""
        self._command(Learner._weights)
        return self._weights()

    def save(self, folder: Path | None) -> dict[str, Any] | None:
        """Write the full weights as a loadable model folder at ``folder`` (lead); returns the optimiser state
        to checkpoint (lead; None elsewhere)."""
        self._command(Learner._save, None)
        return self._save(folder)

    def stop(self) -> None:
        """Release the followers from `follow`."""
        self._command(None)

    def follow(self) -> None:
        """On ranks > 0: run rank 0's commands until it stops."""
        while True:
            command, args = broadcast_object(None)
            if command is None:  # stop
                return
            command(self, *args)

    # ----------------------------------------------------------------- the work
    def _command(self, method: Callable[..., Any] | None, *args: Any) -> None:
        """Send the followers ``method`` (a function of this class; it pickles by name) and its arguments;
        None releases them."""
        if self.world_size > 1 and self.rank == 0:
            broadcast_object((method, args))

    def _update(self, samples: Sequence[Sample], seed: int, pad_id: int) -> dict[str, float]:
        o = self.optim
        if not samples:
            return {"loss/nodes": 0.0, "loss/optimizer_steps": 0.0}
        gen = torch.Generator().manual_seed(seed)
        if o.shuffle_advantages:  # choice 5
            perm = torch.randperm(len(samples), generator=gen).tolist()
            samples = [dataclasses.replace(s, advantage=samples[j].advantage) for s, j in zip(samples, perm)]
        rows = [s.context + s.action for s in samples]
        totals: dict[str, float] = {}
        tokens, forward, losses, norms = 0.0, 0.0, [], []
        for _ in range(o.epochs):
            order = trie_order(rows, gen)  # choice 4
            for part in mini_batches(order, o.mini_batch, o.mini_batches):
                chunk = [samples[i] for i in part]
                batch = self._rank_packs(chunk) if self.packed else self._rank_rows(update_batch(chunk, pad_id))
                stats = policy_update(self.module, self.optimizer, batch, o.micro_batch, o.clip_low, o.clip_high,
                                      o.kl_coef, o.grad_clip, self.temperature,
                                      bf16=self.model_cfg.bf16 and self.model_cfg.strategy != "fsdp")
                w = stats["loss/tokens"]
                for key, value in stats.items():
                    if key not in ("loss/total", "loss/tokens", "loss/grad_norm", "loss/forward_tokens"):
                        totals[key] = totals.get(key, 0.0) + value * w
                tokens += w
                forward += stats["loss/forward_tokens"]
                losses.append(stats["loss/total"])
                norms.append(stats["loss/grad_norm"])
        self.module.eval()
        out = {key: value / max(tokens, 1.0) for key, value in totals.items()}
        out.update({"loss/total": float(np.mean(losses)), "loss/tokens": tokens, "loss/forward_tokens": forward,
                    "loss/packed": float(self.packed),
                    "loss/grad_norm": float(np.mean(norms)), "loss/nodes": float(len(samples)),
                    "loss/optimizer_steps": float(len(losses)),
                    "loss/advantage_abs_mean": float(np.mean([abs(s.advantage) for s in samples]))})
        return out

    def _rank_rows(self, batch: UpdateBatch) -> UpdateBatch:
        """This rank's rows (choice 1), with reference log-probs when the loss has a KL term."""
        mine = batch.shard(self.rank, self.world_size)
        if len(mine) == 0:
            mine = batch.without_loss()
        return self._with_reference(mine)

    def _rank_packs(self, samples: Sequence[Sample]) -> list[Pack]:
        """This rank's packs of ``samples`` (choice 1), with reference log-probs when the loss has a KL term."""
        packs = pack_batches(samples, self.optim.pack_tokens, parts=self.world_size)
        return [self._with_reference(p) for p in shard_packs(packs, self.rank, self.world_size)]

    def _with_reference(self, part: _Part) -> _Part:
        """``part`` (rows or a pack) with the reference model's log-probs of its tokens (KL term only)."""
        if self.ref_model is None:
            return part
        device = next(self.ref_model.parameters()).device
        with torch.no_grad():
            ref = part.to(device).logprobs(self.ref_model, self.temperature)
        return part.with_reference(ref.cpu())

    def _weights(self) -> dict[str, torch.Tensor] | None:
        return full_state_dict(self.module)

    def _save(self, folder: Path | None) -> dict[str, Any] | None:
        weights = full_state_dict(self.module)
        optimizer = self._optimizer_state()
        if self.rank != 0:
            return None
        assert folder is not None and weights is not None
        if self.shares_weights:  # a single-process model without LoRA: the Hugging Face model itself
            cast("PreTrainedModel", self.model).save_pretrained(folder)
        else:
            from transformers import AutoModelForCausalLM

            with torch.device("meta"):  # a skeleton only names the tensors; the weights are `weights`
                skeleton = AutoModelForCausalLM.from_config(self.config)
            if getattr(self.config, "tie_word_embeddings", False):
                weights.pop("lm_head.weight", None)  # gathered shards no longer share the embedding's storage
            skeleton.save_pretrained(folder, state_dict=weights)
        return optimizer

    def _optimizer_state(self) -> dict[str, Any] | None:
        if self.lora is not None:
            return None  # choice 3
        if is_fsdp(self.module):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            return get_optimizer_state_dict(self.module, self.optimizer,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return self.optimizer.state_dict() if self.rank == 0 else None

    def _load_optimizer(self, state: Mapping[str, Any]) -> None:
        if self.lora is not None:
            return
        if is_fsdp(self.module):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(self.module, self.optimizer, optim_state_dict=dict(state),
                                     options=StateDictOptions(full_state_dict=True))
        else:
            self.optimizer.load_state_dict(dict(state))
