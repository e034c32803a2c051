"""Training configs: one pydantic model per concern, loaded from YAML with ``key=value`` overrides (dotted keys,
values parsed as YAML: ``optim.lr=1e-4 alloc.allocator=grpo``).

The leaf of ``trace_gym.training``: it imports nothing else of the package, so each part (allocation, rollout,
update, the driver) can take its own section. The modes are the ``Literal`` types below, the only list of their
allowed values. pydantic checks every value against its annotation (strictly: no ``"5"`` for an integer, no
``1`` for a flag; YAML's list for a tuple and its string ``1e-4`` for a float are the two conversions) and the
ranges given with each field; a section's ``model_validator`` checks relations between its fields. Every
failure is one `ConfigError` line that names the key and its fix.
"""

from __future__ import annotations

import contextlib
import functools
import math
import operator
import re
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args, get_origin

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from trace_gym.errors import ConfigError, nearest

AllocatorName = Literal["trace", "grpo", "pcl", "treepo", "uniform_uniform", "uniform_active", "active_uniform",
                        "active_active", "oracle", "trace_adaptive", "trace_root", "trace_refund", "trace_plus",
                        "trace_root_uniform"]
"""`alloc.allocator`: training/allocation/allocators.py builds each (the TRACE variants: training/variants.py)."""
ALLOCATORS: tuple[str, ...] = get_args(AllocatorName)
SCALED_VARIANTS = ("trace_root", "trace_refund", "trace_plus")
"""The allocators that compare prefix gains with root gains, where `alloc.flip_scale` applies."""

AdvantageMethod = Literal["grpo", "tree_grpo", "tree_value"]
"""`optim.advantage`: training/update/advantages.py computes each."""
ADVANTAGE_METHODS: tuple[str, ...] = get_args(AdvantageMethod)

PredictorTarget = Literal["leaves", "children"]
"""`predictor.target`: what a prefix's success target is (training/allocation/predictor.py, training_examples)."""

OptimizerName = Literal["adamw", "sgd"]
"""`optim.optimizer`: training/update/optimizers.py builds each."""
OPTIMIZERS: tuple[str, ...] = get_args(OptimizerName)

Strategy = Literal["single", "ddp", "fsdp"]
"""`model.strategy`: one process, or data-parallel with DDP or FSDP2 (training/update/models.py)."""

TreeSteps = Literal["none", "all", "first_last"]
"""`log.save_trees` by name (an integer N is the other form)."""


@dataclass(frozen=True)
class StepBudget:
    """Trajectories per step: ``roots`` M bare rollouts plus ``multiplier`` N continuations per rollout."""

    roots: int  # M
    multiplier: int  # N

    def __post_init__(self) -> None:
        if self.roots < 2 or self.multiplier < 0:
            raise ConfigError(f"expected alloc.roots >= 2 and alloc.multiplier >= 0, got M={self.roots}, "
                              f"N={self.multiplier}; fix: alloc.roots=64 alloc.multiplier=1")

    @property
    def total(self) -> int:
        return self.roots * (1 + self.multiplier)


class Section(BaseModel):
    """Base of the config sections: strict pydantic validation, YAML's two conversions, one-line errors."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, use_attribute_docstrings=True)

    key: ClassVar[str] = ""
    """The section's key in TrainConfig ("" for the top level), for error messages."""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except pydantic.ValidationError as exc:
            raise ConfigError(one_line(type(self), exc)) from None

    @model_validator(mode="before")
    @classmethod
    def _yaml_forms(cls, data: Any) -> Any:
        """A list for a tuple field; a numeric string for a float field (YAML reads ``1e-4`` as a string)."""
        if not isinstance(data, Mapping):
            return data
        out = dict(data)
        for name, value in out.items():
            field = cls.model_fields.get(name)
            if field is None:
                continue
            hint = _loose(field.annotation)
            if isinstance(value, list) and _accepts(hint, tuple):
                out[name] = tuple(value)
            elif isinstance(value, str) and _accepts(hint, float) and not _accepts(hint, str):
                with contextlib.suppress(ValueError):  # a string that is no number is reported as such
                    out[name] = float(value)
        return out

    def check(self, ok: bool, message: str) -> None:
        """A relation between fields; ``message`` is the whole line (expected, got, fix)."""
        if not ok:
            raise ValueError(message)



