"""Tree packing: the trie holds each distinct prefix once and a token sees exactly its ancestors; on real trees
(the tiny model rolling out Arithmetic and multi-turn HotpotQA, with continuations, several prompts per pack)
the packed update's log-probs, loss, statistics and gradients equal the per-node rows'; the learner's packed
update equals its rows update; a model that takes no tree mask falls back to rows with a warning."""

from __future__ import annotations

import copy
import functools
import warnings

import gymnasium as gym
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import trace_gym  # noqa: F401 - registers the trace/* ids
from trace_gym.agents.hf import HFPolicy
from trace_gym.agents.policy import SamplingParams
from trace_gym.training.config import TrainConfig
from trace_gym.training.rollout.collector import TreeCollector, context_ids
from trace_gym.training.update.batches import token_logprobs, update_batch
from trace_gym.training.update.learner import Learner
from trace_gym.training.update.optimizer_step import policy_update
from trace_gym.training.update.packing import (
    build_trie,
    last_hidden_states,
    pack_batches,
    pack_rows,
    packing_unsupported,
    split_by_tokens,
    tree_mask,
    trie_order,
    unique_tokens,
)
from trace_gym.training.update.samples import Sample

ENVS = {  # env id -> kwargs: short observations keep the nano model's rollouts fast
    "trace/Arithmetic-v0": {"n_tasks": 6, "max_turns": 3},
    "trace/HotpotQA-v0": {"action_format": "tags", "top_k": 1, "max_passage_chars": 120, "max_turns": 3},
}
rows_st = st.lists(st.lists(st.integers(0, 3), max_size=6), min_size=1, max_size=12)


# --------------------------------------------------------------------------------------------- real trees
@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread while this module runs: on a shared 2-core machine two OpenMP threads wait on each
    other at every barrier (a (3, 445) forward/backward of the nano model took 10 s instead of 0.2 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def nano_dir(tmp_path_factory):
    from trace_gym.agents.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("nano"), size="nano", seed=0)


def collect(policy: HFPolicy, env_id: str, prompts: int = 2, roots: int = 2, k: int = 2, seed: int = 0) -> list:
    """One step's trees of ``prompts`` prompts: ``roots`` bare rollouts each, then ``k`` continuations from each
    of two open prefixes per tree, sampled by the (untrained) nano model; its malformed actions get error
    observations, so episodes run several turns."""
    make_env = functools.partial(gym.make, env_id, **ENVS[env_id])
    env = make_env()
    tasks = list(env.unwrapped.tasks)[:prompts]
    env.close()
    collector = TreeCollector(policy, make_env, tasks, SamplingParams(max_new_tokens=8, min_new_tokens=2),
                              tokenizer=policy.tokenizer, workers=2, max_context=2048)
    try:
        collector.bare_rollouts({t.id: roots for t in tasks}, seed=seed)
        plan = {(tid, n.id): k for tid, tree in collector.trees.items()
                for n in [n for n in tree.nodes if n.depth >= 1 and not n.is_terminal][:2]}
        collector.continuations(plan, seed=seed + 1)
        return list(collector.trees.values())
    finally:
        collector.close()


@pytest.fixture(scope="module")
def trees(nano_dir) -> dict[str, list]:
    policy = HFPolicy.from_pretrained(nano_dir, dtype=torch.float32)
    return {env_id: collect(policy, env_id) for env_id in ENVS}


