"""The TRACE training step as a short driver of named stages (DESIGN.md §5):

allocate roots -> bare rollouts -> plan and run continuations -> calibrate and fit the predictor ->
advantages -> policy update -> weight sync -> metrics. Every stage is a function with explicit inputs and
outputs; `Trainer` only holds the state between steps (model, optimiser, predictor, data position).

Choices where the paper is silent:
1. Each step draws `pool_size` candidate prompts in a seeded per-epoch shuffled order; prompts the allocator
   leaves out are not revisited this epoch (the data position advances by the pool).
2. Open prefixes are the non-terminal nodes of depth >= 1 after the bare rollouts; each lies on exactly one
   bare rollout, whose reward is its r. A prompt with none sends its continuation budget to the root.
3. Nodes with zero advantage are left out of the update by default (`optim.skip_zero_advantage`): they add
   no policy gradient, and the token-level normaliser counts only the trained nodes' tokens.
4. All randomness of a step (sampling seeds, uniform allocators, mini-batch order) derives from (seed, step),
   so a resumed run repeats an uninterrupted one exactly on the CPU.
5. With `distributed: ray` each rollout worker builds its own policy from the model folder (`worker_policy`) and
   receives the trained weights in the sync stage of every step; evaluation stays in this process.
"""

from __future__ import annotations

import functools
import json
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch

from trace_gym.agents.policy import SamplingParams, sample_seed
from trace_gym.errors import ConfigError
from trace_gym.tasks import Task
from trace_gym.tree import RolloutTree

from .advantages import tree_advantages
from .allocation import prefix_utility, root_utility
from .allocators import Allocator, StepBudget, expand_counts, make_allocator
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .collector import CollectStats, TreeCollector, context_ids
from .config import TrainConfig, dump_config
from .distributed import broadcast_object
from .evaluate import evaluate_policy
from .learner import Learner, Sample, join_process_group
from .logging import MetricsLogger
from .metrics import brier, calibration_metrics, rank_correlation, tree_metrics
from .predictor import FeaturePredictor, HiddenStatePredictor, Predictor, Prefix, training_examples, with_memory

if TYPE_CHECKING:
    from .ray_workers import RayTreeCollector


# --------------------------------------------------------------------------------------------- stages
def root_values(allocator: Allocator, predictor: Predictor, pool: Sequence[Task]) -> np.ndarray | None:
    """The predictor's Ṽ of each candidate prompt, or None when the allocator chooses prompts without it."""
    if not allocator.needs_root_values:
        return None
    return predictor.predict([Prefix(t.id, t.prompt) for t in pool])


def allocate_roots(allocator: Allocator, predictor: Predictor, pool: Sequence[Task], budget: StepBudget,
                   rng: np.random.Generator, values: np.ndarray | None = None
                   ) -> tuple[dict[str, int], dict[str, float]]:
    """Stage 1: {task id: m_i} over the candidate pool, and alloc/ metrics. ``values``: `root_values` of the
    pool when already computed (else computed here)."""
    if values is None:
        values = root_values(allocator, predictor, pool)
    if values is None:
        values = np.full(len(pool), 0.5)
    chosen = allocator.allocate_roots(values, allocator.root_budget(budget), rng)
    counts = {pool[i].id: m for i, m in sorted(chosen.items())}
    picked = np.array([values[i] for i in sorted(chosen)]) if chosen else np.zeros(0)
    return counts, {"alloc/pool": float(len(pool)), "alloc/prompts": float(len(counts)),
                    "alloc/roots": float(sum(counts.values())),
                    "alloc/pool_value_mean": float(np.mean(values)) if len(values) else float("nan"),
                    "alloc/chosen_value_mean": float(picked.mean()) if len(picked) else float("nan")}