class ModelConfig(Section):
    """Which policy to train and where its weights come from."""

    key: ClassVar[str] = "model"

    path: str = Field("runs/model", min_length=1)
    """A local model directory (the tiny model, a Qwen3 checkpoint, ...)."""
    init_size: Literal["nano", "tiny"] | None = None
    """Build the embedded tiny model of this size at `path` when `path` does not exist (null: it must)."""
    backend: Literal["hf", "vllm"] = "hf"
    """Generation backend: transformers in-process (shares the trained weights) or a vLLM engine."""
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    """"auto" (cuda when available), "cpu" or "cuda[:i]"."""
    bf16: bool = False
    """Train under bfloat16 autocast (GPU only; weights and optimiser stay fp32)."""
    gradient_checkpointing: bool = False
    """Trade compute for memory in the policy update (large models)."""
    strategy: Strategy = "single"
    """Policy update: one process, or data-parallel over torchrun's ranks with DDP or FSDP2 (update/learner.py)."""
    lora_r: int = Field(0, ge=0)
    """LoRA rank on the attention and MLP projections (0: train all weights)."""
    lora_alpha: int = Field(32, gt=0)
    """LoRA scale numerator (the adapter is scaled by lora_alpha / lora_r)."""
    vllm_gpu_memory_utilization: float = Field(0.45, gt=0, le=1)
    """Share of GPU memory vLLM may take when it shares the GPU with the trainer."""
    max_batch_size: int = Field(64, ge=1)
    """Rows per forward in the transformers generation backend."""


class SFTConfig(Section):
    """Warm start by supervised fine-tuning on scripted-expert episodes when the model has no SFT yet. The SFT
    run itself takes the optimiser settings below (`agents.sft.SFTSettings` holds the rest at its defaults)."""

    key: ClassVar[str] = "sft"

    enabled: bool = False
    """Run SFT first unless `output` already holds a model."""
    output: str = Field("runs/model-sft", min_length=1)
    """Directory of the warm-started model; RL then starts from it."""
    episodes: int = Field(2000, ge=1)
    """Expert episodes to imitate."""
    steps: int = Field(400, ge=1)
    """Optimiser steps."""
    batch_size: int | None = Field(None, ge=1)
    """Episodes per step (null: by model size, `agents.sft.SFTSettings.resolved`: 32 for the tiny model, 8 above
    20M parameters)."""
    lr: float | None = Field(None, gt=0)
    """AdamW learning rate (null: by model size: 2e-3 for the tiny model; 5e-5 above 20M parameters, 5e-4 with
    LoRA, `model.lora_r`, which SFT uses as RL does)."""
    processes: int | None = Field(None, ge=1)
    """Processes that split each batch, one thread each (null: one per usable core, at most 4, below 20M parameters,
    else 1; `agents.sft.SFTSettings.processes`)."""
    noise: float = Field(0.0, ge=0, le=1)
    """Expert noise (0 = always correct)."""
    expert: dict[str, Any] = Field(default_factory=dict)
    """Further keywords of the env's ``expert(noise, seed, **expert)``, e.g. ``{guess: 0.3}`` on Arithmetic."""


class MixEntry(Section):
    """One env of `env.mix`: what it is, its arguments and its share of the prompts."""

    key: ClassVar[str] = "env.mix[]"

    id: str = Field(min_length=1)
    """A registered gymnasium id, module:id or module:Class (as `env.id`)."""
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    """Its key in task ids and metric names (``rollout/<name>/success``); null: the id's last name without the
    version (trace/Arithmetic-v0 -> Arithmetic)."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Constructor keyword arguments of its training env."""
    eval_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Overrides of `kwargs` for its held-out evaluation env."""
    weight: float = Field(1.0, gt=0)
    """Its share of each step's candidate prompts, relative to the other entries' weights."""
    expert: dict[str, Any] | None = None
    """Keywords of its scripted expert for the warm start (null: `sft.expert`)."""

    @property
    def key_name(self) -> str:
        """`name`, or the id's short name (as `trace_gym.env_mix.short_name` gives it)."""
        return self.name or re.sub(r"-v\d+$", "", re.split(r"[/:]", self.id)[-1]) or self.id


