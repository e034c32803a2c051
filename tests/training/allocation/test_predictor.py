import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_gym.training.allocation.predictor import (
    FeaturePredictor,
    HiddenStatePredictor,
    Prefix,
    logprob_summary,
    training_examples,
)
from trace_gym.tree import RolloutTree


def _hand_tree() -> RolloutTree:
    # root -> a -> (c: 1, d: 0); root -> b (1)
    tree = RolloutTree("t1", "What is 2+2?")
    a = tree.add(0, "<python>2+2</python>", "4")
    tree.add(0, "<answer>4</answer>", "correct", reward=1.0, terminated=True)
    tree.add(a.id, "<answer>4</answer>", "correct", reward=1.0, terminated=True)
    tree.add(a.id, "<answer>5</answer>", "wrong", reward=0.0, terminated=True, info={"error": "x"})
    return tree


def _data():
    easy = [Prefix(f"e{i}", f"easy question {i}") for i in range(4)]
    hard = [Prefix(f"h{i}", f"hard question {i}") for i in range(4)]
    prefixes = easy + hard
    targets = np.array([0.9] * 4 + [0.1] * 4)
    return prefixes, targets, np.ones(8)


def test_prefix_from_tree_reads_path():
    tree = _hand_tree()
    p = Prefix.from_tree(tree, 4)
    assert p.task_id == "t1" and p.prompt == "What is 2+2?" and p.depth == 2
    assert p.turns[1] == ("<answer>5</answer>", "wrong") and p.errors == (False, True)


def test_training_examples_are_open_nodes_with_bottom_up_targets():
    prefixes, targets, weights = training_examples([_hand_tree()])
    assert [p.depth for p in prefixes] == [0, 1]
    assert targets.tolist() == pytest.approx([2 / 3, 0.5])
    assert weights.tolist() == [3.0, 2.0]


def test_feature_predictor_learns_soft_targets():
    prefixes, targets, weights = _data()
    pred = FeaturePredictor(dim=1024, steps=200)
    assert np.allclose(pred.predict(prefixes), 0.5)
    stats = pred.fit(prefixes, targets, weights)
    assert stats["predictor/loss_after"] < stats["predictor/loss_before"]
    assert np.abs(pred.predict(prefixes) - targets).max() < 0.1


def test_feature_predictor_generalises_from_prompt_words():
    prefixes, targets, weights = _data()
    pred = FeaturePredictor(dim=1024, steps=200)
    pred.fit(prefixes, targets, weights)
    new = pred.predict([Prefix("e9", "easy question 9"), Prefix("h9", "hard question 9")])
    assert new[0] > 0.6 > 0.4 > new[1]


def test_feature_predictor_tells_operator_count_of_unseen_expressions():
    """Arithmetic prompts differ in operators and size, not in words: one operator fails, two succeed."""
    rng = np.random.default_rng(0)

    def prompt(ops: int) -> str:
        terms = [str(rng.integers(1, 100)) for _ in range(ops + 1)]
        return "Compute " + "".join(f"{t} {rng.choice(['+', '-', '*'])} " for t in terms[:-1]) + terms[-1] + "."

    seen = [Prefix(f"t{i}", prompt(1 + i % 2)) for i in range(64)]
    pred = FeaturePredictor()
    for _ in range(20):  # 20 training steps' fits at the default rate
        pred.fit(seen, np.array([i % 2 for i in range(64)], dtype=float), np.ones(64))
    one, two = (pred.predict([Prefix(f"new{k}{i}", prompt(k)) for i in range(32)]) for k in (1, 2))
    assert two.min() > 0.6 and one.max() < 0.4, (one.max(), two.min())


def test_feature_predictor_state_round_trip():
    prefixes, targets, weights = _data()
    a = FeaturePredictor(dim=512)
    a.fit(prefixes, targets, weights)
    b = FeaturePredictor(dim=512)
    b.load_state_dict(a.state_dict())
    assert np.array_equal(a.predict(prefixes), b.predict(prefixes))
    a.fit(prefixes, targets, weights)
    b.fit(prefixes, targets, weights)
    assert np.array_equal(a.predict(prefixes), b.predict(prefixes))


def test_feature_predictor_takes_any_text():
    odd = [Prefix("", ""), Prefix("x", "\x00\ud7ff 𝔘", ((("<answer>", "")),), (True,)),
           Prefix("y", "a" * 100_000, (("", ""),) * 40)]
    p = FeaturePredictor(dim=256).predict(odd)
    assert p.shape == (3,) and np.all((p >= 0) & (p <= 1))