def annotate_roots(trees: Mapping[str, RolloutTree], pool: Sequence[Task], values: np.ndarray | None,
                   roots: Mapping[str, int]) -> None:
    """Root meta for the viewer (viewer.py): ``predicted`` (when stage 1 used the predictor) and ``alloc``, the
    stage-1 decision: m_i root rollouts with utility U_root(v, m_i) (None when no value was predicted)."""
    by_id = {t.id: float(v) for t, v in zip(pool, values)} if values is not None else {}
    for tid, tree in trees.items():
        m, v = int(roots.get(tid, 0)), by_id.get(tid)
        if v is not None:
            tree.root.meta["predicted"] = v
        utility = float(root_utility(min(max(v, 0.0), 1.0), m)) if v is not None else None
        tree.root.meta["alloc"] = {"continuations": m, "utility": utility, "stage": "root"}


def trees_by_index(trees: Mapping[str, RolloutTree], pool: Sequence[Task]) -> dict[int, RolloutTree]:
    """{pool index: tree} of the step's prompts, for allocators that learn from outcomes (`Allocator.observe`)."""
    return {i: trees[t.id] for i, t in enumerate(pool) if t.id in trees}


def open_prefixes(tree: RolloutTree) -> list[int]:
    """Non-terminal nodes of depth >= 1 (after bare rollouts: each lies on one rollout)."""
    return [n.id for n in tree.nodes if n.depth >= 1 and not n.is_terminal]


def plan_continuations(allocator: Allocator, predictor: Predictor, trees: Mapping[str, RolloutTree],
                       roots: Mapping[str, int], budget: StepBudget,
                       rng: np.random.Generator) -> tuple[dict[tuple[str, int], int], dict[str, float]]:
    """Stage 2: {(task id, node id): k} spending prefix_budget(m_i) per prompt, and alloc/ metrics. Writes the
    viewer's node meta (viewer.py): ``predicted`` Ṽ of each open prefix (when stage 2 used the predictor) and
    ``alloc`` = {continuations: k, utility: 1 - q^k (None without predictions), stage: "prefix"} where k > 0."""
    plan: dict[tuple[str, int], int] = {}
    extra = 0
    for tid, tree in trees.items():
        b = allocator.prefix_budget(roots[tid], budget)
        if b == 0:
            continue
        nodes = open_prefixes(tree)
        rewards = np.clip([tree.value(n) or 0.0 for n in nodes], 0.0, 1.0)
        predicted = bool(allocator.needs_prefix_values and nodes)
        if predicted:
            values = predictor.predict([Prefix.from_tree(tree, n) for n in nodes])
        else:
            values = np.full(len(nodes), 0.5)
        counts, root_extra = expand_counts(allocator, np.asarray(rewards, float), values, b, rng)
        utilities = prefix_utility(rewards, np.clip(values, 0.0, 1.0), counts) if predicted else None
        for j, (n, v, k) in enumerate(zip(nodes, values, counts)):
            if predicted:
                tree[n].meta["predicted"] = float(v)
            if k:
                plan[(tid, n)] = int(k)
                utility = float(utilities[j]) if utilities is not None else None
                tree[n].meta["alloc"] = {"continuations": int(k), "utility": utility, "stage": "prefix"}
        if root_extra:
            plan[(tid, 0)] = plan.get((tid, 0), 0) + root_extra
            tree.root.meta["root_extra"] = int(root_extra)  # stage-2 budget spent at the root: no open prefix
            extra += root_extra
    return plan, {"alloc/continuations": float(sum(plan.values())), "alloc/root_extra": float(extra),
                  "alloc/branch_points": float(len(plan))}


def fit_predictor(predictor: Predictor, trees: Sequence[RolloutTree]) -> dict[str, Any]:
    """Targets V̂ of the fresh trees; calibration of the current predictor on them, then one fit."""
    prefixes, targets, weights = training_examples(trees)
    if not prefixes:
        return {"predictor/examples": 0.0}
    pred = predictor.predict(prefixes)
    out: dict[str, Any] = calibration_metrics(pred, targets, weights)
    # Roots alone: does the predictor rank this step's prompts? (what stage 1 needs; deeper prefixes are easier)
    roots = np.array([p.depth == 0 for p in prefixes])
    out["predictor/root_brier"] = brier(pred[roots], targets[roots], weights[roots]) if roots.any() else float("nan")
    out["predictor/root_rank_corr"] = rank_correlation(pred[roots], targets[roots])
    out.update(predictor.fit(prefixes, targets, weights))
    return out


