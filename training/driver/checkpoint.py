"""Checkpoints: model (a loadable model folder), optimiser, predictor, RNG states, trainer state.

Layout: ``RUN_DIR/checkpoints/step_000010/{model/, state.pt}``; a checkpoint is written to a temporary
folder and renamed, so a crash never leaves a half-written one that `latest_checkpoint` would pick.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trace_gym.errors import ConfigError

_PREFIX = "step_"


def save_checkpoint(run_dir: str | Path, step: int, save_model: Callable[[Path], dict[str, Any] | None],
                    tokenizer: Any, predictor: Any, trainer_state: dict[str, Any], keep: int = 2) -> Path:
    """Write checkpoint `step` and delete all but the `keep` most recent; returns its folder.

    ``save_model(folder)`` writes the model folder and returns the optimiser state to keep (`Learner.save`).
    """
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{_PREFIX}{step:06d}"
    tmp = root / f".tmp-{_PREFIX}{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    optimizer = save_model(tmp / "model")
    tokenizer.save_pretrained(tmp / "model")
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save({"optimizer": optimizer, "predictor": predictor.state_dict(), "rng": rng,
                "trainer": trainer_state}, tmp / "state.pt")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith(_PREFIX) and (p / "state.pt").is_file())


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = checkpoints(run_dir)
    return found[-1] if found else None


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """The state dict of a checkpoint folder (its model is loaded from ``path/model`` by the caller)."""
    state_file = Path(path) / "state.pt"
    if not state_file.is_file():
        raise ConfigError(f"expected a checkpoint folder with state.pt, got {str(path)!r}; "
                          "fix: pass RUN_DIR or RUN_DIR/checkpoints/step_N")
    # Our own file: it holds numpy arrays and Python RNG tuples, which the weights-only loader refuses.
    state = torch.load(state_file, weights_only=False)
    random.setstate(state["rng"]["python"])
    if "cuda" in state["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return state
