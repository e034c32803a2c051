"""Wrappers around a success predictor (training/allocation/predictor.py), each opt-in through the run's
config (`predictor.replay`, `predictor.prior_strength`, `predictor.calibrate`; training/driver/builders.py
builds them) and none the paper's: the default predictor fits each step's fresh trees alone.

Choices where the paper is silent:
1. Memory (`with_memory`, off by default): ``ReplayPredictor`` fits its inner predictor on the
   last ``replay`` fits' examples together, and ``PromptPosterior`` values a prompt it has seen (the root
   prefix only) by a Beta posterior: the shared prediction v as a prior worth ``strength`` rollouts, updated by
   the prompt's own past outcomes (s successes of n): (strength·v + s) / (strength + n). RL revisits prompts
   every epoch, and no shared feature knows a prompt's own difficulty as well as its own past groups. On
   Arithmetic level 2 (docs/learning.md) both moved trace's root stage up by about as much as the seeds'
   spread, so they are not the default.
2. ``CalibratedPredictor`` (opt-in, ``predictor.calibrate``) recalibrates its inner predictor online: before
   each fit it records the inner predictions on the fresh examples (out of sample) with their targets, and
   maps predictions through a logistic recalibration sigmoid(a·logit + b) per depth class (roots; prefixes of
   depth >= 1), fitted by Newton's method on the last ``window`` steps' records, with a ridge towards the
   identity. Stage 2 reads prefix values where one class's miscalibration decides every 1 - q^k, and the
   text features alone give prefixes and roots one shared scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.training.allocation.predictor import Prefix, check_fit_inputs, sigmoid


class ReplayPredictor:
    """Fits ``inner`` on the examples of the last ``keep`` fits together (choice 1)."""

    def __init__(self, inner: Any, keep: int):
        if keep < 1:
            raise ConfigError(f"expected a replay of at least 1 fit, got {keep}")
        self.inner, self.keep = inner, keep
        self.buffer: list[tuple[list[Prefix], np.ndarray, np.ndarray]] = []

    def predict(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        return self.inner.predict(prefixes)

    def fit(self, prefixes: Sequence[Prefix], targets: np.ndarray, weights: np.ndarray) -> dict[str, float]:
        check_fit_inputs(prefixes, np.asarray(targets, float), np.asarray(weights, float))
        self.buffer = [*self.buffer, (list(prefixes), np.asarray(targets, float), np.asarray(weights, float))]
        self.buffer = self.buffer[-self.keep:]
        out = self.inner.fit([p for b in self.buffer for p in b[0]], np.concatenate([b[1] for b in self.buffer]),
                             np.concatenate([b[2] for b in self.buffer]))
        return {**out, "predictor/replay_examples": float(sum(len(b[0]) for b in self.buffer))}

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "replay", "inner": self.inner.state_dict(), "buffer": list(self.buffer)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "replay":
            raise ConfigError(f"expected a ReplayPredictor state, got kind {state.get('kind')!r}")
        self.inner.load_state_dict(state["inner"])
        self.buffer = list(state["buffer"])


class PromptPosterior:
    """Root values from each prompt's own past outcomes, shrunk toward ``inner``'s shared prediction
    (choice 1); deeper prefixes are ``inner``'s alone."""

    def __init__(self, inner: Any, strength: float = 4.0):
        if strength <= 0:
            raise ConfigError(f"expected a prior strength > 0 (rollouts), got {strength}")
        self.inner, self.strength = inner, strength
        self.counts: dict[str, tuple[float, float]] = {}  # task id -> (successes, rollouts) at the root

    def predict(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        v = np.asarray(self.inner.predict(prefixes), dtype=np.float64)
        out = v.copy()
        for i, p in enumerate(prefixes):
            if p.depth == 0 and p.task_id in self.counts:
                s, n = self.counts[p.task_id]
                out[i] = (self.strength * v[i] + s) / (self.strength + n)
        return out

    def fit(self, prefixes: Sequence[Prefix], targets: np.ndarray, weights: np.ndarray) -> dict[str, float]:
        t, w = np.asarray(targets, float), np.asarray(weights, float)
        check_fit_inputs(prefixes, t, w)
        for p, ti, wi in zip(prefixes, t, w):
            if p.depth == 0:  # the root's target is the mean over its wi leaves
                s, n = self.counts.get(p.task_id, (0.0, 0.0))
                self.counts[p.task_id] = (s + ti * wi, n + wi)
        return {**self.inner.fit(prefixes, t, w), "predictor/prompts_seen": float(len(self.counts))}

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "posterior", "inner": self.inner.state_dict(), "counts": dict(self.counts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "posterior":
            raise ConfigError(f"expected a PromptPosterior state, got kind {state.get('kind')!r}")
        self.inner.load_state_dict(state["inner"])
        self.counts = {k: (float(s), float(n)) for k, (s, n) in state["counts"].items()}


class CalibratedPredictor:
    """``inner``'s predictions through an online logistic recalibration per depth class (choice 2)."""

    CLASSES = ("root", "prefix")

    def __init__(self, inner: Any, window: int = 8, ridge: float = 1.0, iterations: int = 25):
        if window < 1 or ridge < 0 or iterations < 1:
            raise ConfigError(f"expected window >= 1, ridge >= 0 and iterations >= 1, got {window}, {ridge}, "
                              f"{iterations}")
        self.inner, self.window, self.ridge, self.iterations = inner, window, ridge, iterations
        self.params = {c: (1.0, 0.0) for c in self.CLASSES}  # (a, b): the identity until records exist
        self.records: list[dict[str, np.ndarray]] = []  # per fit: logit, target, weight, is_prefix

    @staticmethod
    def _logit(p: np.ndarray) -> np.ndarray:
        p = np.clip(np.asarray(p, dtype=np.float64), 1e-6, 1 - 1e-6)
        return np.log(p) - np.log1p(-p)

    def predict(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        z = self._logit(self.inner.predict(prefixes))
        deep = np.array([p.depth > 0 for p in prefixes], dtype=bool)
        a = np.where(deep, self.params["prefix"][0], self.params["root"][0])
        b = np.where(deep, self.params["prefix"][1], self.params["root"][1])
        return sigmoid(a * z + b)

    def fit(self, prefixes: Sequence[Prefix], targets: np.ndarray, weights: np.ndarray) -> dict[str, float]:
        t, w = np.asarray(targets, dtype=np.float64), np.asarray(weights, dtype=np.float64)
        check_fit_inputs(prefixes, t, w)
        if len(prefixes):  # the inner predictions before the inner fit: out of sample
            self.records = [*self.records, {"z": self._logit(self.inner.predict(prefixes)), "t": t, "w": w,
                                            "deep": np.array([p.depth > 0 for p in prefixes], dtype=bool)}]
            self.records = self.records[-self.window:]
        out = dict(self.inner.fit(prefixes, t, w))
        z, tt, ww, deep = (np.concatenate([r[k] for r in self.records]) if self.records else np.zeros(0)
                           for k in ("z", "t", "w", "deep"))
        for c, sel in (("root", deep == 0), ("prefix", deep == 1)):
            if sel.any():
                self.params[c] = self._platt(z[sel], tt[sel], ww[sel])
            out[f"predictor/calibration_{c}_a"], out[f"predictor/calibration_{c}_b"] = self.params[c]
        return out

    def _platt(self, z: np.ndarray, t: np.ndarray, w: np.ndarray) -> tuple[float, float]:
        """(a, b) minimising Σ w·BCE(sigmoid(a z + b), t) + ridge·((a - 1)² + b²), by Newton's method."""
        x = np.stack([z, np.ones_like(z)], axis=1)
        theta = np.array([1.0, 0.0])
        prior = np.array([1.0, 0.0])
        for _ in range(self.iterations):
            p = sigmoid(x @ theta)
            grad = x.T @ (w * (p - t)) + 2 * self.ridge * (theta - prior)
            hess = (x * (w * p * (1 - p))[:, None]).T @ x + 2 * self.ridge * np.eye(2) + 1e-9 * np.eye(2)
            step = np.linalg.solve(hess, grad)
            theta = theta - step
            if np.abs(step).max() < 1e-8:
                break
        return float(theta[0]), float(theta[1])

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "calibrated", "inner": self.inner.state_dict(), "params": dict(self.params),
                "records": [dict(r) for r in self.records]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "calibrated":
            raise ConfigError(f"expected a CalibratedPredictor state, got kind {state.get('kind')!r}")
        self.inner.load_state_dict(state["inner"])
        self.params = {c: (float(a), float(b)) for c, (a, b) in state["params"].items()}
        self.records = [{k: np.asarray(v) for k, v in r.items()} for r in state["records"]]


def with_memory(predictor: Any, replay: int = 0, prior_strength: float = 0.0) -> Any:
    """``predictor`` wrapped in `ReplayPredictor` (replay > 0) and then `PromptPosterior` (prior_strength > 0)."""
    if replay:
        predictor = ReplayPredictor(predictor, replay)
    if prior_strength:
        predictor = PromptPosterior(predictor, prior_strength)
    return predictor