def build_samples(trees: Sequence[RolloutTree], method: str, skip_zero: bool = True) -> list[Sample]:
    """One sample per trained node with recorded tokens and logprobs (each node once, deviation 3)."""
    out = []
    for tree in trees:
        for node_id, adv in tree_advantages(tree, method).items():  # type: ignore[arg-type]
            node = tree[node_id]
            node.meta["advantage"] = adv
            if not node.token_ids or not node.logprobs or (skip_zero and abs(adv) < 1e-8):
                continue
            out.append(Sample(context_ids(tree, node_id), list(node.token_ids), list(node.logprobs), adv))
    return out



# --------------------------------------------------------------------------------------------- data
class TaskStream:
    """Training prompts in a seeded shuffled order per epoch; `position` is all the state there is."""

    def __init__(self, tasks: Sequence[Task], seed: int, position: int = 0):
        if not tasks:
            raise ConfigError("expected a non-empty training set, got none; fix: check env.kwargs")
        self.tasks, self.seed, self.position = list(tasks), seed, position
        self._epoch, self._order = -1, np.zeros(0, dtype=np.int64)

    def take(self, n: int) -> list[Task]:
        out = []
        for _ in range(n):
            epoch, i = divmod(self.position, len(self.tasks))
            if epoch != self._epoch:
                self._epoch, self._order = epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self.tasks))
            out.append(self.tasks[int(self._order[i])])
            self.position += 1
        return out


# --------------------------------------------------------------------------------------------- setup
def warm_start(cfg: TrainConfig, make_env: Callable[[], gym.Env], console: Any = None) -> str:
    """The model folder RL starts from: builds the tiny model when asked and absent, then runs SFT on
    scripted-expert episodes when asked and `sft.output` holds no model yet."""
    base = Path(cfg.model.path)
    if not (base / "config.json").is_file():
        if cfg.model.init_size is None:
            raise ConfigError(f"expected a model folder at model.path={str(base)!r}, got none; fix: point "
                              "model.path at a local model or set model.init_size=tiny to build the tiny model")
        from trace_gym.agents.tiny import build_tiny_model

        _say(console, f"building the {cfg.model.init_size} model at {base}")
        build_tiny_model(base, size=cfg.model.init_size, seed=cfg.seed)
    if not cfg.sft.enabled:
        return str(base)
    out = Path(cfg.sft.output)
    if (out / "config.json").is_file():
        return str(out)
    from trace_gym.agents.sft import SFTConfig, collect_expert_episodes, sft

    _say(console, f"warm start: SFT on {cfg.sft.episodes} scripted-expert episodes -> {out}")
    data = collect_expert_episodes(make_env, cfg.sft.episodes, noise=cfg.sft.noise, seed=cfg.seed)
    sft(base, data, out, SFTConfig(steps=cfg.sft.steps, batch_size=cfg.sft.batch_size, lr=cfg.sft.lr,
                                   seed=cfg.seed), progress=console is not None)
    return str(out)


def plot_at_end(run_dir: Path, console: Any = None) -> list[Path]:
    """PNG plots of a finished run (training.plots); a failure is reported (console, else a warning), not
    raised: the run's results are already on disk and `trace-gym plot RUN_DIR` can retry."""
    try:
        from .plots import plot_run

        return plot_run(run_dir)
    except Exception as exc:  # any plotting failure (missing matplotlib, disk, odd rows) is not the run's
        text = f"plots of {run_dir} skipped: {type(exc).__name__}: {exc}; retry with `trace-gym plot {run_dir}`"
        if console is not None:
            console.print(text)
        else:
            warnings.warn(text, RuntimeWarning, stacklevel=2)
        return []