# The default features of one prefix, as (column, value) at dim 4096: the quickstart's figures and the registered
# experiment's plans rest on them, so the opt-in features must leave them exactly as they were.
PINNED = [(0, 1.0), (1, 0.25), (2, 0.125), (3, 0.5), (4, 0.0), (5, 1.0), (117, 0.208514414057), (155, 0.208514414057),
          (191, 0.208514414057), (231, 0.4472135955), (305, 0.258198889747), (309, 0.208514414057),
          (401, 0.258198889747), (465, 0.258198889747), (547, 0.258198889747), (581, 0.258198889747),
          (637, 0.208514414057), (920, 1.0), (971, 0.208514414057), (973, 0.258198889747), (1063, 0.258198889747),
          (1094, 0.258198889747), (1221, 0.258198889747), (1268, 0.258198889747), (1312, 0.208514414057),
          (1386, 0.208514414057), (1497, 0.4472135955), (1508, 0.258198889747), (1527, 0.208514414057),
          (1551, 0.208514414057), (1614, 0.258198889747), (1641, 0.208514414057), (1735, 1.0),
          (1918, 0.258198889747), (2083, 0.4472135955), (2305, 0.208514414057), (2423, 0.208514414057),
          (2491, 0.208514414057), (2550, 0.4472135955), (2914, 1.0), (3020, 0.208514414057), (3172, 0.208514414057),
          (3208, 0.208514414057), (3229, 0.258198889747), (3552, 0.208514414057), (3560, 0.208514414057),
          (3703, 0.258198889747), (3710, 1.0), (3897, 0.208514414057), (3969, 0.4472135955), (4055, 0.208514414057),
          (4078, 0.208514414057), (4091, 0.208514414057)]


def _chain_prefix(logprobs=()) -> Prefix:
    turns = (("<calc>3+4</calc>", "7"), ("<calc>7*2</calc>", "Error: bad"))
    return Prefix("chain-7", "Compute a = 3 + 4; b = a * 2.", turns, (False, True), logprobs)


def _pairs(pred: FeaturePredictor, prefix: Prefix) -> list[tuple[int, float]]:
    cols, vals = pred.features(prefix)
    return sorted(zip(cols.tolist(), [round(v, 12) for v in vals.tolist()]))


def test_the_default_features_of_a_fixed_prefix_are_pinned_and_ignore_logprobs_and_tiers():
    assert _pairs(FeaturePredictor(dim=4096), _chain_prefix()) == PINNED
    told = FeaturePredictor(dim=4096, tiers={"chain-7": "tool"})  # tiers are read only with logprob_features
    assert _pairs(told, _chain_prefix(((-1.0, -0.5, -0.9), (-3.0, -1.0, -2.5)))) == PINNED


def test_prefix_from_tree_summarises_each_actions_logprobs():
    tree = _hand_tree()
    assert Prefix.from_tree(tree, 4).logprobs == ()  # a tree written without a tokenizer: no summary
    tree[1].logprobs = [-0.5, -1.5]
    tree[4].logprobs = [float("nan"), -float("inf"), -0.25]
    p = Prefix.from_tree(tree, 4)
    assert p.logprobs[0] == pytest.approx((-2.0, -1.0, -1.5))
    assert p.logprobs[1] == pytest.approx((-50.25, -25.125, -50.0))  # NaN dropped, -inf clipped at -50
    assert logprob_summary([float("nan")]) is None and logprob_summary(None) is None


def test_logprob_features_tell_apart_prefixes_the_text_cannot():
    """Two copies of one text: the policy was sure of one action (it succeeds) and hesitated over the other."""
    sure, unsure = ((-0.01, -0.002, -0.005),), ((-6.0, -1.2, -4.0),)
    prefixes = [Prefix(f"t{i}", "Compute 3 + 4.", (("<calc>3+4</calc>", "7"),), (False,), lp)
                for i in range(32) for lp in (sure, unsure)]
    targets = np.array([1.0, 0.0] * 32)
    plain, told = FeaturePredictor(dim=1024, steps=200), FeaturePredictor(dim=1024, steps=200, logprob_features=True)
    for pred in (plain, told):
        pred.fit(prefixes, targets, np.ones(64))
    probe = [Prefix("new", "Compute 3 + 4.", (("<calc>3+4</calc>", "7"),), (False,), lp) for lp in (sure, unsure)]
    assert plain.predict(probe)[0] == plain.predict(probe)[1]
    high, low = told.predict(probe)
    assert high > 0.8 and low < 0.2, (high, low)


def test_the_tier_is_a_feature_of_the_tasks_that_carry_one():
    prefixes = [Prefix(f"{tier}{i}", f"Compute {i} + {i}.") for tier in ("easy", "hard") for i in range(16)]
    tiers = {p.task_id: p.task_id.rstrip("0123456789") for p in prefixes}
    targets = np.array([1.0] * 16 + [0.0] * 16)
    pred = FeaturePredictor(dim=1024, steps=200, logprob_features=True, tiers={**tiers, "easy99": "easy"})
    pred.fit(prefixes, targets, np.ones(32))
    easy, untiered = pred.predict([Prefix("easy99", "Compute 99 + 99."), Prefix("other", "Compute 99 + 99.")])
    assert easy > 0.7 and abs(untiered - 0.5) < abs(easy - 0.5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.floats(), max_size=6), min_size=1, max_size=4))  # NaN, ±inf and > 0 included
