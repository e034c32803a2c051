"""Building a run's parts from its config: envs, data, the generation backend, the predictor, the collector.

Module-level functions (not methods) so that Ray workers can receive them pickled (`worker_policy`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import torch

from trace_gym.agents.policy import SamplingParams
from trace_gym.env_mix import EnvMix, env_of
from trace_gym.env_specs import spec_class
from trace_gym.errors import SetupError
from trace_gym.limits import HostNeeds, ensure_host
from trace_gym.tasks import Task
from trace_gym.training.allocation.allocators import make_allocator
from trace_gym.training.allocation.predictor import FeaturePredictor, HiddenStatePredictor, Predictor, Prefix
from trace_gym.training.allocation.predictor_wrappers import CalibratedPredictor, with_memory
from trace_gym.training.config import TrainConfig
from trace_gym.training.driver import mix
from trace_gym.training.rollout.collector import Collector, SnapshotPolicy, TreeCollector


def resolve_device(name: str) -> torch.device:
    """``model.device``: "auto" is cuda when available, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def make_policy(cfg: TrainConfig, model: torch.nn.Module, tokenizer: Any, model_path: str) -> Any:
    """The generation backend: transformers on the trained model itself, or a vLLM engine."""
    if cfg.model.backend == "hf":
        from trace_gym.agents.hf import HFPolicy

        return HFPolicy(model, tokenizer, max_batch_size=cfg.model.max_batch_size)
    try:
        import vllm  # noqa: F401 - the engine itself is imported lazily by VLLMPolicy
    except ImportError as exc:
        raise SetupError(f"expected the vllm package for model.backend=vllm, got ImportError: {exc}; fix: pip "
                         "install -e '.[vllm]' (from the checkout) or model.backend=hf") from None
    from trace_gym.agents.vllm import VLLMPolicy

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
        # The ignore: transformers wraps PreTrainedModel.to in functools.wraps(nn.Module.to), whose type keeps
        # the unbound `self` as the first parameter.
        model = model.to(resolve_device(cfg.model.device)).eval()  # type: ignore[arg-type]
    return make_policy(cfg, model, tokenizer, model_path)  # type: ignore[arg-type]


def hidden_state_fn(model: torch.nn.Module, tokenizer: Any, max_tokens: int = 1024, env_tag: bool = False
                    ) -> Callable[..., torch.Tensor]:
    """Final hidden state at the last token of a plain rendering of each prefix (HiddenStatePredictor), led by
    ``[env]`` (the env key of its namespaced task id) with ``env_tag``. The prefixes of a step share their prompts
    and early turns, so they run tree-packed (training/update/packing.py: each shared prefix computed once) where the
    model takes a custom mask, else one forward per prefix."""
    from trace_gym.training.update.packing import last_hidden_states, packing_unsupported

    packed = packing_unsupported(model) is None

    def fn(prefixes: Sequence[Prefix]) -> torch.Tensor:
        rows = []
        for p in prefixes:
            text = "\n".join([p.prompt, *(f"{a}\n{o}" for a, o in p.turns)])
            text = f"[{env_of(p.task_id)}]\n{text}" if env_tag else text
            ids = tokenizer(text, add_special_tokens=False)["input_ids"][-max_tokens:]
            rows.append(ids or [tokenizer.pad_token_id])
        with torch.no_grad():
            if packed:
                return last_hidden_states(model, rows).float().cpu()
            device = next(model.parameters()).device
            return torch.stack([model(input_ids=torch.tensor([ids], device=device), output_hidden_states=True)
                                .hidden_states[-1][0, -1].float().cpu() for ids in rows])

    return fn


def make_predictor(cfg: TrainConfig, hidden: Callable[[], tuple[Callable[..., torch.Tensor], int]],
                   tasks: Sequence[Task] = ()) -> Predictor:
    """``predictor.kind``: the text-feature model, or a head on hidden states; ``hidden()`` gives the hidden-state
    function (`hidden_state_fn`) and its width, and is called only for that kind. ``predictor.replay`` and
    ``predictor.prior_strength`` wrap it in the memory wrappers (`predictor_wrappers.with_memory`; off by
    default), and ``predictor.calibrate`` in the online recalibration (`predictor_wrappers.CalibratedPredictor`).
    With ``env.mix`` the predictor is told each prompt's env: a feature of its own (`FeaturePredictor`'s
    ``env_feature``), or the env's name leading the text the hidden state reads (`hidden_state_fn`'s ``env_tag``).
    ``predictor.logprob_features`` adds the policy's log-probs and the tiers of ``tasks`` (``meta["tier"]``) to the
    text-feature model's features."""
    p = cfg.predictor
    if p.kind == "features":
        tiers = {t.id: str(t.meta["tier"]) for t in tasks if t.meta.get("tier")}
        inner: Predictor = FeaturePredictor(lr=p.lr, steps=p.steps, env_feature=bool(cfg.env.mix),
                                            logprob_features=p.logprob_features, tiers=tiers)
    else:
        fn, size = hidden()
        inner = HiddenStatePredictor(fn, size, lr=p.lr, steps=p.steps, seed=cfg.seed)
    predictor = with_memory(inner, p.replay, p.prior_strength)
    return CalibratedPredictor(predictor) if p.calibrate else predictor


def make_collector(cfg: TrainConfig, policy: Any, make_env: Callable[[], gym.Env] | EnvMix, tasks: Sequence[Task],
                   sampling: SamplingParams, tokenizer: Any, model_path: str) -> Collector:
    """The training collector: in this process on ``policy``, or Ray workers that each build their own policy
    from ``model_path`` (`worker_policy`) and receive the trained weights through `update_weights`. Its trees
    keep native snapshots only where the allocator can branch (`SnapshotPolicy.for_allocator`)."""
    allocator = make_allocator(cfg.alloc.allocator, cfg.alloc.group_size, cfg.alloc.cap)
    budget = cfg.alloc.budget
    snapshots = SnapshotPolicy.for_allocator(allocator, budget)
    classes = [spec_class(e.id) for e in cfg.env.mix] or [spec_class(cfg.env.id)]
    footprint = mix.footprint(classes, snapshots.branching)  # the heaviest env's, with several
    if footprint is not None:  # the step's peak must fit this host: fail now with the fix, not at step 40
        ensure_host(HostNeeds.of(budget.total, footprint))
    if cfg.distributed == "ray":
        from trace_gym.training.rollout.ray_workers import RayTreeCollector

        return RayTreeCollector(functools.partial(worker_policy, cfg, model_path), make_env, tasks, sampling,
                                tokenizer, cfg.env.snapshot, cfg.rollout.max_context, ray_config=cfg.ray,
                                snapshots=snapshots)
    return TreeCollector(policy, make_env, tasks, sampling, tokenizer, cfg.env.snapshot, cfg.env.workers,
                         cfg.rollout.max_context, snapshots)