def _say(console: Any, text: str) -> None:
    if console is not None:
        console.print(text)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def make_env_factory(env_id: str, kwargs: Mapping[str, Any]) -> Callable[[], gym.Env]:
    import trace_gym  # noqa: F401 - registers the trace/* ids

    if ":" in env_id and "/" not in env_id.split(":", 1)[1]:  # an entry point "module:Class" (unregistered env)
        spec = gym.envs.registration.EnvSpec(id=env_id.split(":", 1)[1] + "-v0", entry_point=env_id)
        return lambda: gym.make(spec, **dict(kwargs))
    if env_id not in gym.registry and not (":" in env_id and env_id.split(":", 1)[1] in gym.registry):
        raise ConfigError(f"expected a registered env id, got {env_id!r}; fix: one of "
                          f"{sorted(k for k in gym.registry if k.startswith('trace/'))}")
    return lambda: gym.make(env_id, **dict(kwargs))


def dataset_of(make_env: Callable[[], gym.Env]) -> list[Task]:
    env = make_env()
    try:
        return list(env.unwrapped.tasks)  # type: ignore[attr-defined]
    finally:
        env.close()


def make_policy(cfg: TrainConfig, model: torch.nn.Module, tokenizer: Any, model_path: str) -> Any:
    """The generation backend: transformers on the trained model itself, or a vLLM engine."""
    if cfg.model.backend == "hf":
        from trace_gym.agents.hf import HFPolicy

        return HFPolicy(model, tokenizer, max_batch_size=cfg.model.max_batch_size)
    try:
        from trace_gym.agents.vllm import VLLMPolicy
    except ImportError as exc:
        raise ConfigError(f"expected the vLLM backend (trace_gym.agents.vllm and the vllm package), got "
                          f"ImportError: {exc}; fix: pip install 'trace-gym[vllm]' or model.backend=hf") from None
    return VLLMPolicy.from_pretrained(model_path, dtype="bfloat16" if cfg.model.bf16 else "auto",
                                      max_model_len=cfg.rollout.max_context, seed=cfg.seed,
                                      gpu_memory_utilization=cfg.model.vllm_gpu_memory_utilization)


