"""Typed training configs: one dataclass per concern, validated on construction, loaded from YAML with
``key=value`` overrides (dotted keys, values parsed as YAML: ``optim.lr=1e-4 alloc.allocator=grpo``).

A mode is a field typed as a ``Literal``: the Literal is the only list of its allowed values, checked for every
section by `Section` before the section's own `validate`."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import operator
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args, get_origin

import pydantic
import yaml

from trace_gym.errors import ConfigError, nearest
from trace_gym.training.allocation.allocators import AllocatorName
from trace_gym.training.update.advantages import AdvantageMethod

TreeSteps = Literal["none", "all", "first_last"]
"""`log.save_trees` by name (an integer N is the other form)."""

OptimizerName = Literal["adamw", "sgd"]
"""`optim.optimizer`: training/update/optimizers.py builds each."""
OPTIMIZERS: tuple[str, ...] = get_args(OptimizerName)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@functools.cache
def choices(cls: type) -> dict[str, tuple[Any, ...]]:
    """The allowed values of each field of ``cls`` typed as a ``Literal`` (or ``Literal | None``)."""
    out: dict[str, tuple[Any, ...]] = {}
    for name, hint in typing.get_type_hints(cls).items():
        union = get_origin(hint) is typing.Union or isinstance(hint, types.UnionType)
        members = get_args(hint) if union else (hint,)
        literals = [m for m in members if get_origin(m) is Literal]
        if literals and all(get_origin(m) is Literal or m is type(None) for m in members):
            out[name] = tuple(v for m in literals for v in get_args(m)) + ((None,) if type(None) in members else ())
    return out


class Section:
    """Base of the config sections: checks every Literal-typed field, then the section's own `validate`."""

    key: ClassVar[str] = ""
    """The section's key in TrainConfig ("" for the top level), for error messages."""

    def __post_init__(self) -> None:
        where = f"{self.key}." if self.key else ""
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if not isinstance(value, Section):
                setattr(self, f.name, _coerce(type(self), f.name, value, where))
        for name, allowed in choices(type(self)).items():
            value = getattr(self, name)
            default = next(f.default for f in dataclasses.fields(self) if f.name == name)  # type: ignore[arg-type]
            _check(value in allowed, f"expected {where}{name} in {allowed}, got {value!r}; "
                   f"fix: {where}{name}={'null' if default is None else default}")
        self.validate()

    def validate(self) -> None:
        """Checks beyond the allowed values (ranges, relations between fields)."""


@dataclass
class ModelConfig(Section):
    """Which policy to train and where its weights come from."""

    key: ClassVar[str] = "model"

    path: str = "runs/model"
    """A local model directory (the tiny model, a Qwen3 checkpoint, ...)."""
    init_size: Literal["nano", "tiny"] | None = None
    """Build the embedded tiny model of this size at `path` when `path` does not exist (null: it must)."""
    backend: Literal["hf", "vllm"] = "hf"
    """Generation backend: transformers in-process (shares the trained weights) or a vLLM engine."""
    device: str = "auto"
    """"auto" (cuda when available), "cpu" or "cuda[:i]"."""
    bf16: bool = False
    """Train under bfloat16 autocast (GPU only; weights and optimiser stay fp32)."""
    gradient_checkpointing: bool = False
    """Trade compute for memory in the policy update (large models)."""
    strategy: Literal["single", "ddp", "fsdp"] = "single"
    """Policy update: one process, or data-parallel over torchrun's ranks with DDP or FSDP2 (update/learner.py)."""
    lora_r: int = 0
    """LoRA rank on the attention and MLP projections (0: train all weights)."""
    lora_alpha: int = 32
    """LoRA scale numerator (the adapter is scaled by lora_alpha / lora_r)."""
    vllm_gpu_memory_utilization: float = 0.45
    """Share of GPU memory vLLM may take when it shares the GPU with the trainer."""
    max_batch_size: int = 64
    """Rows per forward in the transformers generation backend."""

    def validate(self) -> None:
        _check(bool(self.path), "expected model.path to name a model directory, got ''; fix: model.path=runs/model")
        _check(self.device == "auto" or self.device.startswith(("cpu", "cuda")),
               f"expected model.device 'auto', 'cpu' or 'cuda[:i]', got {self.device!r}; fix: model.device=auto")
        _check(0 < self.vllm_gpu_memory_utilization <= 1, "expected 0 < model.vllm_gpu_memory_utilization <= 1, "
               f"got {self.vllm_gpu_memory_utilization}; fix: model.vllm_gpu_memory_utilization=0.45")
        _check(self.max_batch_size >= 1, f"expected model.max_batch_size >= 1, got {self.max_batch_size}")
        _check(self.lora_r >= 0 and self.lora_alpha > 0, f"expected model.lora_r >= 0 and model.lora_alpha > 0, "
               f"got {self.lora_r}, {self.lora_alpha}; fix: model.lora_r=16 model.lora_alpha=32")


