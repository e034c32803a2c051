"""Success predictors Ṽψ(H) for any prefix (the prompt alone is the root prefix); used only for allocation.

Deviations and choices where the paper is silent:
1. Loss: weighted cross-entropy on the soft targets V̂ (the paper reports MSE): both are minimised by the
   mean leaf reward, and cross-entropy keeps a logistic model convex. Weights are leaf counts n_y, so a
   target averaged over many leaves counts more than a single rollout's 0/1.
2. The default predictor is a logistic regression on hashed text features (task id, prompt words, symbols
   and bigrams, the prompt's size class, the last turn's action and observation words, depth, error-turn
   counts, whether an answer was given, and task id × depth × error count): cheap, needs no GPU, learns
   per-prompt difficulty from the recurring task id, and carries it to unseen prompts through the shared
   features. Symbols and size matter: with words only, "Compute 3 + 45." and "Compute 3 * 4 - 45." shared
   no feature telling one operator from two.
3. Each ``fit`` call runs a fixed number of full-batch Adam steps from the current weights (online
   learning across training steps, no replay buffer). Adam moves a weight by about lr per step whatever the
   gradient's size, so one fit moves it by at most about lr x steps = 0.6 logits at the default lr 0.01. At
   0.05 each fit overwrote shared features with the last (self-selected) batch; benchmarks/allocation.py
   measured the simulation's effective ratio under trace at 0.63 with lr 0.05 and 0.82 with lr 0.01.
4. The hidden-state predictor is a LayerNorm + linear head on the policy's final hidden state at the
   prefix's last token, read without gradient into the policy (the head never changes the policy).
5. The predictor wrappers (replay of past fits, a per-prompt posterior, online recalibration) are
   training/allocation/predictor_wrappers.py's; the run's config chooses them (`predictor.replay`,
   `predictor.prior_strength`, `predictor.calibrate`).
6. Targets (`training_examples`): ``leaves`` is the paper's V̂, the mean leaf reward below a node, weighted by
   the leaf count. Continuations are chosen where an outcome looked likely to flip, so at an ancestor of an
   expanded prefix they outnumber the other branches and pull its target towards the surprising outcome.
   ``children`` (opt-in) averages a node's children's targets instead, each child once (a child is one draw of
   the policy from the node), weighted by the number of children: an expanded subtree then counts once at
   its ancestors.
7. Resolution features (opt-in, ``logprob_features``; `predictor.logprob_features`): the policy's own log-probs
   of the actions it sampled (per turn: sum, mean and min over the action's tokens, `Prefix.logprobs`) in
   half-octave bins of their magnitude, for the last turn and the path so far, each alone and crossed with the
   depth; and the task's tier (``tiers``: task id -> ``meta["tier"]``; a tree knows only its task id), alone, by
   depth and crossed with the last turn's bins. The text shows what was written, not whether the policy was
   sure of it: a copied number the policy hesitated over is more often wrong. Bins, not values, so that a
   logistic model can give each confidence band its own weight. NaN log-probs are dropped and -inf is clipped
   at -50; a turn without log-probs gives no feature. Off by default: its features would move every value.
"""

from __future__ import annotations

import itertools
import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from trace_gym.env_mix import env_of
from trace_gym.errors import ConfigError
from trace_gym.tree_stats import tree_arrays, tree_values

_WORD = re.compile(r"\w+|[^\w\s]")  # words and single symbols: operators and brackets carry difficulty
_LOGPROB_FLOOR = -50.0  # where -inf (a token the sampler should never have drawn) is clipped

TurnLogprobs = tuple[float, float, float]
"""One action's log-probability summary: (sum, mean, min) over its sampled tokens."""