@pytest.fixture(scope="module")
def samples(trees) -> list[Sample]:
    """Every generated node of both envs' trees as a trained row, with seeded advantages (the nano model never
    succeeds, so tree advantages would all be zero), plus an exact copy of one row."""
    g = torch.Generator().manual_seed(0)
    out = [Sample(context_ids(tree, n.id), list(n.token_ids), list(n.logprobs), float(torch.randn(1, generator=g)))
           for forest in trees.values() for tree in forest for n in tree.nodes if n.token_ids and n.logprobs]
    return [*out, copy.deepcopy(out[len(out) // 2])]


def test_real_trees_have_continuations_multi_turn_episodes_and_several_prompts(trees):
    for forest in trees.values():
        assert len(forest) == 2
        assert all(len(t.root.children) == 2 for t in forest)  # the bare rollouts
        assert max(n.depth for t in forest for n in t.nodes) >= 3
        assert any(len(n.children) >= 2 for t in forest for n in t.nodes if n.depth >= 1)  # a branched prefix


@functools.cache
def nano_model(path: str, implementation: str = "sdpa"):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=implementation)


def rows_logprobs(model, samples: list[Sample]) -> torch.Tensor:
    """The trained tokens' log-probs computed one padded row per node, flattened in row order."""
    batch = update_batch(samples, pad_id=0)
    with torch.no_grad():
        logprobs = token_logprobs(model, batch.input_ids, batch.attention_mask)
    return logprobs[:, 1:][batch.loss_mask[:, 1:] > 0]


# --------------------------------------------------------------------------------------------- the trie
@given(rows=rows_st)
def test_the_trie_holds_each_distinct_prefix_once(rows):
    trie = build_trie(rows)
    prefixes = {tuple(r[:d + 1]) for r in rows for d in range(len(r))}
    assert len(trie) == len(prefixes) == unique_tokens(rows)
    for row, path in zip(rows, trie.paths):
        assert trie.ids[path].tolist() == row
        assert trie.depth[path].tolist() == list(range(len(row)))


@given(rows=rows_st)
def test_the_mask_lets_a_token_see_exactly_its_ancestors(rows):
    trie = build_trie(rows)
    want = torch.zeros(len(trie), len(trie), dtype=torch.bool)
    for path in trie.paths:
        for d, node in enumerate(path.tolist()):
            want[node, path[:d + 1]] = True
    got = tree_mask(torch.as_tensor(trie.end), "sdpa")[0, 0]
    assert torch.equal(got, want)


@given(rows=rows_st, seed=st.integers(0, 2**31))
def test_trie_order_keeps_every_subtree_contiguous(rows, seed):
    order = trie_order(rows, torch.Generator().manual_seed(seed))
    assert sorted(order) == list(range(len(rows)))
    for prefix in {tuple(r[:d]) for r in rows for d in range(len(r) + 1)}:
        inside = [i for i, r in enumerate(order) if tuple(rows[r][:len(prefix)]) == prefix]
        assert inside == list(range(inside[0], inside[-1] + 1))


def test_trie_order_depends_on_the_seed():
    rows = [[a, b] for a in range(6) for b in range(3)]
    orders = {tuple(trie_order(rows, torch.Generator().manual_seed(s))) for s in range(5)}
    assert len(orders) > 1


@given(rows=rows_st, budget=st.integers(1, 12), seed=st.integers(0, 99))
def test_packs_stay_within_the_token_budget(rows, budget, seed):
    ordered = [rows[i] for i in trie_order(rows, torch.Generator().manual_seed(seed))]
    groups = split_by_tokens(ordered, budget)
    assert [i for g in groups for i in g] == list(range(len(rows)))
    for g in groups:
        assert len(g) == 1 or unique_tokens([ordered[i] for i in g]) <= budget


def test_a_whole_forest_in_one_pack_computes_each_distinct_prefix_once(samples):
    rows = [s.context + s.action for s in samples]
    pack = pack_rows(samples)
    assert pack.tokens == unique_tokens(rows) < sum(map(len, rows)) / 2
    assert int(pack.loss_mask.sum()) == sum(len(s.action) for s in samples)


# --------------------------------------------------------------------------------------------- equal to rows
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_packed_logprobs_equal_the_rows_on_real_trees(samples, nano_dir, implementation):
    model = nano_model(str(nano_dir), implementation)
    with torch.no_grad():
        got = pack_rows(samples).logprobs(model)[0]
    want = rows_logprobs(model, samples)
    # pack_rows keeps the rows' order and each row's action tokens in order: the same flattening
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def train_once(model, batch, micro_batch: int = 3, kl: bool = False):
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # the weight change is minus the gradient
    if kl:  # the reference is the starting model: the KL term starts at zero but has a gradient
        with torch.no_grad():
            parts = batch if isinstance(batch, list) else [batch]
            parts = [p.with_reference(p.logprobs(model)) for p in parts]
        batch = parts if isinstance(batch, list) else parts[0]
    stats = policy_update(model, optimizer, batch, micro_batch=micro_batch, clip_low=0.2, clip_high=0.28,
                          kl_coef=0.1 if kl else 0.0, grad_clip=0.0)
    return model.state_dict(), stats


@pytest.mark.parametrize("kl", [False, True])
def test_packed_update_loss_and_gradients_equal_the_rows_on_real_trees(samples, nano_dir, kl):
    model = nano_model(str(nano_dir))
    # Behaviour log-probs off the current policy, so that some ratios are clipped and some are not.
    shifted = [Sample(s.context, s.action, [lp + 0.3 * ((i + j) % 3 - 1) for j, lp in enumerate(s.logprobs)],
                      s.advantage) for i, s in enumerate(samples)]
    ordered = [shifted[i] for i in trie_order([s.context + s.action for s in shifted], torch.Generator())]
    packs = pack_batches(ordered, max_tokens=700)  # several packs: a tree is cut, its prefix computed twice
    assert len(packs) >= 3 and sum(p.rows for p in packs) == len(shifted)
    got, got_stats = train_once(model, packs, kl=kl)
    want, want_stats = train_once(model, update_batch(shifted, pad_id=0), kl=kl)
    start = model.state_dict()
    assert max(float((want[k] - start[k]).abs().max()) for k in want) > 1e-3  # a real step
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=1e-6, rtol=1e-4, msg=key)
    for key in ("loss/total", "loss/tokens", "loss/clip_frac", "loss/ratio_mean", "loss/kl_ref", "loss/grad_norm"):
        assert got_stats[key] == pytest.approx(want_stats[key], rel=1e-4, abs=1e-6), key
    assert 0 < got_stats["loss/clip_frac"] < 1
    assert got_stats["loss/forward_tokens"] < want_stats["loss/forward_tokens"] / 2


def test_identical_rows_count_twice(samples, nano_dir):
    model = nano_model(str(nano_dir))
    twice = [samples[0], copy.deepcopy(samples[0])]
    pack = pack_rows(twice)
    assert pack.tokens == len(samples[0].context) + len(samples[0].action)
    got, got_stats = train_once(model, [pack])
    want, want_stats = train_once(model, update_batch(twice, pad_id=0))
    assert got_stats["loss/tokens"] == want_stats["loss/tokens"] == 2 * len(samples[0].action)
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=1e-6, rtol=1e-4, msg=key)