@dataclass
class SFTConfig(Section):
    """Warm start by supervised fine-tuning on scripted-expert episodes when the model has no SFT yet."""

    key: ClassVar[str] = "sft"

    enabled: bool = False
    """Run SFT first unless `output` already holds a model."""
    output: str = "runs/model-sft"
    """Directory of the warm-started model; RL then starts from it."""
    episodes: int = 2000
    """Expert episodes to imitate."""
    steps: int = 400
    """Optimiser steps."""
    batch_size: int = 32
    """Episodes per step."""
    lr: float = 2e-3
    """AdamW learning rate."""
    noise: float = 0.0
    """Expert noise (0 = always correct)."""
    expert: dict[str, Any] = field(default_factory=dict)
    """Further keywords of the env's ``expert(noise, seed, **expert)``, e.g. ``{guess: 0.3}`` on Arithmetic."""

    def validate(self) -> None:
        _check(self.episodes >= 1 and self.steps >= 1 and self.batch_size >= 1,
               f"expected sft.episodes, sft.steps, sft.batch_size >= 1, got {self.episodes}, {self.steps}, "
               f"{self.batch_size}")
        _check(self.lr > 0, f"expected sft.lr > 0, got {self.lr}; fix: sft.lr=2e-3")
        _check(0 <= self.noise <= 1, f"expected 0 <= sft.noise <= 1, got {self.noise}")


@dataclass
class EnvConfig(Section):
    """The environment and how rollouts use it."""

    key: ClassVar[str] = "env"

    id: str = "trace/Arithmetic-v0"
    """A registered gymnasium id (`trace-gym envs` lists them)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Constructor keyword arguments of the training env (e.g. split: train)."""
    eval_kwargs: dict[str, Any] = field(default_factory=dict)
    """Overrides of `kwargs` for the held-out evaluation env (e.g. split: test)."""
    snapshot: Literal["native", "replay"] = "native"
    """How tree nodes are snapshotted for branching."""
    workers: int = 4
    """Threads stepping envs in parallel."""

    def validate(self) -> None:
        _check(bool(self.id), "expected env.id, got ''; fix: env.id=trace/Arithmetic-v0")
        _check(self.workers >= 1, f"expected env.workers >= 1, got {self.workers}; fix: env.workers=4")
        _check(isinstance(self.kwargs, dict) and isinstance(self.eval_kwargs, dict),
               "expected env.kwargs and env.eval_kwargs as mappings; fix: env.kwargs={split: train}")