def logprob_summary(logprobs: Sequence[float] | None) -> TurnLogprobs | None:
    """(sum, mean, min) of an action's token log-probs, NaN dropped and -inf clipped at -50 (deviation 7);
    None when none is left."""
    x = np.asarray(logprobs if logprobs is not None else [], dtype=np.float64)
    x = np.clip(x[~np.isnan(x)], _LOGPROB_FLOOR, 0.0)
    if len(x) == 0:
        return None
    return float(x.sum()), float(x.mean()), float(x.min())


@dataclass(frozen=True)
class Prefix:
    """A history H: the task's prompt and the (action, observation) turns played so far."""

    task_id: str
    prompt: str
    turns: tuple[tuple[str, str], ...] = ()  # (action, observation) per turn
    errors: tuple[bool, ...] = ()  # per turn: the env flagged a model mistake (info["error"])
    logprobs: tuple[TurnLogprobs | None, ...] = ()  # per turn: the sampled action's log-probs (deviation 7)

    @property
    def depth(self) -> int:
        return len(self.turns)

    @classmethod
    def from_tree(cls, tree: Any, node_id: int) -> Prefix:
        """The prefix ending at ``node_id`` of a ``RolloutTree`` (root = prompt alone)."""
        path = tree.path(node_id)
        turns = tuple((n.action or "", n.observation) for n in path[1:])
        errors = tuple(bool(n.info.get("error")) for n in path[1:])
        logprobs = tuple(logprob_summary(n.logprobs) for n in path[1:])
        return cls(str(tree.task_id), path[0].observation, turns, errors,
                   logprobs if any(s is not None for s in logprobs) else ())


class Predictor(Protocol):
    """Contract: ``predict`` returns success probabilities in [0, 1], one per prefix, and never raises on
    unusual text; ``fit`` takes soft targets in [0, 1] and non-negative weights and returns namespaced stats;
    ``state_dict``/``load_state_dict`` round-trip everything ``predict`` depends on."""

    def predict(self, prefixes: Sequence[Prefix]) -> np.ndarray: ...

    def fit(self, prefixes: Sequence[Prefix], targets: np.ndarray, weights: np.ndarray) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def children_values(tree: Any) -> tuple[np.ndarray, np.ndarray]:
    """(target, weight) per node in creation order (deviation 6, ``children``): a finished leaf's reward with
    weight 1; an inner node's mean over its children that have a finished leaf, weighted by their number; NaN
    and 0 where no child has one."""
    a = tree_arrays(tree)
    n = len(a.parents)
    sums, kids = np.zeros(n), np.zeros(n)
    values = np.where(a.is_leaf, a.rewards, np.nan)
    for i in range(n - 1, -1, -1):  # children come after their parents: each is final when its parent reads it
        if not a.is_leaf[i]:
            values[i] = sums[i] / kids[i] if kids[i] > 0 else np.nan
        if i and np.isfinite(values[i]):
            sums[a.parents[i]] += values[i]
            kids[a.parents[i]] += 1
    return values, np.where(a.is_leaf, 1.0, kids)


def training_examples(trees: Sequence[Any], target: str = "leaves") -> tuple[list[Prefix], np.ndarray, np.ndarray]:
    """(prefixes, targets, weights) for every non-terminal node with a finished leaf below it: V̂ and leaf counts
    n_y (``leaves``), or children's means and child counts (``children``, deviation 6)."""
    if target not in ("leaves", "children"):
        raise ConfigError(f"expected a target 'leaves' or 'children', got {target!r}")
    prefixes: list[Prefix] = []
    targets: list[float] = []
    weights: list[float] = []
    for tree in trees:
        values, counts = tree_values(tree)
        if target == "children":
            values, counts = children_values(tree)
        for n in tree.nodes:
            if not n.is_terminal and counts[n.id] > 0:
                prefixes.append(Prefix.from_tree(tree, n.id))
                targets.append(float(values[n.id]))
                weights.append(float(counts[n.id]))
    return prefixes, np.array(targets), np.array(weights)


