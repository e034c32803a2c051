"""Data-parallel policy update with torch.distributed: DDP or FSDP2 (``fully_shard``), LoRA through peft,
gradient checkpointing, and full weights gathered on rank 0 for pushing to generation engines.

The same code runs on CPU (gloo, the tests use 2 processes) and on GPUs (NCCL), launched by ``torchrun``, by
``spawn`` (one machine) or by ``ray_run`` (Ray actors on any nodes of a cluster). Choices:
1. Every rank trains on its own rows; the loss is divided by the trained tokens of the whole step
   (all-reduced) and multiplied by the world size, because DDP and FSDP2 average gradients over ranks. The
   update therefore equals the single-process update on all rows (token-level normalisation, loss.py note 1).
2. Every rank runs the same number of forward/backward passes (the largest local count; missing micro-batches
   are a real row or pack with an all-zero mask): FSDP2 and DDP issue collectives in each pass, so unequal
   counts would hang.
3. LoRA weights reach the engines merged (W + scale·B·A under the base model's own parameter names), so an
   engine needs no adapter support and the push is the same as for full fine-tuning.
4. Per-token tensors of an `UpdateBatch` are aligned with ``input_ids``: position t holds the log-probability
   of token t (computed from the logits at t - 1); position 0 is never trained.
5. A micro-batch is either rows (an `UpdateBatch` of ``micro_batch`` rows) or one `packing.Pack` (a token trie
   of rows, packing.py); both hand `policy_loss` the same per-token terms, so the loss, its normaliser and the
   statistics do not depend on which one ran.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from trace_gym.agents.hf import sequence_logprobs
from trace_gym.errors import ConfigError
from trace_gym.training.update.loss import policy_loss
from trace_gym.training.update.packing import Pack

Strategy = Literal["single", "ddp", "fsdp"]
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class UpdateBatch:
    """Rows of token ids with per-token training targets, all (B, T) and aligned with ``input_ids``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor  # 1 on sampled action tokens
    old_logprobs: torch.Tensor  # behaviour log-probs of token t at position t
    advantages: torch.Tensor  # (B,) one per row, or (B, T)
    ref_logprobs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        shape = tuple(self.input_ids.shape)
        for name in ("attention_mask", "loss_mask", "old_logprobs"):
            if tuple(getattr(self, name).shape) != shape:
                raise ValueError(f"expected {name} of shape {shape} (like input_ids), "
                                  f"got {tuple(getattr(self, name).shape)}")
        if self.advantages.shape[0] != shape[0]:
            raise ValueError(f"expected advantages with {shape[0]} rows, got {tuple(self.advantages.shape)}")

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def rows(self, index: torch.Tensor | slice | Sequence[int]) -> UpdateBatch:
        """The sub-batch of the given rows."""
        if not isinstance(index, slice | torch.Tensor):
            index = torch.as_tensor(list(index), dtype=torch.long)
        return UpdateBatch(**{f.name: (None if getattr(self, f.name) is None else getattr(self, f.name)[index])
                              for f in fields(self)})

    def to(self, device: torch.device | str) -> UpdateBatch:
        return UpdateBatch(**{f.name: (None if getattr(self, f.name) is None else getattr(self, f.name).to(device))
                              for f in fields(self)})

    def shard(self, rank: int, world_size: int) -> UpdateBatch:
        """Rows ``rank, rank + world_size, ...``: round-robin keeps long and short rows spread over ranks."""
        return self.rows(slice(rank, None, world_size))

    @property
    def tokens(self) -> int:
        """Tokens run through the model by a forward over these rows (padding included)."""
        return int(self.input_ids.numel())

    def without_loss(self) -> UpdateBatch:
        """The first row with nothing trained (an idle rank's pass, note 2)."""
        part = self.rows(slice(0, 1))
        return replace(part, loss_mask=torch.zeros_like(part.loss_mask))

    def with_reference(self, ref_logprobs: torch.Tensor) -> UpdateBatch:
        return replace(self, ref_logprobs=ref_logprobs)

    def logprobs(self, model: nn.Module, temperature: float = 1.0) -> torch.Tensor:
        """(B, T) log-probabilities of the tokens under ``model``, aligned with ``input_ids`` (note 4)."""
        return token_logprobs(model, self.input_ids, self.attention_mask, temperature)


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