@dataclass
class RolloutConfig(Section):
    """Sampling during training rollouts."""

    key: ClassVar[str] = "rollout"

    temperature: float = 1.0
    """Softmax temperature (> 0: RL needs exploration)."""
    top_p: float = 1.0
    """Nucleus mass; 1 keeps the logprobs of the full distribution."""
    max_new_tokens: int = 256
    """Tokens per turn."""
    max_context: int = 4096
    """A branch stops (truncated, reward 0) when its prompt plus `max_new_tokens` would exceed this."""

    def validate(self) -> None:
        _check(self.temperature > 0, f"expected rollout.temperature > 0, got {self.temperature}; "
               "fix: rollout.temperature=1.0")
        _check(0 < self.top_p <= 1, f"expected 0 < rollout.top_p <= 1, got {self.top_p}")
        _check(self.max_new_tokens >= 1, f"expected rollout.max_new_tokens >= 1, got {self.max_new_tokens}")
        _check(self.max_context > self.max_new_tokens,
               f"expected rollout.max_context > max_new_tokens, got {self.max_context} <= {self.max_new_tokens}; "
               "fix: raise rollout.max_context")


@dataclass
class AllocConfig(Section):
    """The budget per step and who spends it (TRACE or a baseline)."""

    key: ClassVar[str] = "alloc"

    allocator: AllocatorName = "trace"
    """trace, grpo, pcl, treepo or one of the four stage combinations (oracle is the simulation's only)."""
    roots: int = 64
    """M: bare rollouts per step (single-stage allocators spend M·(1+N) as bare rollouts)."""
    multiplier: int = 1
    """N: continuations per bare rollout."""
    pool_size: int = 64
    """Candidate prompts drawn per step (larger than the batch so allocation has a choice)."""
    group_size: int = 8
    """G: rollouts per prompt for uniform and pcl roots."""
    cap: int = 16
    """Most rollouts per prompt for active roots."""

    def validate(self) -> None:
        _check(self.allocator != "oracle", "expected an allocator other than 'oracle' for training (it needs true "
               "success probabilities, which only the simulation env has); fix: alloc.allocator=trace")
        _check(self.roots >= 2, f"expected alloc.roots >= 2, got {self.roots}; fix: alloc.roots=64")
        _check(self.multiplier >= 0, f"expected alloc.multiplier >= 0, got {self.multiplier}")
        _check(self.group_size >= 2 and self.cap >= 2,
               f"expected alloc.group_size and alloc.cap >= 2, got {self.group_size}, {self.cap}")
        _check(self.pool_size * self.cap >= self.roots,
               f"expected alloc.pool_size·cap >= roots, got {self.pool_size}·{self.cap} < {self.roots}; "
               "fix: raise alloc.pool_size or alloc.cap")
        total = self.roots * (1 + self.multiplier)
        needed = max(1, total // self.group_size)
        _check(self.pool_size >= needed, f"expected alloc.pool_size >= {needed} (= M·(1+N) // group_size prompts), "
               f"got {self.pool_size}; fix: alloc.pool_size={needed} or raise alloc.group_size")


@dataclass
class PredictorConfig(Section):
    """The prefix success predictor (allocation only; never in the loss)."""

    key: ClassVar[str] = "predictor"

    kind: Literal["features", "hidden"] = "features"
    """Hashed-text logistic model, or a head on the policy's hidden state."""
    lr: float = 0.01
    """Learning rate of its fit (FeaturePredictor's default)."""
    steps: int = 60
    """Optimiser steps per training step."""
    replay: int = 0
    """Fit on the examples of the last this-many steps together (0: this step's only)."""
    prior_strength: float = 0.0
    """> 0: value a revisited prompt by its own past outcomes, the shared prediction a prior worth this many
    rollouts (training/allocation/predictor.py, PromptPosterior); 0: off."""

    def validate(self) -> None:
        _check(self.replay >= 0 and self.prior_strength >= 0, f"expected predictor.replay >= 0 and "
               f"predictor.prior_strength >= 0, got {self.replay}, {self.prior_strength}")
        _check(self.lr > 0 and self.steps >= 0, f"expected predictor.lr > 0, steps >= 0, got {self.lr}, {self.steps}")


@dataclass
class OptimConfig(Section):
    """The policy update."""

    key: ClassVar[str] = "optim"

    lr: float = 1e-6
    """Learning rate."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    optimizer: OptimizerName = "adamw"
    """adamw or sgd (training/update/optimizers.py)."""
    eps: float = 1e-8
    """AdamW epsilon: gradients far below it move their weights less than lr (towards SGD's behaviour)."""
    momentum: float = 0.0
    """Heavy-ball momentum of sgd."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 disables)."""
    mini_batch: int = 64
    """Trained nodes per optimiser step."""
    micro_batch: int = 8
    """Trained nodes per forward/backward with update=rows (gradient accumulation up to `mini_batch`)."""
    update: Literal["packed", "rows"] = "packed"
    """How a forward/backward runs the trained nodes: packed (each mini-batch's rows as token tries, every shared
    prefix computed once; docs/packing.md) or rows (one padded row per node). Falls back to rows, with a
    warning, for a model that takes no custom attention mask."""
    pack_tokens: int = 4096
    """Most tokens per packed forward/backward with update=packed (a longer single row gets a pack of its own)."""
    epochs: int = 1
    """Passes over each step's nodes."""
    advantage: AdvantageMethod = "tree_grpo"
    """Advantage estimator: grpo, tree_grpo or tree_value."""
    clip_low: float = 0.2
    """PPO clip below 1."""
    clip_high: float = 0.28
    """PPO clip above 1 (DAPO clip-higher)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL to the initial policy (0: no reference model is kept)."""
    skip_zero_advantage: bool = True
    """Leave nodes with zero advantage out of the update (they add no gradient, only compute)."""

    def validate(self) -> None:
        _check(self.lr > 0, f"expected optim.lr > 0, got {self.lr}; fix: optim.lr=1e-6")
        _check(self.weight_decay >= 0 and self.grad_clip >= 0,
               f"expected optim.weight_decay, grad_clip >= 0, got {self.weight_decay}, {self.grad_clip}")
        _check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
               f"expected optim.betas as two numbers in [0, 1), got {self.betas}; fix: optim.betas=[0.9,0.999]")
        _check(self.eps > 0 and 0 <= self.momentum < 1,
               f"expected optim.eps > 0 and 0 <= optim.momentum < 1, got {self.eps}, {self.momentum}")
        _check(self.mini_batch >= 1 and 1 <= self.micro_batch <= self.mini_batch,
               f"expected 1 <= optim.micro_batch <= mini_batch, got {self.micro_batch}, {self.mini_batch}; "
               "fix: optim.micro_batch=8")
        _check(self.epochs >= 1, f"expected optim.epochs >= 1, got {self.epochs}")
        _check(self.pack_tokens >= 1, f"expected optim.pack_tokens >= 1, got {self.pack_tokens}; "
               "fix: optim.pack_tokens=4096")
        _check(0 < self.clip_low < 1 and self.clip_high > 0,
               f"expected 0 < optim.clip_low < 1 and clip_high > 0, got {self.clip_low}, {self.clip_high}")
        _check(self.kl_coef >= 0, f"expected optim.kl_coef >= 0, got {self.kl_coef}")


@dataclass
class EvalConfig(Section):
    """Held-out evaluation: mean success over `samples` samples of `tasks` prompts."""

    key: ClassVar[str] = "eval"

    every: int = 10
    """Evaluate every this many steps (and before the first and after the last; 0: only those two)."""
    tasks: int = 64
    """Held-out prompts (the first ones of the eval split)."""
    samples: int = 1
    """Samples per prompt."""
    temperature: float = 0.0
    """0 = greedy."""
    expert: bool = False
    """Also measure the teacher-forced probability of the env's scripted expert trajectory on the same prompts
    (a low-noise second measure; envs with a canonical expert, such as Arithmetic)."""

    def validate(self) -> None:
        _check(self.every >= 0, f"expected eval.every >= 0, got {self.every}")
        _check(self.tasks >= 0 and self.samples >= 1,
               f"expected eval.tasks >= 0 and eval.samples >= 1, got {self.tasks}, {self.samples}")
        _check(self.temperature >= 0, f"expected eval.temperature >= 0, got {self.temperature}")


@dataclass
class CheckpointConfig(Section):
    """When to save (model, optimiser, predictor, RNG states, data position)."""

    key: ClassVar[str] = "checkpoint"

    every: int = 50
    """Save every this many steps (and at the end; 0: only at the end)."""
    keep: int = 2
    """Most recent checkpoints kept."""

    def validate(self) -> None:
        _check(self.every >= 0 and self.keep >= 1,
               f"expected checkpoint.every >= 0 and keep >= 1, got {self.every}, {self.keep}")


@dataclass
class LogConfig(Section):
    """Where metrics go: metrics.jsonl always; TensorBoard or W&B when asked and installed."""

    key: ClassVar[str] = "log"

    tensorboard: bool = False
    """Also write TensorBoard events (needs `tensorboard`)."""
    wandb: bool = False
    """Also log to Weights & Biases (needs `wandb`)."""
    wandb_project: str = "trace-gym"
    """W&B project."""
    progress: bool = True
    """Rich progress bar on the terminal."""
    save_trees: TreeSteps | int | bool = "none"
    """Which steps' trees go to trees.jsonl in the run folder: none, all, first_last, or an integer N (every
    N-th step and the last). YAML true/false read as all/none."""
    plots: bool = True
    """Write PNG plots of the metrics to the run folder's plots/ at the end of training."""

    def validate(self) -> None:
        if isinstance(self.save_trees, bool):  # the older boolean form
            self.save_trees = "all" if self.save_trees else "none"
        ok = self.save_trees in get_args(TreeSteps) if isinstance(self.save_trees, str) else (
            isinstance(self.save_trees, int) and self.save_trees >= 1)
        _check(ok, f"expected log.save_trees none, all, first_last or a step interval N >= 1, got "
               f"{self.save_trees!r}; fix: log.save_trees=first_last (or all, none, 10)")

    def saves_trees(self, step: int, last: int) -> bool:
        """Whether step `step` (1-based) of a run ending at step `last` writes its trees."""
        if self.save_trees == "all":
            return True
        if self.save_trees == "first_last":
            return step in (1, last)
        if isinstance(self.save_trees, int):
            return step % self.save_trees == 0 or step == last
        return False


@dataclass
class RayConfig(Section):
    """Rollout workers on Ray (`distributed: ray`): where they run and how many there are."""

    key: ClassVar[str] = "ray"

    address: str | None = None
    """An existing cluster ("auto", "ray://head:10001"); null starts a local one."""
    workers: int = 2
    """Rollout actors."""
    cpus_per_worker: float = 1.0
    """CPUs reserved per actor (its env steps)."""
    gpus_per_worker: float = 0.0
    """GPUs per actor (its vLLM engine); fractions share a GPU."""
    env_threads: int = 2
    """Threads stepping one actor's envs."""
    init: dict[str, Any] = field(default_factory=dict)
    """Extra `ray.init` keyword arguments (num_cpus, _temp_dir, runtime_env, ...)."""

    def validate(self) -> None:
        _check(self.workers >= 1 and self.env_threads >= 1, f"expected ray.workers >= 1 and ray.env_threads >= 1, "
               f"got {self.workers}, {self.env_threads}; fix: ray.workers=2")
        _check(self.cpus_per_worker >= 0 and self.gpus_per_worker >= 0, f"expected non-negative "
               f"ray.cpus_per_worker and gpus_per_worker, got {self.cpus_per_worker}, {self.gpus_per_worker}; "
               "fix: ray.cpus_per_worker=1")
        _check(isinstance(self.init, dict), f"expected ray.init as a mapping, got {self.init!r}; fix: ray.init={{}}")


@dataclass
class TrainConfig(Section):
    """The whole run."""

    key: ClassVar[str] = ""

    run_dir: str = "runs/run"
    """Output folder: config, metrics, checkpoints, summary."""
    seed: int = 0
    """Seeds data order, sampling and allocation; a fixed seed on CPU makes runs exactly repeatable."""
    steps: int = 100
    """Training steps."""
    model: ModelConfig = field(default_factory=ModelConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    alloc: AllocConfig = field(default_factory=AllocConfig)
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    distributed: Literal["none", "ray"] = "none"
    """Where rollouts run: in this process ("none") or on Ray actors ("ray", see `ray`)."""
    ray: RayConfig = field(default_factory=RayConfig)

    def validate(self) -> None:
        _check(self.steps >= 0, f"expected steps >= 0, got {self.steps}")
        _check(bool(self.run_dir), "expected run_dir, got ''; fix: run_dir=runs/my-run")

    def to_dict(self) -> dict[str, Any]:
        """The config as nested plain dicts (what ``config.yaml`` holds)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        """Build and validate a config from nested dicts; unknown keys and wrong types raise ``ConfigError``."""
        return _build(cls, data, "")


def _build(cls: type, data: Mapping[str, Any], where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"expected a mapping at {where or 'the top level'}, got {type(data).__name__} "
                          f"{data!r}; fix: give {where.rstrip('.') or 'the config'} as key: value lines")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        near = nearest(unknown[0], fields)
        # A key in the wrong section (`lr=...` for `optim.lr=...`): the keys of that name below this level.
        deeper = [k for k in _dotted_keys(cls) if "." in k and k.rsplit(".", 1)[1] == unknown[0]]
        hint = f"did you mean {where}{near}? " if near else \
            f"did you mean {' or '.join(where + k for k in deeper)}? " if deeper else ""
        raise ConfigError(f"expected a config key, got unknown {where}{unknown[0]}; fix: {hint}"
                          f"{'the keys of ' + where.rstrip('.') if where else 'top-level keys'} are "
                          f"{', '.join(sorted(fields))}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        sub = _nested_type(cls, name)
        kwargs[name] = _build(sub, value or {}, f"{where}{name}.") if sub is not None else value
    return cls(**kwargs)  # each Section checks its values against the annotations


def _dotted_keys(cls: type) -> list[str]:
    """Every leaf key of the config class ``cls``, dotted (``optim.lr``)."""
    out = []
    for f in dataclasses.fields(cls):
        sub = _nested_type(cls, f.name)
        out += [f"{f.name}.{k}" for k in _dotted_keys(sub)] if sub is not None else [f.name]
    return out


def _nested_type(cls: type, name: str) -> type | None:
    default = next(f for f in dataclasses.fields(cls) if f.name == name)
    if default.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        made = default.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(made):
            return type(made)
    return None


def _coerce(cls: type, name: str, value: Any, where: str) -> Any:
    """``value`` checked against the field's annotation (pydantic, strict: no ``"5"`` for an int, no ``1`` for
    a flag), with the two conversions YAML needs: a list for a tuple, and a string for a float (YAML reads
    ``1e-4`` without a dot as a string). A Literal's values are checked by `Section`, with its own message."""
    hint = _loose(_hints(cls)[name])
    if isinstance(value, list) and _accepts(hint, tuple):
        value = tuple(value)
    if isinstance(value, str) and _accepts(hint, float) and not _accepts(hint, str):
        with contextlib.suppress(ValueError):  # a string that is no number is reported below
            value = float(value)
    try:
        out = _adapter(hint).validate_python(value, strict=True)
    except pydantic.ValidationError:
        f = next(f for f in dataclasses.fields(cls) if f.name == name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        fix = f"; fix: {where}{name}={_yaml(default)}" if default is not dataclasses.MISSING else ""
        raise ConfigError(f"expected {where}{name} as {_describe(hint)}, got {value!r}{fix}") from None
    if isinstance(out, float) and not math.isfinite(out):
        raise ConfigError(f"expected a finite {where}{name}, got {value!r}")
    return out


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def _adapter(hint: Any) -> pydantic.TypeAdapter[Any]:
    return pydantic.TypeAdapter(hint)


def _loose(hint: Any) -> Any:
    """``hint`` with each Literal replaced by the types of its values (`Section` checks the values)."""
    origin = get_origin(hint)
    if origin is Literal:
        kinds = tuple(dict.fromkeys(type(v) for v in get_args(hint)))
        return functools.reduce(operator.or_, kinds)
    if origin is typing.Union or isinstance(hint, types.UnionType):
        return functools.reduce(operator.or_, (_loose(a) for a in get_args(hint)))
    return hint


def _members(hint: Any) -> tuple[Any, ...]:
    return get_args(hint) if get_origin(hint) is typing.Union or isinstance(hint, types.UnionType) else (hint,)


def _accepts(hint: Any, kind: type) -> bool:
    return any(m is kind or get_origin(m) is kind for m in _members(hint))


_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null",
          dict: "a mapping", tuple: "a list", list: "a list"}


def _describe(hint: Any) -> str:
    """The annotation in a user's words: ``int | None`` -> "an integer or null"."""
    words = []
    for m in _members(hint):
        if get_origin(m) is tuple and get_args(m) and Ellipsis not in get_args(m):
            words.append(f"a list of {len(get_args(m))} {_describe(get_args(m)[0]).split(' ', 1)[-1]}s")
        else:
            words.append(_KINDS.get(get_origin(m) or m, getattr(m, "__name__", str(m))))
    return " or ".join(dict.fromkeys(words))


def _yaml(value: Any) -> str:
    """``value`` as one would type it after ``key=``."""
    if isinstance(value, tuple | list):
        return "[" + ",".join(_yaml(v) for v in value) + "]"
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return str(value)


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` strings (value parsed as YAML) to a nested dict, in place; returns it."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"expected an override as key=value, got {item!r}; fix: e.g. optim.lr=1e-4")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        node = data
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"expected {part!r} in {key!r} to be a section, got a value; fix: check the key")
            node = child
        try:
            node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"expected a YAML value in {item!r}, got {type(exc).__name__}; fix: quote it, "
                              f"e.g. {key}='\"text\"'") from None
    return data


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read a YAML config (or start from defaults when `path` is None) and apply ``key=value`` overrides."""
    data = _read_yaml(Path(path), ()) if path is not None else {}
    return TrainConfig.from_dict(apply_overrides(data, overrides))


def _read_yaml(p: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    """A YAML config; a top-level ``base: other.yaml`` (relative to this file) is loaded first and deep-merged."""
    if not p.is_file():
        raise ConfigError(f"expected a config file, got {str(p)!r} (not found); fix: see configs/*.yaml")
    if p.resolve() in seen:
        raise ConfigError(f"expected acyclic 'base:' references, got a cycle through {str(p)!r}")
    try:
        loaded = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"expected valid YAML in {str(p)!r}, got a syntax error at{where or ' some point'}: "
                          f"{getattr(exc, 'problem', None) or exc}; fix: correct that line") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"expected a mapping of settings in {str(p)!r}, got a {type(loaded).__name__}; "
                          "fix: write key: value lines, as in configs/quickstart.yaml")
    data = loaded or {}
    base = data.pop("base", None)
    if base is None:
        return data
    return _merge(_read_yaml(p.parent / str(base), (*seen, p.resolve())), data)


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) \
            else value
    return out


def dump_config(cfg: TrainConfig, path: str | Path) -> None:
    data = cfg.to_dict()
    data["optim"]["betas"] = list(data["optim"]["betas"])
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))
