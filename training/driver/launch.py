"""Start a data-parallel training run (`model.strategy` ddp or fsdp) on the ranks of a Ray cluster.

``torchrun --nproc-per-node N -m trace_gym.training.cli train --config ...`` is the other way in; both end in the same
`Trainer`: rank 0 leads the step, the other ranks follow its update (training/update/learner.py). Every rank reads
the run's model folders by path, so on several nodes the run directory must be on a shared filesystem.
"""

from __future__ import annotations

from typing import Any

from trace_gym.errors import ConfigError
from trace_gym.training.config import TrainConfig
from trace_gym.training.update.parallel import ray_run


def ray_train(cfg: TrainConfig, ranks: int, resume: str | None = None, gpus_per_rank: float = 0.0,
              cpus_per_rank: float = 1.0) -> dict[str, Any]:
    """Train with ``ranks`` Ray actors joined in one process group (connecting as `cfg.ray` says); returns
    rank 0's summary."""
    from trace_gym.training.rollout.ray_workers import init_ray

    if cfg.model.strategy == "single" or ranks < 1:
        raise ConfigError(f"expected ranks >= 1 and model.strategy ddp or fsdp for a Ray launch, got {ranks} and "
                          f"{cfg.model.strategy!r}; fix: model.strategy=ddp")
    init_ray(cfg.ray)
    summaries = ray_run(_train_rank, ranks, cfg.to_dict(), resume, num_gpus_per_rank=gpus_per_rank,
                        num_cpus_per_rank=cpus_per_rank)
    return summaries[0]


def _train_rank(rank: int, world_size: int, cfg: dict[str, Any], resume: str | None) -> dict[str, Any]:
    from trace_gym.training.driver.trainer import Trainer

    trainer = Trainer(TrainConfig.from_dict(cfg), resume=resume)
    try:
        return trainer.train()
    finally:
        trainer.close()
