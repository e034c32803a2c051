"""Tree packing: the rows of a step's trained nodes share prefixes, so a token trie over them computes each
distinct prefix once.

A step's trained rows (context + action, `learner.Sample`) are rebuilt from its rollout trees: siblings share
their parent's context exactly, a turn-2 row contains its turn-1 row, and the prompts of one env share their
system prompt. A token trie over the rows therefore has one node per distinct prefix: packed into one
sequence in preorder, with position id = depth and an attention mask in which a token sees exactly its
ancestors (itself included), every node's hidden states equal those of any row through it, and every row's
log-probabilities can be gathered from the packed output. The trie needs no link to `RolloutTree`: it also
merges what the trees cannot know is equal (two roots that sampled the same first tokens, the prompts' shared
system turn).

In preorder a node's subtree is a contiguous range ``[i, end[i])``, so "j is an ancestor of i" is
``j <= i < end[j]``: the mask is two comparisons, and a flex-attention block mask skips whole blocks.

Choices:
1. The loss is over (row, action token) pairs gathered from the packed logits, so identical rows (two
   siblings that sampled the same text) still count twice, and the token-level normaliser counts exactly
   the tokens the rows count; depth 0 is never trained (it has no logits before it), as in the rows.
2. Logits are computed only at the positions that predict a trained token (``logits_to_keep`` as an index
   tensor); a packed forward never builds the (tokens, vocab) tensor of the rows.
3. The mask follows the model's attention implementation: a boolean 4-D mask for ``sdpa``, an additive one
   for ``eager``, a `BlockMask` for ``flex_attention``. transformers (5.x) passes a 4-D mask through unchanged
   and takes explicit ``position_ids``. Other implementations (flash-attention kernels take no mask) and
   sliding-window layers (a 4-D mask would replace their window) are not packed: `packing_unsupported` says
   why, and the learner falls back to rows.
4. Rows are ordered along the trie (`trie_order`: a seeded random order among the children of every node),
   so that a mini-batch or a pack cut from the order holds whole subtrees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from trace_gym.agents.hf import taken_logprobs
from trace_gym.errors import ConfigError

MASKED_IMPLEMENTATIONS = ("sdpa", "eager", "flex_attention")
"""transformers attention implementations that take a custom tree mask (choice 3)."""
_PRIME = 2_147_483_647  # 2^31 - 1: an affine map mod a prime above every token id is a permutation of ids


class Row(Protocol):
    """A trained row: the ids the action was sampled after, the action's ids and behaviour log-probs, and
    its advantage (`learner.Sample`)."""

    context: list[int]
    action: list[int]
    logprobs: list[float]
    advantage: float


# --------------------------------------------------------------------------------------------- the trie
@dataclass(frozen=True)
class TokenTrie:
    """The distinct prefixes of some token rows, in preorder."""

    ids: np.ndarray  # (N,) token of each node
    depth: np.ndarray  # (N,) position id: the node's depth, 0 at a row's first token
    end: np.ndarray  # (N,) one past the node's subtree: node i is an ancestor of node k iff i <= k < end[i]
    paths: list[np.ndarray]  # per input row, its nodes (path[d] = the node of its token at depth d)

    def __len__(self) -> int:
        return len(self.ids)


def build_trie(rows: Sequence[Sequence[int]]) -> TokenTrie:
    """The token trie of ``rows`` (any order; empty rows allowed), each distinct prefix one node."""
    order = sorted(range(len(rows)), key=lambda r: tuple(rows[r]))
    ids: list[np.ndarray] = []
    depth: list[np.ndarray] = []
    paths: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(rows)
    prev = np.zeros(0, dtype=np.int64)
    prev_path = np.zeros(0, dtype=np.int64)
    n = 0
    for r in order:
        row = np.asarray(rows[r], dtype=np.int64)
        # Sorted rows: the longest prefix a row shares with any earlier row is the one with its predecessor,
        # so its new nodes are its tokens past that common prefix, and they come next in preorder.
        m = min(len(row), len(prev))
        differ = np.flatnonzero(row[:m] != prev[:m])
        common = int(differ[0]) if len(differ) else m
        fresh = len(row) - common
        path = np.concatenate([prev_path[:common], np.arange(n, n + fresh)])
        ids.append(row[common:])
        depth.append(np.arange(common, len(row)))
        n += fresh
        paths[r], prev, prev_path = path, row, path
    flat_ids = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
    flat_depth = np.concatenate(depth) if depth else np.zeros(0, dtype=np.int64)
    return TokenTrie(flat_ids, flat_depth, _subtree_ends(flat_depth), paths)


def _subtree_ends(depth: np.ndarray) -> np.ndarray:
    """Preorder depths -> one past each node's subtree (the next node at the same depth or above)."""
    end = np.full(len(depth), len(depth), dtype=np.int64)
    open_nodes: list[int] = []
    for k, d in enumerate(depth.tolist()):
        while open_nodes and depth[open_nodes[-1]] >= d:
            end[open_nodes.pop()] = k
        open_nodes.append(k)
    return end