def check_fit_inputs(prefixes: Sequence[Prefix], targets: np.ndarray, weights: np.ndarray) -> None:
    """A fit's inputs as the `Predictor` contract has them (one length; targets in [0, 1], weights >= 0)."""
    if len(prefixes) != len(targets) or len(targets) != len(weights):
        raise ValueError(f"expected prefixes, targets and weights of one length, got {len(prefixes)}, "
                          f"{len(targets)}, {len(weights)}")
    if np.any((targets < 0) | (targets > 1)) or np.any(weights < 0):
        raise ValueError("expected targets in [0, 1] and weights >= 0; fix: pass V̂ and leaf counts")


def sigmoid(x: np.ndarray) -> np.ndarray:
    """The logistic function, clipped where exp would overflow."""
    return 1.0 / (1.0 + np.exp(-np.clip(x, -40.0, 40.0)))


def _soft_bce(p: np.ndarray, t: np.ndarray, w: np.ndarray) -> float:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(np.sum(w * -(t * np.log(p) + (1 - t) * np.log(1 - p))) / max(float(w.sum()), 1e-12))


class FeaturePredictor:
    """Logistic regression on hashed text features of the prefix (deviation 2); pure numpy."""

    _DENSE = 6  # bias, depth/8, error count/8, error fraction, answer given, last turn was an error

    def __init__(self, dim: int = 2**14, lr: float = 0.01, steps: int = 60, l2: float = 1e-4,
                 max_chars: int = 2000, env_feature: bool = False, logprob_features: bool = False,
                 tiers: Mapping[str, str] | None = None):
        if dim <= self._DENSE:
            raise ConfigError(f"expected dim > {self._DENSE}, got {dim}")
        self.dim, self.lr, self.steps, self.l2, self.max_chars = dim, lr, steps, l2, max_chars
        self.env_feature = env_feature
        """Add the prompt's env (the key of its namespaced task id, `trace_gym.env_mix`) as a feature of its own:
        a mixed run's envs differ in difficulty, and unseen prompts share it (off for one env: no feature)."""
        self.logprob_features = logprob_features
        """Add the binned log-probs of the policy's sampled actions and the task's tier (deviation 7)."""
        self.tiers = dict(tiers or {})
        """Task id -> its tier (``meta["tier"]``), read only with ``logprob_features``; a task without one has none."""
        self.w = np.zeros(dim)
        self._m = np.zeros(dim)
        self._v = np.zeros(dim)
        self._t = 0

    def _hash(self, token: str) -> int:
        return self._DENSE + zlib.crc32(token.encode("utf-8", "replace")) % (self.dim - self._DENSE)

    def features(self, prefix: Prefix) -> tuple[np.ndarray, np.ndarray]:
        """Sparse (columns, values) of one prefix."""
        n_err = sum(prefix.errors)
        last_action, last_obs = prefix.turns[-1] if prefix.turns else ("", "")
        prompt = _WORD.findall(prefix.prompt[: self.max_chars].lower())
        dense = [1.0, prefix.depth / 8.0, n_err / 8.0, n_err / max(prefix.depth, 1),
                 float("<answer>" in last_action), float(bool(prefix.errors and prefix.errors[-1]))]
        cols = list(range(self._DENSE))
        vals = dense
        groups = {
            "id": [prefix.task_id],
            "x": [f"{prefix.task_id}:{prefix.depth}:{n_err}"],  # task × progress: memorises per-state values
            "d": [str(min(prefix.depth, 16))],
            "n": [_size_bucket(len(prompt))],  # prompt size: a feature unseen prompts share
            "p": _with_bigrams(prompt),
            "a": _ngrams(last_action[-self.max_chars:]),
            "o": _ngrams(last_obs[-self.max_chars:]),
        }
        if self.env_feature:
            groups["e"] = [env_of(prefix.task_id)]
        if self.logprob_features:
            groups["l"] = _logprob_tokens(prefix)
            tier = self.tiers.get(prefix.task_id)
            if tier:
                groups["t"] = _tier_tokens(tier, prefix)
        for ns, tokens in groups.items():
            uniq = set(tokens)
            for tok in uniq:
                cols.append(self._hash(f"{ns}:{tok}"))
                vals.append(1.0 / np.sqrt(len(uniq)))
        return np.array(cols, dtype=np.int64), np.array(vals, dtype=np.float64)

    def _design(self, prefixes: Sequence[Prefix]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows, cols, vals = [], [], []
        for i, p in enumerate(prefixes):
            c, v = self.features(p)
            rows.append(np.full(len(c), i))
            cols.append(c)
            vals.append(v)
        if not rows:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
        return np.concatenate(rows), np.concatenate(cols), np.concatenate(vals)

    def _logits(self, n: int, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray) -> np.ndarray:
        return np.bincount(rows, weights=self.w[cols] * vals, minlength=n)

    def predict(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        rows, cols, vals = self._design(prefixes)
        return sigmoid(self._logits(len(prefixes), rows, cols, vals))

    def fit(self, prefixes: Sequence[Prefix], targets: np.ndarray, weights: np.ndarray) -> dict[str, float]:
        t = np.asarray(targets, dtype=np.float64)
        w = np.asarray(weights, dtype=np.float64)
        check_fit_inputs(prefixes, t, w)
        n = len(prefixes)
        if n == 0 or w.sum() == 0:
            return {"predictor/examples": float(n)}
        rows, cols, vals = self._design(prefixes)
        wn = w / w.sum()
        before = _soft_bce(sigmoid(self._logits(n, rows, cols, vals)), t, w)
        b1, b2 = 0.9, 0.999
        for _ in range(self.steps):
            p = sigmoid(self._logits(n, rows, cols, vals))
            g_logit = wn * (p - t)  # d(weighted mean BCE)/d logit
            grad = np.bincount(cols, weights=g_logit[rows] * vals, minlength=self.dim) + self.l2 * self.w
            self._t += 1
            self._m = b1 * self._m + (1 - b1) * grad
            self._v = b2 * self._v + (1 - b2) * grad**2
            m_hat = self._m / (1 - b1**self._t)
            v_hat = self._v / (1 - b2**self._t)
            self.w -= self.lr * m_hat / (np.sqrt(v_hat) + 1e-8)
        after = _soft_bce(sigmoid(self._logits(n, rows, cols, vals)), t, w)
        return {"predictor/examples": float(n), "predictor/loss_before": before, "predictor/loss_after": after}

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "features", "dim": self.dim, "w": self.w.copy(), "m": self._m.copy(),
                "v": self._v.copy(), "t": self._t}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "features" or int(state["dim"]) != self.dim:
            raise ConfigError(f"expected a FeaturePredictor state with dim {self.dim}, got "
                              f"{state.get('kind')!r} with dim {state.get('dim')}")
        self.w = np.array(state["w"], dtype=np.float64)
        self._m = np.array(state["m"], dtype=np.float64)
        self._v = np.array(state["v"], dtype=np.float64)
        self._t = int(state["t"])


def _magnitude_bin(logprob: float) -> str:
    """Half-octave bins of -logprob (deviation 7): 0.01 and 0.012 share one, 0.01 and 0.1 do not."""
    return str(int(np.floor(2 * np.log2(max(-logprob, 1e-4)))))


def _logprob_tokens(prefix: Prefix) -> list[str]:
    """Bins of the last turn's (sum, mean, min) and of the path's total and least log-prob, each alone and by depth
    (deviation 7); none for a prefix without log-probs."""
    d = min(prefix.depth, 16)
    known = [t for t in prefix.logprobs if t is not None]
    last = prefix.logprobs[-1] if prefix.logprobs else None
    named = list(zip(("s", "m", "n"), last)) if last is not None else []
    if known:
        named += [("ps", sum(t[0] for t in known)), ("pn", min(t[2] for t in known))]
    return [tok for name, x in named for tok in (f"{name}:{_magnitude_bin(x)}", f"{name}:{d}:{_magnitude_bin(x)}")]


def _tier_tokens(tier: str, prefix: Prefix) -> list[str]:
    """The tier alone, by depth, and crossed with the last turn's mean and min log-prob bins (deviation 7)."""
    out = [tier, f"{tier}:{min(prefix.depth, 16)}"]
    last = prefix.logprobs[-1] if prefix.logprobs else None
    if last is not None:
        out += [f"{tier}:m:{_magnitude_bin(last[1])}", f"{tier}:n:{_magnitude_bin(last[2])}"]
    return out


def _size_bucket(n: int) -> str:
    """Exact up to 16, then powers of two: one feature per size class of prompt."""
    return str(n) if n <= 16 else f"~{1 << (n.bit_length() - 1)}"


def _ngrams(text: str) -> list[str]:
    return _with_bigrams(_WORD.findall(text.lower()))


def _with_bigrams(words: list[str]) -> list[str]:
    return words + [f"{a}_{b}" for a, b in itertools.pairwise(words)]


class HiddenStatePredictor:
    """A LayerNorm + linear head on the policy's last-token hidden state (deviation 4).

    ``hidden_fn(prefixes)`` returns a (n, hidden_size) float tensor: the policy's final hidden state at each
    prefix's last token (the caller renders and tokenises the prefix the way the policy sees it).
    """

    def __init__(self, hidden_fn: Callable[[Sequence[Prefix]], Any], hidden_size: int, lr: float = 1e-2,
                 steps: int = 50, weight_decay: float = 1e-4, seed: int = 0):
        import torch

        self.hidden_fn = hidden_fn
        self.steps = steps
        gen = torch.Generator().manual_seed(seed)
        linear = torch.nn.Linear(hidden_size, 1)
        self.head = torch.nn.Sequential(torch.nn.LayerNorm(hidden_size), linear)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(1, hidden_size, generator=gen) * 0.01)
            linear.bias.zero_()
        self.opt = torch.optim.AdamW(self.head.parameters(), lr=lr, weight_decay=weight_decay)

    def _hidden(self, prefixes: Sequence[Prefix]) -> Any:
        import torch

        with torch.no_grad():
            h = self.hidden_fn(prefixes)
        return h.detach().float()

    def predict(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        import torch

        if not prefixes:
            return np.zeros(0)
        with torch.no_grad():
            return torch.sigmoid(self.head(self._hidden(prefixes))[:, 0]).double().numpy()

    def fit(self, prefixes: Sequence[Prefix], targets: np.ndarray, weights: np.ndarray) -> dict[str, float]:
        import torch

        t_np = np.asarray(targets, dtype=np.float64)
        w_np = np.asarray(weights, dtype=np.float64)
        check_fit_inputs(prefixes, t_np, w_np)
        if len(prefixes) == 0 or w_np.sum() == 0:
            return {"predictor/examples": float(len(prefixes))}
        h = self._hidden(prefixes)
        t = torch.as_tensor(t_np, dtype=torch.float32)
        w = torch.as_tensor(w_np / w_np.sum(), dtype=torch.float32)
        losses = []
        for _ in range(self.steps):
            logits = self.head(h)[:, 0]
            loss = (w * torch.nn.functional.binary_cross_entropy_with_logits(logits, t, reduction="none")).sum()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            losses.append(loss.item())
        return {"predictor/examples": float(len(prefixes)), "predictor/loss_before": losses[0],
                "predictor/loss_after": losses[-1]}

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "hidden", "head": self.head.state_dict(), "opt": self.opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "hidden":
            raise ConfigError(f"expected a HiddenStatePredictor state, got kind {state.get('kind')!r}")
        self.head.load_state_dict(state["head"])
        self.opt.load_state_dict(state["opt"])