def test_last_hidden_states_equal_one_forward_per_prefix(trees, nano_dir):
    model = nano_model(str(nano_dir)).eval()
    prefixes = [context_ids(t, n.id) for forest in trees.values() for t in forest for n in t.nodes if n.token_ids]
    got = last_hidden_states(model, prefixes, pack_tokens=600)
    with torch.no_grad():
        want = torch.stack([model(input_ids=torch.tensor([p]), output_hidden_states=True).hidden_states[-1][0, -1]
                            for p in prefixes])
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------- the learner
def learner_config(model_dir, update: str, **optim) -> TrainConfig:
    return TrainConfig.from_dict({"model": {"path": str(model_dir)},
                                  "optim": {"lr": 1e-3, "mini_batch": 16, "micro_batch": 4, "update": update,
                                            "pack_tokens": 900, "epochs": 2, **optim}})


@pytest.mark.parametrize(("kl_coef", "optimizer"), [(0.0, "sgd"), (0.05, "sgd")])
def test_the_learners_packed_update_equals_its_rows_update(samples, nano_dir, kl_coef, optimizer):
    out = {}
    for update in ("packed", "rows"):
        # SGD: the weight change is the gradient itself (Adam's first step would amplify last-bit differences)
        cfg = learner_config(nano_dir, update, kl_coef=kl_coef, optimizer=optimizer, lr=1.0)
        learner = Learner(cfg.model, cfg.optim, str(nano_dir), torch.device("cpu"))
        assert learner.packed == (update == "packed")
        stats = learner.update(samples, seed=3, pad_id=0)
        out[update] = (learner.model.state_dict(), stats)
    (got, got_stats), (want, want_stats) = out["packed"], out["rows"]
    assert got_stats["loss/optimizer_steps"] == want_stats["loss/optimizer_steps"] > 2  # 2 epochs of mini-batches
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=1e-6, rtol=1e-4, msg=key)
    for key in ("loss/total", "loss/tokens", "loss/clip_frac", "loss/kl_ref", "loss/grad_norm"):
        assert got_stats[key] == pytest.approx(want_stats[key], rel=1e-4, abs=1e-6), key
    assert got_stats["loss/packed"] == 1.0 and want_stats["loss/packed"] == 0.0
    assert got_stats["loss/forward_tokens"] < want_stats["loss/forward_tokens"] / 2


def test_a_model_with_sliding_window_layers_falls_back_to_rows_with_a_warning(tmp_path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=16, intermediate_size=64, vocab_size=64, use_sliding_window=True,
                         sliding_window=8, max_window_layers=1)
    Qwen3ForCausalLM(config).save_pretrained(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = learner_config(tmp_path, "packed")
        learner = Learner(cfg.model, cfg.optim, str(tmp_path), torch.device("cpu"))
    assert not learner.packed
    assert any("sliding-window" in str(w.message) and "one padded row per node" in str(w.message) for w in caught)
    rows = [Sample([1, 2, 3], [4, 5], [-1.0, -1.0], 1.0), Sample([1, 2, 3], [6], [-1.0], -1.0)]
    assert learner.update(rows, seed=0, pad_id=0)["loss/packed"] == 0.0


def test_packing_says_why_a_model_cannot_be_packed(nano_dir):
    assert packing_unsupported(nano_model(str(nano_dir))) is None
    assert "not a transformers model" in packing_unsupported(torch.nn.Linear(2, 2))
    flash = copy.deepcopy(nano_model(str(nano_dir)))
    flash.config._attn_implementation = "flash_attention_2"
    assert "takes no custom mask" in packing_unsupported(flash)


def test_a_pack_needs_one_behaviour_logprob_per_action_token():
    with pytest.raises(RuntimeError, match="one behaviour logprob per action token"):
        pack_rows([Sample([1, 2], [3, 4], [-1.0], 1.0)])