def test_logprob_features_take_any_logprobs(turns):
    tree = RolloutTree("t", "Compute 1 + 2.")
    node = 0
    for lp in turns:
        node = tree.add(node, "<calc>1+2</calc>", "3").id
        tree[node].logprobs = lp
    prefix = Prefix.from_tree(tree, node)
    pred = FeaturePredictor(dim=512, logprob_features=True, tiers={"t": "guess"})
    pred.fit([prefix], np.array([1.0]), np.array([1.0]))
    p = pred.predict([prefix])
    assert p.shape == (1,) and 0.0 <= p[0] <= 1.0


def test_fit_rejects_targets_outside_unit_interval():
    with pytest.raises(ValueError, match="targets in"):
        FeaturePredictor(dim=256).fit([Prefix("a", "b")], np.array([1.5]), np.array([1.0]))


def _tiny_qwen_hidden_fn():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, intermediate_size=128, vocab_size=300)
    model = Qwen3ForCausalLM(cfg).eval()

    def hidden_fn(prefixes):
        out = []
        for p in prefixes:
            text = p.prompt + "".join(a + o for a, o in p.turns)
            ids = torch.tensor([[b % 300 for b in text.encode()[-64:]]])
            h = model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
            out.append(h[0, -1])
        return torch.stack(out)

    return hidden_fn


def test_hidden_state_predictor_fits_and_round_trips():
    prefixes, targets, weights = _data()
    fn = _tiny_qwen_hidden_fn()
    a = HiddenStatePredictor(fn, hidden_size=64, lr=0.05, steps=100)
    stats = a.fit(prefixes, targets, weights)
    assert stats["predictor/loss_after"] < stats["predictor/loss_before"]
    assert np.abs(a.predict(prefixes) - targets).max() < 0.15
    b = HiddenStatePredictor(fn, hidden_size=64, seed=1)
    b.load_state_dict(a.state_dict())
    assert np.allclose(a.predict(prefixes), b.predict(prefixes))


# ----------------------------------------------------------------- memory wrappers (deviation 5)
from trace_gym.training.allocation.predictor_wrappers import (  # noqa: E402
    PromptPosterior,
    ReplayPredictor,
    with_memory,
)


def test_prompt_posterior_shrinks_a_seen_prompts_own_outcomes_toward_the_shared_value():
    shared = FeaturePredictor(steps=0)  # never moves: predicts 0.5 everywhere
    post = PromptPosterior(shared, strength=4.0)
    seen, unseen = Prefix("a", "Compute 1 + 2."), Prefix("b", "Compute 3 + 4.")
    post.fit([seen, Prefix("a", "Compute 1 + 2.", (("x", "y"),))], np.array([0.75, 1.0]), np.array([4.0, 2.0]))
    v = post.predict([seen, unseen, Prefix("a", "Compute 1 + 2.", (("x", "y"),))])
    assert v[0] == pytest.approx((4.0 * 0.5 + 3.0) / (4.0 + 4.0))  # root: 3 successes of 4 rollouts
    assert v[1] == pytest.approx(0.5) and v[2] == pytest.approx(0.5)  # unseen prompt, deeper prefix: shared


def test_replay_fits_on_the_last_fits_together():
    replay = ReplayPredictor(FeaturePredictor(steps=1), keep=2)
    sizes = []
    for k in range(3):
        prefixes = [Prefix(f"t{k}-{i}", "Compute 1 + 2.") for i in range(k + 1)]
        sizes.append(replay.fit(prefixes, np.ones(k + 1), np.ones(k + 1))["predictor/replay_examples"])
    assert sizes == [1.0, 3.0, 5.0]  # 1, 1+2, 2+3


def test_memory_wrappers_state_round_trip():
    a = with_memory(FeaturePredictor(steps=5), replay=3, prior_strength=2.0)
    a.fit([Prefix("a", "Compute 5 * 6."), Prefix("b", "Compute 7 - 8.")], np.array([1.0, 0.0]), np.array([2.0, 2.0]))
    b = with_memory(FeaturePredictor(steps=5), replay=3, prior_strength=2.0)
    b.load_state_dict(a.state_dict())
    probe = [Prefix("a", "Compute 5 * 6."), Prefix("c", "Compute 9 + 9.")]
    assert np.allclose(a.predict(probe), b.predict(probe))
    assert b.inner.buffer[0][0] == a.inner.buffer[0][0]
