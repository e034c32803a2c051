"""The trained model's wrapping: gradient checkpointing, a LoRA adapter (peft), DDP or FSDP2 (``fully_shard``),
and the full weights gathered on rank 0 for pushing to generation engines and checkpoints.

LoRA weights reach the engines merged (W + scale·B·A under the base model's own parameter names), so an engine
needs no adapter support and the push is the same as for full fine-tuning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch import nn

from trace_gym.errors import ConfigError
from trace_gym.training.config import Strategy
from trace_gym.training.update.parallel import world

if TYPE_CHECKING:
    from transformers import PreTrainedModel

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraSettings:
    """A peft LoRA adapter on the attention and MLP projections."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    targets: tuple[str, ...] = LORA_TARGETS

    def __post_init__(self) -> None:
        if self.r < 1 or self.alpha <= 0 or not 0 <= self.dropout < 1:
            raise ConfigError(f"expected LoRA r >= 1, alpha > 0, 0 <= dropout < 1, got {self.r}, {self.alpha}, "
                              f"{self.dropout}; fix: r=16 alpha=32 dropout=0")



def prepare_model(model: nn.Module, strategy: Strategy = "single", lora: LoraSettings | None = None,
                  gradient_checkpointing: bool = False, param_dtype: torch.dtype | None = None) -> nn.Module:
    """Ready a Hugging Face causal LM for training: optional checkpointing and LoRA, then DDP or FSDP2.

    FSDP2 shards every decoder layer (the model's ``_no_split_modules`` classes) and then the root, so layers
    are gathered one at a time. ``param_dtype`` (e.g. ``torch.bfloat16``) is FSDP2's compute dtype; gradients
    are reduced in float32.
    """
    if strategy not in ("single", "ddp", "fsdp"):
        raise ConfigError(f"expected strategy 'single', 'ddp' or 'fsdp', got {strategy!r}")
    if strategy != "single" and not dist.is_initialized():
        raise ConfigError(f"expected a process group for strategy {strategy!r}, got none; fix: init_from_env() "
                          "under torchrun, or spawn()")
    if gradient_checkpointing:
        hf = cast("PreTrainedModel", model)  # nn.Module does not declare the Hugging Face methods
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        hf.config.use_cache = False
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                 target_modules=list(lora.targets), bias="none"))
        if gradient_checkpointing:
            model.enable_input_require_grads()  # frozen embeddings would cut the checkpointed graph
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device = next(model.parameters()).device
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        device = next(model.parameters()).device
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        layer_classes = set(getattr(_hf_model(model), "_no_split_modules", None) or ())
        layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
        if not layers:
            raise ConfigError(f"expected decoder layers named by _no_split_modules in {type(model).__name__}, got "
                              "none; fix: use strategy='ddp' for this model")
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp_policy)
        fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DDP wrapper (the model itself otherwise)."""
    return model.module if hasattr(model, "module") and isinstance(model.module, nn.Module) else model


def _hf_model(model: nn.Module) -> nn.Module:
    model = unwrap(model)
    get_base = getattr(model, "get_base_model", None)  # peft
    return get_base() if callable(get_base) else model



def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """Full weights under the base model's Hugging Face names, on CPU, on rank 0 (``None`` elsewhere).

    A collective under FSDP2: every rank must call it. LoRA adapters come back merged (module docstring).
    """
    rank, _ = world()
    inner = unwrap(model)
    if is_fsdp(inner):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # gathered: plain tensors, no DTensor
        state = cast(dict[str, torch.Tensor], get_model_state_dict(inner, options=options))
    else:
        state = {k: v.detach().cpu() for k, v in inner.state_dict().items()} if rank == 0 else {}
    if rank != 0:
        return None
    scalings = _lora_scalings(inner)
    return merge_lora(state, scalings) if scalings else state


def is_fsdp(model: nn.Module) -> bool:
    """Whether any part of ``model`` is sharded by FSDP2."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def _lora_scalings(model: nn.Module) -> dict[str, float]:
    """Module name (in state-dict spelling) -> LoRA scale, for every LoRA layer with the active adapter."""
    out = {}
    for name, module in model.named_modules():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, dict) and hasattr(module, "base_layer") and hasattr(module, "lora_A"):
            adapters = getattr(module, "active_adapters", None) or list(scaling)
            if len(adapters) != 1:
                raise ConfigError(f"expected one active LoRA adapter, got {adapters} at {name}")
            out[name] = (adapters[0], float(scaling[adapters[0]]))
    return out  # type: ignore[return-value]


def merge_lora(state: dict[str, torch.Tensor], scalings: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A peft state dict -> the base model's state dict with every adapter folded into its weight."""
    out: dict[str, torch.Tensor] = {}
    for module, (adapter, scale) in scalings.items():
        a = state[f"{module}.lora_A.{adapter}.weight"].float()
        b = state[f"{module}.lora_B.{adapter}.weight"].float()
        base = state[f"{module}.base_layer.weight"]
        out[f"{module}.weight"] = (base.float() + scale * (b @ a)).to(base.dtype)
    for key, value in state.items():
        if ".lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        out.setdefault(key, value)
    prefix = "base_model.model."
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in out.items()}