def worker_policy(cfg: TrainConfig, model_path: str) -> Any:
    """The generation backend of a Ray rollout worker: `make_policy` on its own copy of the model at
    `model_path` (hf) or its own vLLM engine; a module-level function so that it pickles."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = None
    if cfg.model.backend == "hf":
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        model = model.to(resolve_device(cfg.model.device)).eval()
    return make_policy(cfg, model, tokenizer, model_path)  # type: ignore[arg-type]


def hidden_state_fn(model: torch.nn.Module, tokenizer: Any, max_tokens: int = 1024) -> Callable[..., torch.Tensor]:
    """Final hidden state at the last token of a plain rendering of each prefix (HiddenStatePredictor)."""

    def fn(prefixes: Sequence[Prefix]) -> torch.Tensor:
        device = next(model.parameters()).device
        rows = []
        for p in prefixes:
            text = "\n".join([p.prompt, *(f"{a}\n{o}" for a, o in p.turns)])
            ids = tokenizer(text, add_special_tokens=False)["input_ids"][-max_tokens:] or [tokenizer.pad_token_id]
            out = model(input_ids=torch.tensor([ids], device=device), output_hidden_states=True)
            rows.append(out.hidden_states[-1][0, -1].float().cpu())
        return torch.stack(rows)

    return fn


class Trainer:
    """Holds what lives across steps; `step()` runs the stages once, `train()` runs the loop."""

    def __init__(self, cfg: TrainConfig, resume: str | Path | None = None, console: Any = None):
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # weight loading/saving bars would break the step progress bar
        self.cfg, self.console = cfg, console
        self.run_dir = Path(cfg.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.device = resolve_device(cfg.model.device)
        torch.manual_seed(cfg.seed)
        self.make_env = make_env_factory(cfg.env.id, cfg.env.kwargs)
        self.make_eval_env = make_env_factory(cfg.env.id, {**cfg.env.kwargs, **cfg.env.eval_kwargs})
        rank, _ = join_process_group(cfg.model.strategy)
        self.lead = rank == 0  # rank 0 runs the step; other ranks only join the update (training/learner.py)
        state, model_path = None, None
        if self.lead:
            ckpt = latest_checkpoint(resume) if resume is not None else None
            if resume is not None and ckpt is None:
                raise ConfigError(f"expected a run folder with checkpoints to resume, got {str(resume)!r}; "
                                  "fix: pass the run_dir of a run that saved a checkpoint")
            if ckpt is not None:
                state = load_checkpoint(ckpt)
                model_path = str(ckpt / "model")
            else:
                model_path = warm_start(cfg, self.make_env, console)
        model_path, optimizer_state = broadcast_object((model_path, state and state["optimizer"]))
        self.model_path = model_path
        self.sampling = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                       max_new_tokens=cfg.rollout.max_new_tokens)
        self.learner = Learner(cfg, model_path, self.device, self.sampling.logprob_temperature, optimizer_state)
        self.step_count = 0
        if not self.lead:
            return
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        # The generation backend shares the trained model when it can, else holds its own copy or engine.
        self.policy = (make_policy(cfg, self.learner.model, self.tokenizer, model_path)
                       if self.learner.shares_weights else worker_policy(cfg, model_path))
        self.predictor: Predictor = with_memory(
            FeaturePredictor(lr=cfg.predictor.lr, steps=cfg.predictor.steps) if cfg.predictor.kind == "features"
            else HiddenStatePredictor(hidden_state_fn(self._features_model(), self.tokenizer),
                                      self.learner.config.hidden_size,
                                      lr=cfg.predictor.lr, steps=cfg.predictor.steps, seed=cfg.seed),
            cfg.predictor.replay, cfg.predictor.prior_strength)
        self.allocator = make_allocator(cfg.alloc.allocator, cfg.alloc.group_size, cfg.alloc.cap)
        self.budget = StepBudget(cfg.alloc.roots, cfg.alloc.multiplier)
        self.stream = TaskStream(dataset_of(self.make_env), cfg.seed)
        if cfg.alloc.pool_size > len(self.stream.tasks):
            raise ConfigError(f"expected alloc.pool_size <= the {len(self.stream.tasks)} training prompts, got "
                              f"{cfg.alloc.pool_size}; fix: alloc.pool_size={len(self.stream.tasks)} or more data")
        self.collector: TreeCollector | RayTreeCollector
        if cfg.distributed == "ray":
            from .ray_workers import RayTreeCollector

            # Workers build their own policy from the model folder; weights follow in the sync stage.
            self.collector = RayTreeCollector(functools.partial(worker_policy, cfg, model_path), self.make_env,
                                              self.stream.tasks, self.sampling, self.tokenizer, cfg.env.snapshot,
                                              cfg.rollout.max_context, ray_config=cfg.ray)
        else:
            self.collector = TreeCollector(self.policy, self.make_env, self.stream.tasks, self.sampling,
                                           self.tokenizer, cfg.env.snapshot, cfg.env.workers,
                                           cfg.rollout.max_context)
        self.history: dict[str, Any] = {"eval": [], "effective_ratio": [], "trajectories": 0, "tokens": 0}
        if state is not None:
            self._load_state(state)
        dump_config(cfg, self.run_dir / "config.yaml")
        # A resumed run keeps its rows up to the checkpoint; a fresh run in a used folder starts a new file.
        self.logger = MetricsLogger(self.run_dir, cfg.log, cfg.to_dict(),
                                    truncate_after=self.step_count if state is not None else -1)

    # ----------------------------------------------------------------- one step
    def step(self) -> dict[str, Any]:
        """Allocate, roll out, expand, fit the predictor, compute advantages, update, sync; returns metrics."""
        cfg, step = self.cfg, self.step_count + 1
        rng = np.random.default_rng([cfg.seed, step])
        timer = _Timer()
        metrics: dict[str, Any] = {}

        with timer("allocate"):
            pool = self.stream.take(cfg.alloc.pool_size)
            values = root_values(self.allocator, self.predictor, pool)
            roots, m = allocate_roots(self.allocator, self.predictor, pool, self.budget, rng, values)
            metrics.update(m)
        self.collector.begin_step()
        stats = CollectStats()
        with timer("rollout"):
            stats += self.collector.bare_rollouts(roots, seed=sample_seed(cfg.seed, step, 0))
        annotate_roots(self.collector.trees, pool, values, roots)
        with timer("expand"):
            plan, m = plan_continuations(self.allocator, self.predictor, self.collector.trees, roots, self.budget,
                                         rng)
            metrics.update(m)
            stats += self.collector.continuations(plan, seed=sample_seed(cfg.seed, step, 1))
        trees = list(self.collector.trees.values())
        metrics.update(self.allocator.observe(trees_by_index(self.collector.trees, pool)))
        metrics.update(stats.metrics("rollout/"))
        metrics["alloc/budget"] = float(stats.trajectories)
        metrics.update(tree_metrics(trees, cfg.optim.advantage))  # type: ignore[arg-type]
        with timer("predictor"):
            metrics.update(fit_predictor(self.predictor, trees))
        with timer("update"):
            samples = build_samples(trees, cfg.optim.advantage, cfg.optim.skip_zero_advantage)
            metrics.update(self.learner.update(samples, sample_seed(cfg.seed, step, 2) or 0,
                                               self.tokenizer.pad_token_id))
        with timer("sync"):
            self.sync_weights()
        self.step_count = step
        if cfg.log.saves_trees(step, cfg.steps):
            with open(self.run_dir / "trees.jsonl", "a") as f:
                f.writelines(json.dumps({"step": step, **t.to_dict()}) + "\n" for t in trees)
        if cfg.eval.every and step % cfg.eval.every == 0 and step != cfg.steps:
            with timer("eval"):
                metrics.update(self.evaluate())
        metrics.update(timer.metrics())
        metrics["data/position"] = float(self.stream.position)
        self.history["effective_ratio"].append(metrics.get("alloc/effective_ratio", float("nan")))
        self.history["trajectories"] += stats.trajectories
        self.history["tokens"] += stats.generated_tokens
        return metrics

    def sync_weights(self) -> None:
        """Push the trained weights to every generation backend that does not share the trained model."""
        own_engine = not (self.learner.shares_weights and self.cfg.model.backend == "hf")
        if not own_engine and self.cfg.distributed != "ray":
            return
        weights = self.learner.weights()
        assert weights is not None  # on the lead
        if own_engine:
            self.policy.update_weights(weights)
        if self.cfg.distributed == "ray":
            self.collector.update_weights(weights)  # type: ignore[union-attr]

    def _features_model(self) -> torch.nn.Module:
        """The model the hidden-state predictor reads: the hf backend's, else one this process can run."""
        model = getattr(self.policy, "model", None)
        return model if isinstance(model, torch.nn.Module) else self.learner.local_model()

    @property
    def model(self) -> torch.nn.Module:
        """The trained Hugging Face model of this rank (a LoRA model when model.lora_r > 0)."""
        return self.learner.model

    def evaluate(self) -> dict[str, float]:
        """Mean success over `eval.samples` samples of the first `eval.tasks` held-out prompts."""
        cfg = self.cfg
        if cfg.eval.tasks == 0:
            return {}
        out = evaluate_policy(self.policy, self.make_eval_env, dataset_of(self.make_eval_env)[:cfg.eval.tasks],
                              cfg.eval.samples, cfg.eval.temperature, cfg.rollout.max_new_tokens, cfg.seed,
                              self.tokenizer, cfg.rollout.max_context)
        self.history["eval"].append((self.step_count, out["eval/success"]))
        return out

    # ----------------------------------------------------------------- the loop
    def train(self) -> dict[str, Any]:
        """Run up to `cfg.steps` steps with evaluation, checkpoints and progress; returns the summary."""
        cfg = self.cfg
        if not self.lead:
            self.learner.follow()
            return {}
        t_start = time.perf_counter()
        if self.step_count == 0 and cfg.eval.tasks:
            first = self.evaluate()
            self.logger.log(0, first)
        with _Progress(cfg.log.progress and self.console is not None, cfg.steps, self.step_count,
                       self.console) as bar:
            while self.step_count < cfg.steps:
                metrics = self.step()
                last = self.step_count == cfg.steps
                if last and cfg.eval.tasks:
                    metrics.update(self.evaluate())
                self.logger.log(self.step_count, metrics)
                if last or (cfg.checkpoint.every and self.step_count % cfg.checkpoint.every == 0):
                    save_checkpoint(self.run_dir, self.step_count, self.learner.save, self.tokenizer,
                                    self.predictor, self._state(), keep=cfg.checkpoint.keep)
                bar(metrics)
        summary = self.summary(time.perf_counter() - t_start)
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if cfg.log.plots:
            plot_at_end(self.run_dir, self.console)
        return summary

    def summary(self, wall_s: float) -> dict[str, Any]:
        ev = self.history["eval"]
        ratios = [r for r in self.history["effective_ratio"] if not math.isnan(r)]
        return {
            "run_dir": str(self.run_dir), "steps": self.step_count, "allocator": self.cfg.alloc.allocator,
            "success_before": ev[0][1] if ev else None, "success_after": ev[-1][1] if ev else None,
            "eval": ev, "effective_ratio_mean": float(np.mean(ratios)) if ratios else None,
            "effective_ratio_first": ratios[0] if ratios else None,
            "effective_ratio_last": ratios[-1] if ratios else None,
            "trajectories_per_step": self.budget.total, "trajectories": self.history["trajectories"],
            "generated_tokens": self.history["tokens"], "wall_s": wall_s,
        }

    def close(self) -> None:
        """Release the followers, the rollout workers and the log (the lead); nothing to do on followers."""
        if not self.lead:
            return
        self.learner.stop()
        self.collector.close()
        self.logger.close()

    # ----------------------------------------------------------------- checkpoint state
    def _state(self) -> dict[str, Any]:
        return {"step": self.step_count, "data_position": self.stream.position, "history": self.history,
                "allocator": self.allocator.state_dict()}

    def _load_state(self, state: Mapping[str, Any]) -> None:
        self.predictor.load_state_dict(state["predictor"])
        self.step_count = int(state["trainer"]["step"])
        self.stream.position = int(state["trainer"]["data_position"])
        self.history = state["trainer"]["history"]
        self.allocator.load_state_dict(state["trainer"].get("allocator", {}))
        torch.set_rng_state(state["rng"]["torch"])
        np.random.set_state(state["rng"]["numpy"])