def trie_order(rows: Sequence[Sequence[int]], generator: torch.Generator) -> list[int]:
    """A random order of ``rows`` along their trie (choice 4): every subtree's rows are contiguous, the
    children of each node come in a random order (one seeded relabelling of the token ids), a row before the
    rows that extend it; identical rows keep their input order."""
    a, b = (int(x) for x in torch.randint(1, _PRIME, (2,), generator=generator))

    def key(r: int) -> tuple[int, ...]:
        return tuple(((np.asarray(rows[r], dtype=np.int64) * a + b) % _PRIME).tolist())

    return sorted(range(len(rows)), key=key)


def unique_tokens(rows: Sequence[Sequence[int]]) -> int:
    """Distinct prefixes of ``rows``: the tokens a packed forward over all of them computes."""
    return len(build_trie(rows))


def split_by_tokens(rows: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
    """Cut ``rows`` (in trie order) into consecutive groups whose tries hold at most ``max_tokens`` nodes; a
    row longer than that alone is a group of its own."""
    if max_tokens < 1:
        raise ConfigError(f"expected max_tokens >= 1, got {max_tokens}; fix: optim.pack_tokens=4096")
    groups: list[list[int]] = []
    size, prev = 0, np.zeros(0, dtype=np.int64)
    for i, r in enumerate(rows):
        row = np.asarray(r, dtype=np.int64)
        m = min(len(row), len(prev))
        differ = np.flatnonzero(row[:m] != prev[:m])
        # Consecutive rows of a trie order: the new nodes are the tokens past the predecessor's common prefix.
        fresh = len(row) - (int(differ[0]) if len(differ) else m)
        if groups and size + fresh <= max_tokens:
            groups[-1].append(i)
            size += fresh
        else:
            groups.append([i])
            size = len(row)
        prev = row
    return groups


# --------------------------------------------------------------------------------------------- packs
@dataclass(frozen=True)
class Pack:
    """Trained rows packed into one sequence of N trie nodes, with K (row, action token) loss targets.

    The loss tensors are (1, K), in the layout `loss.policy_loss` takes; ``keep`` are the positions whose
    logits are computed and ``source[k]`` is the index into ``keep`` of the position predicting target k.
    """

    input_ids: torch.Tensor  # (1, N)
    position_ids: torch.Tensor  # (1, N)
    end: torch.Tensor  # (N,) subtree ends (the mask)
    keep: torch.Tensor  # (U,) positions whose logits are needed
    source: torch.Tensor  # (K,) index into keep
    target: torch.Tensor  # (K,) token ids to score
    loss_mask: torch.Tensor  # (1, K)
    old_logprobs: torch.Tensor  # (1, K)
    advantages: torch.Tensor  # (1, K)
    rows: int
    ref_logprobs: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.rows

    @property
    def tokens(self) -> int:
        """Tokens run through the model by a forward over this pack."""
        return int(self.input_ids.shape[1])

    def to(self, device: torch.device | str) -> Pack:
        return Pack(**{f.name: _move(getattr(self, f.name), device) for f in fields(self)})

    def without_loss(self) -> Pack:
        """The same forward with nothing trained (an idle rank's pass, optimizer_step.py note 2)."""
        return _replace(self, loss_mask=torch.zeros_like(self.loss_mask))

    def with_reference(self, ref_logprobs: torch.Tensor) -> Pack:
        return _replace(self, ref_logprobs=ref_logprobs)

    def logprobs(self, model: nn.Module, temperature: float = 1.0) -> torch.Tensor:
        """(1, K) log-probabilities of the targets under ``model`` (with grad when enabled)."""
        logits = packed_forward(model, self.input_ids, self.position_ids, self.end, keep=self.keep).logits[0]
        return taken_logprobs(logits[self.source], self.target, temperature)[None]


def _move(value: Any, device: torch.device | str) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _replace(pack: Pack, **changes: Any) -> Pack:
    return Pack(**{**{f.name: getattr(pack, f.name) for f in fields(pack)}, **changes})


def pack_rows(samples: Sequence[Row]) -> Pack:
    """One `Pack` of ``samples`` (a trie over their context + action ids)."""
    if not samples:
        raise ValueError("expected at least one row to pack, got none")
    trie = build_trie([s.context + s.action for s in samples])
    src: list[np.ndarray] = []
    tgt: list[np.ndarray] = []
    old: list[float] = []
    adv: list[float] = []
    for s, path in zip(samples, trie.paths):
        if len(s.logprobs) != len(s.action):
            raise RuntimeError(f"expected one behaviour logprob per action token, got {len(s.logprobs)} for "
                              f"{len(s.action)}")
        first = max(len(s.context), 1)  # depth 0 has nothing before it (choice 1)
        nodes = path[first:]
        src.append(path[first - 1:-1] if len(nodes) else nodes)
        tgt.append(nodes)
        old.extend(s.logprobs[first - len(s.context):])
        adv.extend([float(s.advantage)] * len(nodes))
    source_pos = np.concatenate(src)
    keep, source = np.unique(source_pos, return_inverse=True)
    targets = trie.ids[np.concatenate(tgt)]
    k = len(targets)
    return Pack(input_ids=torch.as_tensor(trie.ids)[None], position_ids=torch.as_tensor(trie.depth)[None],
                end=torch.as_tensor(trie.end), keep=torch.as_tensor(keep, dtype=torch.long),
                source=torch.as_tensor(source, dtype=torch.long).reshape(k),
                target=torch.as_tensor(targets, dtype=torch.long), loss_mask=torch.ones(1, k),
                old_logprobs=torch.tensor(old, dtype=torch.float32)[None],
                advantages=torch.tensor(adv, dtype=torch.float32)[None], rows=len(samples))


def pack_batches(samples: Sequence[Row], max_tokens: int, parts: int = 1) -> list[Pack]:
    """``samples`` (in trie order) as packs of at most ``max_tokens`` nodes (a longer row alone), cut finer
    when needed so that there are at least ``parts`` packs where the rows allow (one per rank)."""
    rows = [s.context + s.action for s in samples]
    if parts > 1:
        max_tokens = min(max_tokens, -(-unique_tokens(rows) // parts))
    return [pack_rows([samples[i] for i in group]) for group in split_by_tokens(rows, max_tokens)]


def shard_packs(packs: Sequence[Pack], rank: int, world_size: int) -> list[Pack]:
    """Packs ``rank, rank + world_size, ...``; a rank left without one gets the smallest pack with nothing
    trained, so that every rank runs a forward/backward (optimizer_step.py note 2)."""
    mine = list(packs[rank::world_size])
    return mine or [min(packs, key=lambda p: p.tokens).without_loss()]


# --------------------------------------------------------------------------------------------- the model
def attention_implementation(model: nn.Module) -> str | None:
    """The transformers attention implementation of ``model`` (through DDP, FSDP2 and peft wrappers)."""
    config = getattr(base_model(model), "config", None)
    return getattr(config, "_attn_implementation", None)


def base_model(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside DDP and peft wrappers."""
    if hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def packing_unsupported(model: nn.Module) -> str | None:
    """Why ``model`` cannot run a packed forward (choice 3), or None when it can."""
    config = getattr(base_model(model), "config", None)
    if config is None:
        return f"{type(base_model(model)).__name__} is not a transformers model"
    impl = getattr(config, "_attn_implementation", None)
    if impl not in MASKED_IMPLEMENTATIONS:
        return f"attention implementation {impl!r} takes no custom mask (packing needs one of " \
               f"{MASKED_IMPLEMENTATIONS})"
    if not getattr(config, "is_causal", True):
        return "the model's attention is bidirectional"
    layer_types = getattr(config, "layer_types", None)
    sliding = (any(t != "full_attention" for t in layer_types) if layer_types
               else bool(getattr(config, "sliding_window", None)))
    if sliding:
        return "the model has sliding-window layers, whose window a custom mask would replace"
    return None


def tree_mask(end: torch.Tensor, implementation: str | None, dtype: torch.dtype = torch.float32) -> Any:
    """The attention mask in which node i sees node j iff j is an ancestor of i or i itself, for the given
    attention implementation: (1, 1, N, N) boolean (sdpa), additive (eager), or a flex `BlockMask`."""
    n = int(end.shape[0])
    if implementation == "flex_attention":
        from torch.nn.attention.flex_attention import create_block_mask

        def ancestor(b: Any, h: Any, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            return (kv <= q) & (q < end[kv])

        return create_block_mask(ancestor, 1, None, n, n, device=end.device)
    pos = torch.arange(n, device=end.device)
    allowed = (pos[None, :] <= pos[:, None]) & (pos[:, None] < end[None, :])  # [query, key]
    if implementation == "eager":
        return torch.zeros(n, n, dtype=dtype, device=end.device).masked_fill(~allowed, torch.finfo(dtype).min)[
            None, None]
    if implementation == "sdpa":
        return allowed[None, None]
    raise ConfigError(f"expected an attention implementation in {MASKED_IMPLEMENTATIONS}, got {implementation!r}; "
                      "fix: load the model with attn_implementation='sdpa' or train with optim.update=rows")


def packed_forward(model: nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, end: torch.Tensor,
                   keep: torch.Tensor | None = None, **kwargs: Any) -> Any:
    """The model's output over one packed sequence (1, N) under the tree mask; logits at ``keep`` only
    (choice 2; all positions when None)."""
    dtype = next(model.parameters()).dtype
    mask = tree_mask(end, attention_implementation(model), dtype)
    return model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False,
                 logits_to_keep=0 if keep is None else keep, **kwargs)


@torch.no_grad()
def last_hidden_states(model: nn.Module, rows: Sequence[Sequence[int]], pack_tokens: int = 4096) -> torch.Tensor:
    """(len(rows), hidden) final hidden state at the last token of each non-empty row, as one forward per row
    gives it, with every shared prefix computed once (packs of at most ``pack_tokens`` nodes, rows in trie
    order): the predictor's hidden-state features of a step's prefixes."""
    if any(len(r) == 0 for r in rows):
        raise ValueError("expected non-empty rows, got an empty one; fix: give each prefix at least one token")
    device = next(model.parameters()).device
    order = trie_order(rows, torch.Generator().manual_seed(0))
    out: list[torch.Tensor | None] = [None] * len(rows)
    for group in split_by_tokens([rows[i] for i in order], pack_tokens):
        members = [order[g] for g in group]
        trie = build_trie([rows[i] for i in members])
        last = torch.as_tensor([int(p[-1]) for p in trie.paths], device=device)
        hidden = packed_forward(model, torch.as_tensor(trie.ids, device=device)[None],
                                torch.as_tensor(trie.depth, device=device)[None],
                                torch.as_tensor(trie.end, device=device), keep=last[:1],
                                output_hidden_states=True).hidden_states[-1][0]
        for i, h in zip(members, hidden[last].float().cpu()):
            out[i] = h
    return torch.stack(out)  # type: ignore[arg-type]