# --------------------------------------------------------------------------------------------- process groups
def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_from_env(backend: str | None = None) -> tuple[int, int]:
    """Join the process group described by torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, ...).

    NCCL when CUDA is available (each process takes GPU ``LOCAL_RANK``), gloo otherwise.
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise ConfigError("expected torchrun's RANK and WORLD_SIZE in the environment, got neither; "
                          "fix: launch with `torchrun --nproc-per-node N ...` or use spawn()")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return world()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` from rank ``src`` on every rank (e.g. the step's `UpdateBatch`, built by the rank that collected
    the trees); returns ``obj`` unchanged without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def host_store(host: str, world_size: int) -> dist.TCPStore:
    """A rendezvous store listening on a port the OS picks, for ranks that join with ``TORCHELASTIC_USE_AGENT_STORE``
    (as under torchrun). Held by the caller for the whole run, so no other process can take the port between
    choosing it and binding it, the race of picking a free port and letting rank 0 bind it later."""
    return dist.TCPStore(host, 0, world_size, is_master=True, wait_for_workers=False)


def _join_hosted(addr: str, port: int, rank: int, world_size: int, local_rank: int) -> None:
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(local_rank), TORCHELASTIC_USE_AGENT_STORE="True")


def _spawned(rank: int, world_size: int, port: int, backend: str, fn: Callable[..., Any], args: tuple) -> None:
    _join_hosted("127.0.0.1", port, rank, world_size, rank)
    torch.set_num_threads(1)  # one process per core; oversubscribed threads are slower, not faster
    init_from_env(backend)
    try:
        fn(rank, world_size, *args)
        dist.barrier()  # leave together: a rank tearing down while its peer still talks aborts the peer (gloo)
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable[..., Any], world_size: int, *args: Any, backend: str | None = None) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes joined in one process group
    (one machine; ``fn`` must be importable, i.e. a module-level function)."""
    import torch.multiprocessing as mp

    if world_size < 1:
        raise ConfigError(f"expected world_size >= 1, got {world_size}")
    backend = backend or ("nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size
                          else "gloo")
    store = host_store("127.0.0.1", world_size)  # listens until spawn returns
    mp.spawn(_spawned, args=(world_size, store.port, backend, fn, args), nprocs=world_size, join=True)


class _Rank:
    """A Ray actor that joins a process group as one rank (see `ray_run`)."""

    def host(self, world_size: int) -> tuple[str, int]:
        """Host the group's rendezvous store (rank 0's actor, for as long as it lives); its address."""
        import ray

        addr = ray.util.get_node_ip_address()
        self._store = host_store(addr, world_size)
        return addr, self._store.port

    def run(self, rank: int, world_size: int, master: tuple[str, int], backend: str, fn: Callable[..., Any],
            args: tuple) -> Any:
        # Ray gives each actor its own CUDA_VISIBLE_DEVICES, so the actor's GPU is always device 0.
        _join_hosted(master[0], master[1], rank, world_size, 0)
        init_from_env(backend)
        try:
            out = fn(rank, world_size, *args)
            dist.barrier()  # leave together, as in spawn
            return out
        finally:
            dist.destroy_process_group()