class EnvConfig(Section):
    """The environment and how rollouts use it."""

    key: ClassVar[str] = "env"

    id: str = Field("trace/Arithmetic-v0", min_length=1)
    """A registered gymnasium id (`trace-gym envs` lists them), module:id or module:Class."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Constructor keyword arguments of the training env (e.g. split: train)."""
    eval_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Overrides of `kwargs` for the held-out evaluation env (e.g. split: test)."""
    snapshot: Literal["native", "replay"] = "native"
    """How tree nodes are snapshotted for branching."""
    workers: int = Field(4, ge=1)
    """Threads stepping envs in parallel."""
    mix: list[MixEntry] = Field(default_factory=list)
    """Several envs in one run, in place of `id`, `kwargs` and `eval_kwargs` (empty: the one env of `id`): each
    entry an env, its arguments and a weight; each step's candidate prompts are drawn across them by weight, and
    metrics and held-out success are reported per env (docs/training.md)."""

    @model_validator(mode="after")
    def _one_form(self) -> EnvConfig:
        if not self.mix:
            return self
        # Set by value, not by key: a dumped config (config.yaml) holds the defaults beside the mix.
        both = [k for k in ("id", "kwargs", "eval_kwargs") if getattr(self, k) != type(self).model_fields[k]
                .get_default(call_default_factory=True)]
        self.check(not both, f"expected env.mix or env.id, not both, got env.mix with env.{', env.'.join(both)}; "
                   "fix: move the env into an entry of env.mix (id, kwargs, eval_kwargs, weight)")
        names = [e.key_name for e in self.mix]
        twice = sorted({n for n in names if names.count(n) > 1})
        self.check(not twice, f"expected a distinct name per env.mix entry, got {twice} more than once; fix: give "
                   "the entries a name each (env.mix[i].name)")
        return self


class RolloutConfig(Section):
    """Sampling during training rollouts."""

    key: ClassVar[str] = "rollout"

    temperature: float = Field(1.0, gt=0)
    """Softmax temperature (> 0: RL needs exploration)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus mass; 1 keeps the logprobs of the full distribution."""
    max_new_tokens: int = Field(256, ge=1)
    """Tokens per turn."""
    max_context: int = Field(4096, ge=2)
    """A branch stops (truncated, reward 0) when its prompt plus `max_new_tokens` would exceed this."""

    @model_validator(mode="after")
    def _context_holds_a_turn(self) -> RolloutConfig:
        self.check(self.max_context > self.max_new_tokens, f"expected rollout.max_context > max_new_tokens, got "
                   f"{self.max_context} <= {self.max_new_tokens}; fix: raise rollout.max_context")
        return self


class AllocConfig(Section):
    """The budget per step and who spends it (TRACE or a baseline)."""

    key: ClassVar[str] = "alloc"

    allocator: AllocatorName = "trace"
    """trace, grpo, pcl, treepo or one of the four stage combinations (oracle is the simulation's only)."""
    roots: int = 64
    """M: bare rollouts per step (single-stage allocators spend M·(1+N) as bare rollouts)."""
    multiplier: int = 1
    """N: continuations per bare rollout."""
    pool_size: int = Field(64, ge=1)
    """Candidate prompts drawn per step (larger than the batch so allocation has a choice)."""
    group_size: int = Field(8, ge=2)
    """G: rollouts per prompt for uniform and pcl roots."""
    cap: int = Field(16, ge=2)
    """Most rollouts per prompt for active roots."""
    flip_scale: bool = False
    """Scale the prefix gains 1 - q^k by realised/predicted flips per bare outcome, measured online, before they meet
    root gains (training/variants.py, `FlipScale`): trace_root, trace_refund and trace_plus only."""
    flip_scale_prior: float = Field(8.0, gt=0)
    """The flip scale's prior, in predicted flips: it starts at 1 and needs about this many to move halfway."""

    @property
    def budget(self) -> StepBudget:
        """The trajectories per step these settings spend."""
        return StepBudget(self.roots, self.multiplier)

    @model_validator(mode="after")
    def _budget_fits_the_pool(self) -> AllocConfig:
        self.check(self.allocator != "oracle", "expected an allocator other than 'oracle' for training (it needs "
                   "true success probabilities, which only the simulation env has); fix: alloc.allocator=trace")
        total = self.budget.total  # StepBudget checks M and N
        self.check(self.pool_size * self.cap >= self.roots, f"expected alloc.pool_size·cap >= roots, got "
                   f"{self.pool_size}·{self.cap} < {self.roots}; fix: raise alloc.pool_size or alloc.cap")
        self.check(not self.flip_scale or self.allocator in SCALED_VARIANTS,
                   f"expected alloc.flip_scale with one of {SCALED_VARIANTS}, got {self.allocator!r}; fix: "
                   "alloc.allocator=trace_plus or alloc.flip_scale=false")
        needed = max(1, total // self.group_size)
        self.check(self.pool_size >= needed, f"expected alloc.pool_size >= {needed} (= M·(1+N) // group_size "
                   f"prompts), got {self.pool_size}; fix: alloc.pool_size={needed} or raise alloc.group_size")
        return self


class PredictorConfig(Section):
    """The prefix success predictor (allocation only; never in the loss)."""

    key: ClassVar[str] = "predictor"

    kind: Literal["features", "hidden"] = "features"
    """Hashed-text logistic model, or a head on the policy's hidden state."""
    lr: float = Field(0.01, gt=0)
    """Learning rate of its fit (FeaturePredictor's default)."""
    steps: int = Field(60, ge=0)
    """Optimiser steps per training step."""
    replay: int = Field(0, ge=0)
    """Fit on the examples of the last this-many steps together (0: this step's only)."""
    prior_strength: float = Field(0.0, ge=0)
    """> 0: value a revisited prompt by its own past outcomes, the shared prediction a prior worth this many
    rollouts (training/allocation/predictor_wrappers.py, PromptPosterior); 0: off."""
    target: PredictorTarget = "leaves"
    """A prefix's fit target: ``leaves``, the mean leaf reward below it (the paper's bottom-up average), or
    ``children``, the mean of its children's targets, so that continuations spent deeper in a subtree count once
    at its ancestors."""
    calibrate: bool = False
    """Recalibrate the predictions online (per depth class, on the last steps' out-of-sample predictions:
    predictor_wrappers.py, CalibratedPredictor)."""
    logprob_features: bool = False
    """Give the text-feature model the policy's log-probs of its sampled actions (binned, per turn and path, by
    depth) and the task's tier (``meta["tier"]``) as features (predictor.py, deviation 7); off: the text alone."""

    @model_validator(mode="after")
    def _features_for_the_text_model(self) -> PredictorConfig:
        self.check(not self.logprob_features or self.kind == "features", "expected predictor.kind=features with "
                   "predictor.logprob_features, got kind=hidden; fix: predictor.logprob_features=false")
        return self


class OptimConfig(Section):
    """The policy update."""

    key: ClassVar[str] = "optim"

    lr: float = Field(1e-6, gt=0)
    """Learning rate."""
    weight_decay: float = Field(0.0, ge=0)
    """Decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas, each in [0, 1)."""
    optimizer: OptimizerName = "adamw"
    """adamw or sgd (training/update/optimizers.py)."""
    eps: float = Field(1e-8, gt=0)
    """AdamW epsilon: gradients far below it move their weights less than lr (towards SGD's behaviour)."""
    momentum: float = Field(0.0, ge=0, lt=1)
    """Heavy-ball momentum of sgd."""
    grad_clip: float = Field(1.0, ge=0)
    """Global gradient-norm clip (0 disables)."""
    mini_batch: int = Field(64, ge=1)
    """Trained nodes per optimiser step (unless mini_batches is set)."""
    mini_batches: int = Field(0, ge=0)
    """> 0: exactly this many optimiser steps per epoch, the step's trained nodes split evenly over them however
    many they are (fewer only when there are fewer nodes), so that allocators which leave more or fewer nodes
    with a non-zero advantage still take equal steps; 0: steps of ``mini_batch`` nodes."""
    micro_batch: int = Field(8, ge=1)
    """Trained nodes per forward/backward with update=rows (gradient accumulation up to `mini_batch`)."""
    update: Literal["packed", "rows"] = "packed"
    """How a forward/backward runs the trained nodes: packed (each mini-batch's rows as token tries, every shared
    prefix computed once; docs/packing.md) or rows (one padded row per node). Falls back to rows, with a
    warning, for a model that takes no custom attention mask."""
    pack_tokens: int = Field(4096, ge=1)
    """Most tokens per packed forward/backward with update=packed (a longer single row gets a pack of its own)."""
    epochs: int = Field(1, ge=1)
    """Passes over each step's nodes."""
    advantage: AdvantageMethod = "tree_grpo"
    """Advantage estimator: grpo, tree_grpo or tree_value."""
    clip_low: float = Field(0.2, gt=0, lt=1)
    """PPO clip below 1."""
    clip_high: float = Field(0.28, gt=0)
    """PPO clip above 1 (DAPO clip-higher)."""
    kl_coef: float = Field(0.0, ge=0)
    """Weight of the k3 KL to the initial policy (0: no reference model is kept)."""
    skip_zero_advantage: bool = True
    """Leave nodes with zero advantage out of the update (they add no gradient, only compute)."""
    shuffle_advantages: bool = False
    """A control, not a training setting: permute the advantages over the trained nodes before each update (the
    same values, on random nodes), so a run measures what updates of this size do without the reward's signal."""

    @model_validator(mode="after")
    def _relations(self) -> OptimConfig:
        self.check(all(0 <= b < 1 for b in self.betas), f"expected optim.betas in [0, 1), got "
                   f"{list(self.betas)}; fix: optim.betas=[0.9,0.999]")
        self.check(self.micro_batch <= self.mini_batch, f"expected 1 <= optim.micro_batch <= mini_batch, got "
                   f"{self.micro_batch}, {self.mini_batch}; fix: optim.micro_batch=8")
        return self


class EvalConfig(Section):
    """Held-out evaluation: mean success over `samples` samples of `tasks` prompts."""

    key: ClassVar[str] = "eval"

    every: int = Field(10, ge=0)
    """Evaluate every this many steps (and before the first and after the last; 0: only those two)."""
    tasks: int = Field(64, ge=0)
    """Held-out prompts (the first ones of the eval split)."""
    samples: int = Field(1, ge=1)
    """Samples per prompt."""
    temperature: float = Field(0.0, ge=0)
    """0 = greedy."""
    expert: bool = False
    """Also measure the teacher-forced probability of the env's scripted expert trajectory on the same prompts
    (a low-noise second measure; envs with a canonical expert, such as Arithmetic)."""


class CheckpointConfig(Section):
    """When to save (model, optimiser, predictor, RNG states, data position)."""

    key: ClassVar[str] = "checkpoint"

    every: int = Field(50, ge=0)
    """Save every this many steps (and at the end; 0: only at the end)."""
    keep: int = Field(2, ge=1)
    """Most recent checkpoints kept."""


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
    save_trees: TreeSteps | int = "none"
    """Which steps' trees go to trees.jsonl in the run folder: none, all, first_last, or an integer N (every
    N-th step and the last). YAML true/false read as all/none."""
    plots: bool = True
    """Write PNG plots of the metrics to the run folder's plots/ at the end of training."""

    @model_validator(mode="before")
    @classmethod
    def _tree_steps(cls, data: Any) -> Any:
        """The older boolean form of save_trees, and one message for every value that is not a policy."""
        if not isinstance(data, Mapping) or "save_trees" not in data:
            return data
        value = data["save_trees"]
        if isinstance(value, bool):
            return {**data, "save_trees": "all" if value else "none"}
        if value in get_args(TreeSteps) or (isinstance(value, int) and value >= 1):
            return data
        raise ValueError(f"expected log.save_trees none, all, first_last or a step interval N >= 1, got {value!r}; "
                         "fix: log.save_trees=first_last (or all, none, 10)")

    def saves_trees(self, step: int, last: int) -> bool:
        """Whether step `step` (1-based) of a run ending at step `last` writes its trees."""
        if self.save_trees == "all":
            return True
        if self.save_trees == "first_last":
            return step in (1, last)
        if isinstance(self.save_trees, int):
            return step % self.save_trees == 0 or step == last
        return False


class RayConfig(Section):
    """Rollout workers on Ray (`distributed: ray`): where they run and how many there are."""

    key: ClassVar[str] = "ray"

    address: str | None = None
    """An existing cluster ("auto", "ray://head:10001"); null starts a local one."""
    workers: int = Field(2, ge=1)
    """Rollout actors."""
    cpus_per_worker: float = Field(1.0, ge=0)
    """CPUs reserved per actor (its env steps)."""
    gpus_per_worker: float = Field(0.0, ge=0)
    """GPUs per actor (its vLLM engine); fractions share a GPU."""
    env_threads: int = Field(2, ge=1)
    """Threads stepping one actor's envs."""
    init: dict[str, Any] = Field(default_factory=dict)
    """Extra `ray.init` keyword arguments (num_cpus, _temp_dir, runtime_env, ...)."""


class TrainConfig(Section):
    """The whole run."""

    key: ClassVar[str] = ""

    run_dir: str = Field("runs/run", min_length=1)
    """Output folder: config, metrics, checkpoints, summary."""
    seed: int = 0
    """Seeds data order, sampling and allocation; a fixed seed on CPU makes runs exactly repeatable."""
    steps: int = Field(100, ge=0)
    """Training steps."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    alloc: AllocConfig = Field(default_factory=AllocConfig)
    predictor: PredictorConfig = Field(default_factory=PredictorConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    distributed: Literal["none", "ray"] = "none"
    """Where rollouts run: in this process ("none") or on Ray actors ("ray", see `ray`)."""
    ray: RayConfig = Field(default_factory=RayConfig)

    def to_dict(self) -> dict[str, Any]:
        """The config as nested plain data (what ``config.yaml`` holds; tuples as lists)."""
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        """Build and validate a config from nested dicts; unknown keys and wrong values raise ``ConfigError``."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"expected a mapping of settings, got {type(data).__name__} {data!r}; fix: give the "
                              "config as key: value lines")
        return cls(**data)


# --------------------------------------------------------------------------------------------- one-line errors
def one_line(model: type[Section], exc: pydantic.ValidationError) -> str:
    """The first error of ``exc`` (raised validating ``model``) as one line: the dotted key, what it expects,
    what it got, and the fix (the default, or the keys that exist)."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    owner, field_name, key = _locate(model, first["loc"])
    if field_name is None:  # the section itself: a relation between its fields, or a non-mapping given for it
        if first["type"] == "value_error":
            return str(first["ctx"]["error"])
        where = key.rstrip(".") or "the config"
        return (f"expected a mapping at {where}, got {type(first['input']).__name__} {first['input']!r}; "
                f"fix: give {where} as key: value lines")
    if first["type"] == "extra_forbidden":
        return _unknown_key(owner, field_name, key)
    if first["type"] == "value_error":
        return str(first["ctx"]["error"])
    info = owner.model_fields[field_name]
    dotted, value = f"{key}{field_name}", first["input"]
    default = info.get_default(call_default_factory=True)
    fix = f"; fix: {dotted}={_yaml(default)}"
    hint = info.annotation
    limits = {t: first["ctx"][k] for t, k in _RANGES.items() if t == first["type"] and k in first.get("ctx", {})}
    if limits:
        return f"expected {dotted} {_RANGE_WORDS[first['type']]} {next(iter(limits.values()))}, got {value!r}{fix}"
    if first["type"] == "finite_number":
        return f"expected a finite {dotted}, got {value!r}{fix}"
    if first["type"] in ("string_too_short", "string_pattern_mismatch"):
        return f"expected {dotted} as {_FIELD_WORDS.get((owner, field_name), 'a non-empty string')}, got {value!r}{fix}"
    allowed = _literal_values(hint)
    if allowed and _fits_loosely(hint, value):
        return f"expected {dotted} in {allowed}, got {value!r}{fix}"
    return f"expected {dotted} as {_describe(_loose(hint))}, got {value!r}{fix}"


_RANGES = {"greater_than": "gt", "greater_than_equal": "ge", "less_than": "lt", "less_than_equal": "le"}
_RANGE_WORDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
_FIELD_WORDS: dict[tuple[type[Section], str], str] = {(ModelConfig, "device"): "'auto', 'cpu' or 'cuda[:i]'"}


def _locate(model: type[Section], loc: Sequence[Any]) -> tuple[type[Section], str | None, str]:
    """(the section owning the failing field, the field's name or None for the section itself, its dotted
    prefix) for an error location such as ``("optim", "lr")``."""
    owner, prefix = model, f"{model.key}." if model.key else ""
    for i, part in enumerate(loc):
        if not isinstance(part, str) or part not in owner.model_fields:
            return owner, (part if isinstance(part, str) and i == len(loc) - 1 else None), prefix
        sub = owner.model_fields[part].annotation
        if isinstance(sub, type) and issubclass(sub, Section):
            owner, prefix = sub, f"{prefix}{part}."
            continue
        return owner, part, prefix
    return owner, None, prefix


def _unknown_key(owner: type[Section], name: str, prefix: str) -> str:
    near = nearest(name, owner.model_fields)
    # A key in the wrong section (`lr=...` for `optim.lr=...`): the keys of that name below this level.
    deeper = [k for k in dotted_keys(owner) if "." in k and k.rsplit(".", 1)[1] == name]
    hint = f"did you mean {prefix}{near}? " if near else \
        f"did you mean {' or '.join(prefix + k for k in deeper)}? " if deeper else ""
    return (f"expected a config key, got unknown {prefix}{name}; fix: {hint}"
            f"{'the keys of ' + prefix.rstrip('.') if prefix else 'top-level keys'} are "
            f"{', '.join(sorted(owner.model_fields))}")


def dotted_keys(model: type[Section]) -> list[str]:
    """Every leaf key of the config ``model``, dotted (``optim.lr``)."""
    out = []
    for name, info in model.model_fields.items():
        sub = info.annotation
        if isinstance(sub, type) and issubclass(sub, Section):
            out += [f"{name}.{k}" for k in dotted_keys(sub)]
        else:
            out.append(name)
    return out


@functools.cache
def choices(model: type[Section]) -> dict[str, tuple[Any, ...]]:
    """The allowed values of each field of ``model`` typed as a ``Literal`` (or ``Literal | None``)."""
    out: dict[str, tuple[Any, ...]] = {}
    for name, info in model.model_fields.items():
        members = _members(info.annotation)
        literals = [m for m in members if get_origin(m) is Literal]
        if literals and all(get_origin(m) is Literal or m is type(None) for m in members):
            out[name] = tuple(v for m in literals for v in get_args(m)) + ((None,) if type(None) in members else ())
    return out


def _literal_values(hint: Any) -> tuple[Any, ...]:
    members = _members(hint)
    values = tuple(v for m in members if get_origin(m) is Literal for v in get_args(m))
    return values + ((None,) if values and type(None) in members else ())


def _fits_loosely(hint: Any, value: Any) -> bool:
    """Whether ``value`` has a type the annotation takes (a Literal's values checked only for their type)."""
    try:
        pydantic.TypeAdapter(_loose(hint)).validate_python(value, strict=True)
    except pydantic.ValidationError:
        return False
    return True


def _loose(hint: Any) -> Any:
    """``hint`` with each Literal replaced by the types of its values."""
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
    if isinstance(value, dict):
        return "{}" if not value else str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "1.0"
    return str(value)


# --------------------------------------------------------------------------------------------- YAML files
def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` strings (value parsed as YAML) to a nested dict, in place; returns it."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"expected an override as key=value, got {item!r}; fix: e.g. optim.lr=1e-4")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        node: Any = data
        for part in parts[:-1]:
            child = _item(node, part, key) if isinstance(node, list) else node.setdefault(part, {})
            if not isinstance(child, dict | list):
                raise ConfigError(f"expected {part!r} in {key!r} to be a section, got a value; fix: check the key")
            node = child
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
            if isinstance(node, list):
                node[_index(node, parts[-1], key)] = value
            else:
                node[parts[-1]] = value
        except yaml.YAMLError as exc:
            raise ConfigError(f"expected a YAML value in {item!r}, got {type(exc).__name__}; fix: quote it, "
                              f"e.g. {key}='\"text\"'") from None
    return data


def _index(items: list[Any], part: str, key: str) -> int:
    """A list's entry in a dotted key (``env.mix.0.weight``): its index, checked."""
    if not part.isdigit() or int(part) >= len(items):
        raise ConfigError(f"expected an index below {len(items)} for {part!r} in {key!r}, got {part!r}; fix: "
                          f"{key.split('.' + part, 1)[0]}.0 ... .{len(items) - 1}, or set the whole list")
    return int(part)


def _item(items: list[Any], part: str, key: str) -> Any:
    return items[_index(items, part, key)]


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
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