class _Timer:
    """`with timer("stage"):` accumulates time/<stage>_s."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.t0 = time.perf_counter()

    def __call__(self, name: str) -> _Timer:
        self._name, self._start = name, time.perf_counter()
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self.times[self._name] = self.times.get(self._name, 0.0) + time.perf_counter() - self._start

    def metrics(self) -> dict[str, float]:
        out = {f"time/{k}_s": v for k, v in self.times.items()}
        out["time/step_s"] = time.perf_counter() - self.t0
        return out


class _Progress:
    """A rich progress bar over steps showing a few headline metrics, or nothing."""

    KEYS = (("rollout/success", "succ"), ("alloc/effective_ratio", "eff"), ("eval/success", "eval"))

    def __init__(self, enabled: bool, total: int, done: int, console: Any):
        self.enabled, self.total, self.done, self.console = enabled, total, done, console
        self.shown: dict[str, float] = {}

    def __enter__(self) -> Callable[[Mapping[str, Any]], None]:
        if not self.enabled:
            return lambda metrics: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                            TimeRemainingColumn(), console=self.console)
        self.bar.start()
        self.task = self.bar.add_task("train", total=self.total, completed=self.done, info="")
        return self._advance

    def _advance(self, metrics: Mapping[str, Any]) -> None:
        for key, short in self.KEYS:
            if key in metrics and isinstance(metrics[key], float) and not math.isnan(metrics[key]):
                self.shown[short] = metrics[key]
        info = "  ".join(f"{k} {v:.3f}" for k, v in self.shown.items())
        self.bar.update(self.task, advance=1, info=info)

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.bar.stop()