def ray_run(fn: Callable[..., Any], world_size: int, *args: Any, num_gpus_per_rank: float = 0.0,
            num_cpus_per_rank: float = 1.0, backend: str | None = None) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` Ray actors joined in one process group (any nodes of
    the connected cluster; rank 0's node hosts the rendezvous); returns the ranks' results in rank order."""
    import ray

    if world_size < 1:
        raise ConfigError(f"expected world_size >= 1, got {world_size}")
    backend = backend or ("nccl" if num_gpus_per_rank > 0 else "gloo")
    actor = ray.remote(num_cpus=num_cpus_per_rank, num_gpus=num_gpus_per_rank)(_Rank)
    ranks = [actor.remote() for _ in range(world_size)]
    try:
        master = ray.get(ranks[0].host.remote(world_size))
        return ray.get([r.run.remote(i, world_size, master, backend, fn, args) for i, r in enumerate(ranks)])
    finally:
        for r in ranks:
            ray.kill(r)


# --------------------------------------------------------------------------------------------- model wrapping
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
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
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


# --------------------------------------------------------------------------------------------- the update
def token_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """(B, T) log-probability of token t at position t (`sequence_logprobs` aligned with ``input_ids``);
    column 0 is zero. Positions count real tokens only, so left padding is harmless."""
    taken = sequence_logprobs(model, input_ids, attention_mask, temperature)
    return torch.cat([torch.zeros_like(taken[:, :1]), taken], dim=1)


def _all_reduce(value: float, op: Any = None) -> float:
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.float64, device=_collective_device())
    dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return float(t.item())


def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


MicroBatch = UpdateBatch | Pack
"""What one forward/backward runs: rows or a packed trie of rows (note 5)."""


def _loss_terms(part: MicroBatch, model: nn.Module, temperature: float
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(logprobs, old logprobs, advantages, mask, reference logprobs) in `policy_loss`'s layout."""
    logprobs = part.logprobs(model, temperature)
    if isinstance(part, Pack):  # already one column per trained (row, token) pair
        return logprobs, part.old_logprobs.float(), part.advantages.float(), part.loss_mask, part.ref_logprobs
    adv = part.advantages if part.advantages.dim() == 1 else part.advantages[:, 1:]
    ref = None if part.ref_logprobs is None else part.ref_logprobs[:, 1:]
    return logprobs[:, 1:], part.old_logprobs[:, 1:].float(), adv.float(), part.loss_mask[:, 1:], ref


def _local_parts(batch: UpdateBatch | Sequence[Pack], micro_batch: int) -> list[MicroBatch]:
    """This rank's micro-batches: ``micro_batch`` rows at a time, or one pack at a time."""
    if isinstance(batch, UpdateBatch):
        return [batch.rows(slice(i, i + micro_batch)) for i in range(0, len(batch), micro_batch)]
    return list(batch)


def _trained_tokens(part: MicroBatch) -> float:
    return float(part.loss_mask.sum()) if isinstance(part, Pack) else float(part.loss_mask[:, 1:].sum())


def policy_update(model: nn.Module, optimizer: torch.optim.Optimizer, batch: UpdateBatch | Sequence[Pack],
                  micro_batch: int = 8, clip_low: float = 0.2, clip_high: float | None = None, kl_coef: float = 0.0,
                  grad_clip: float = 1.0, temperature: float = 1.0, bf16: bool = False) -> dict[str, float]:
    """One optimiser step on this rank's rows ``batch`` (all of them without a process group): an
    `UpdateBatch` run ``micro_batch`` rows per forward/backward, or packs (packing.py) run one per pass.

    The gradient is that of ``policy_loss`` over the rows of all ranks together, normalised by their trained
    tokens (note 1). ``bf16``: forward under bfloat16 autocast on CUDA (FSDP2 takes ``param_dtype`` instead).
    Returns step statistics averaged over ranks (``loss/...``; ``loss/grad_norm`` before clipping;
    ``loss/tokens``, the trained tokens, and ``loss/forward_tokens``, the tokens run through the model, summed).
    """
    if micro_batch < 1:
        raise ValueError(f"expected micro_batch >= 1, got {micro_batch}")
    if len(batch) == 0:
        raise RuntimeError("expected at least one row on every rank, got 0; fix: give each rank >= 1 row")
    _, world_size = world()
    device = next(p for p in model.parameters()).device
    parts = _local_parts(batch, micro_batch)
    tokens = _all_reduce(sum(_trained_tokens(p) for p in parts))
    if tokens == 0:
        raise RuntimeError("expected trained tokens in the batch, got an all-zero loss_mask")
    steps = int(_all_reduce(float(len(parts)), dist.ReduceOp.MAX if dist.is_initialized() else None))
    parts += [parts[0].without_loss()] * (steps - len(parts))
    model.train()
    optimizer.zero_grad(set_to_none=True)
    totals: dict[str, float] = {"loss/forward_tokens": 0.0}
    for i, part in enumerate(parts):
        part = part.to(device)
        # Reduce gradients only after the last micro-batch (the accumulated gradient).
        last = i == len(parts) - 1
        if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
            model.set_requires_gradient_sync(last)
        sync = model.no_sync() if hasattr(model, "no_sync") and not last else contextlib.nullcontext()
        with sync, torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16 and device.type == "cuda"):
            logprobs, old, adv, mask, ref = _loss_terms(part, model, temperature)
            loss, stats = policy_loss(logprobs, old, adv, mask, clip_low=clip_low, clip_high=clip_high,
                                      ref_logprobs=ref, kl_coef=kl_coef, num_tokens=tokens)
            (loss * world_size).backward()
        totals["loss/forward_tokens"] += part.tokens
        weight = stats["loss/tokens"]
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + (value if key in ("loss/total", "loss/tokens") else value * weight)
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    if hasattr(norm, "full_tensor"):  # FSDP2 returns a DTensor
        norm = norm.full_tensor()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    out = {key: _all_reduce(value) for key, value in totals.items()}
    for key in out:
        if key not in ("loss/total", "loss/tokens", "loss/forward_tokens"):
            out[key] /= max(out["loss/tokens"], 1.0)
    out["loss/grad_norm"] = float(norm)
    return out


# --------------------------------------------------------------------------------------------- weights out
def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """Full weights under the base model's Hugging Face names, on CPU, on rank 0 (``None`` elsewhere).

    A collective under FSDP2: every rank must call it. LoRA adapters come back merged (note 3).
    """
    rank, _ = world()
    inner = unwrap(model)
    if is_fsdp(inner):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(inner, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
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
