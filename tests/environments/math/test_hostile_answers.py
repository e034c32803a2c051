"""From the attacker's side: hostile final answers score 0 on every registered math env, never crash, and run
nothing on the host (no file, no process); legitimate answers still score."""

from __future__ import annotations

import os
import time

import pytest

from tests.environments.math import hostile_answers
from trace_gym.env_specs import make_env
from trace_gym.environments.math.answers import check_answer
from trace_gym.environments.math.jailed import start_checker
from trace_gym.processes import descendant_pids
from trace_gym.registration import ENV_SPECS

MATH_IDS = sorted(i for i, (entry, _) in ENV_SPECS.items() if entry.startswith("trace_gym.environments.math."))
TASKS_PER_ENV = 2


@pytest.fixture(scope="module")
def marker_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("markers")
    os.chmod(path, 0o777)  # a process that ran as another user could still write here: the test would see it
    return str(path)


@pytest.fixture(scope="module")
def corpus(marker_dir) -> dict[str, list[str]]:
    return hostile_answers.corpus(marker_dir)


@pytest.fixture(scope="module")
def baseline() -> set[int]:
    start_checker()  # the per-process checker lives by design; the leak check is about what answers start
    return descendant_pids()


def test_every_math_id_is_covered() -> None:
    assert set(MATH_IDS) >= {"trace/Math-v0", "trace/Arithmetic-v0", "trace/GSM8K-v0", "trace/AIME24-v0",
                             "trace/MATH500-v0", "trace/AMC23-v0"}


@pytest.mark.parametrize("env_id", MATH_IDS)
@pytest.mark.parametrize("kind", ["code", "fooling", "hanging", "unicode"])
def test_hostile_answers_score_zero_on_every_math_env(env_id: str, kind: str, corpus, marker_dir, baseline) -> None:
    env = make_env(env_id).unwrapped
    try:
        for index in range(TASKS_PER_ENV):
            env.reset(seed=index, options={"index": index})
            for answer in corpus[kind]:
                if kind == "hanging" and index > 0 and len(answer) < 1000:
                    continue  # towers do not depend on the gold; one task per env is enough for them
                reward, info = env.verify(env.task, answer)
                assert reward == 0.0, (env_id, env.task.answer, answer[:200], info)
    finally:
        env.close()
    assert os.listdir(marker_dir) == []
    assert _settled(baseline) <= baseline


def _settled(baseline: set[int]) -> set[int]:
    """Descendants once the last bounded call's child has had time to exit (it exits right after replying)."""
    for _ in range(200):
        if descendant_pids() <= baseline:
            break
        time.sleep(0.02)
    return descendant_pids()


@pytest.mark.parametrize("env_id", MATH_IDS)
def test_hostile_answers_given_as_actions_end_the_episode_with_zero(env_id: str, corpus, marker_dir) -> None:
    env = make_env(env_id).unwrapped
    try:
        for answer in [hostile_answers.SIMPLIFY_PATCH, *corpus["code"]]:
            env.reset(seed=0, options={"index": 0})
            _, reward, terminated, _, info = env.step(env.parser.format_answer(answer))
            assert (reward, terminated) == (0.0, True), (env_id, answer, info)
    finally:
        env.close()
    assert os.listdir(marker_dir) == []


def test_the_fixed_simplify_patch_scores_zero_where_every_task_has_its_own_gold() -> None:
    golds = ["18", "\\frac{14}{3}", "\\left( 3, \\frac{\\pi}{2} \\right)", "p - q", "033", "x^2 + 1", "0"]
    assert [check_answer(hostile_answers.SIMPLIFY_PATCH, g)[0] for g in golds] == [0.0] * len(golds)


@pytest.mark.parametrize("transform", [
    lambda g: "\u202e" + g[::-1],
    lambda g: "\u200b".join(g),
    lambda g: g.translate({ord(c): ord(c) + 0xFEE0 for c in "0123456789"}),  # fullwidth digits
    lambda g: g.translate({ord(c): ord(c) - ord("0") + 0x0660 for c in "0123456789"}),  # Arabic-Indic
])
def test_lookalikes_of_the_gold_in_other_scripts_score_zero(transform) -> None:
    for gold in ["18", "204", "1000", "33"]:
        assert check_answer(transform(gold), gold)[0] == 0.0


def test_the_slow_path_is_stopped_at_its_deadline_with_a_note() -> None:
    # Outside the grammar (a set), so math-verify's parser builds it; comparing it evaluates the tower.
    reward, info = check_answer("\\{9^{9^{9^{9}}}\\}", "\\{3\\}")
    assert (reward, info["method"]) == (0.0, "timeout") and "counts as wrong" in info["note"]


@pytest.mark.parametrize(("gold", "pred"), [
    ("\\frac{14}{3}", "14/3"),
    ("\\frac{14}{3}", "\\frac{28}{6}"),
    ("1024", "2^{10}"),
    ("120", "5!"),
    ("6", "3!"),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{3}{2\\sqrt{3}}"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("\\pi", "\\frac{2\\pi}{2}"),
    ("(x+1)^2", "x^2+2x+1"),
    ("\\left(1, \\frac{1}{2}\\right)", "(1, 0.5)"),
    ("0.25", "\\frac{1}{4}"),
    ("-\\frac{1}{2}", "-0.5"),
    ("1267650600228229401496703205376", "2^{100}"),
    ("33", "\\boxed{033}"),
    ("18", "<answer>18 dollars</answer>"),
])
def test_legitimate_forms_still_score(gold: str, pred: str) -> None:
    reward, info = check_answer(pred, gold)
    assert reward == 1.0, info


# --------------------------------------------------------------------------- answers built from each gold
@pytest.fixture(scope="module")
def golds() -> dict[str, list[str]]:
    return hostile_answers.bundled_golds()


def _expert_answer(gold: str, action_format: str) -> str:
    """What the scripted expert answers after its cell ``print(answer)`` (the tool's output is what print wrote)."""
    from trace_gym.environments.math.experts import MathExpert
    from trace_gym.tasks import Task

    expert = MathExpert(action_format)
    task = Task(id="t", prompt="p", answer=gold)
    return expert.act(task, [{"role": "tool", "content": f"{gold}\n"}])


def test_every_bundled_gold_scores_against_itself_and_the_experts_answer(golds) -> None:
    failed = [(env, gold, how) for env, values in golds.items() for gold in values
              for how, answer in (("itself", gold), ("tags", _expert_answer(gold, "tags")),
                                  ("hermes", _expert_answer(gold, "hermes")))
              if check_answer(answer, gold)[0] != 1.0]
    assert failed == [], failed[:20]
    assert sum(map(len, golds.values())) > 14_000


@pytest.mark.parametrize("kind", ["anagram", "near_value", "chain"])
def test_answers_built_from_every_bundled_gold_score_zero(kind: str, golds) -> None:
    # Decided on the host (strings, exact values, the shape of relations): every gold of every env.
    scored, tried = [], 0
    for env, values in golds.items():
        for gold in values:
            for answer in hostile_answers.against(gold)[kind]:
                tried += 1
                if check_answer(answer, gold)[0] != 0.0:
                    scored.append((env, gold, answer))
    assert scored == [] and tried > {"anagram": 500, "near_value": 40_000, "chain": 70_000}[kind], scored[:20]


@pytest.mark.parametrize("kind", ["approximation", "hedge", "endpoints"])
def test_answers_built_from_a_sample_of_bundled_golds_score_zero(kind: str, golds) -> None:
    # These reach the jailed check: a seeded sample of the golds the class applies to, from every env.
    import random

    rng = random.Random(0)
    pool = [(env, gold) for env, values in golds.items() for gold in values if hostile_answers.against(gold)[kind]]
    sample = rng.sample(pool, 12)
    scored = [(env, gold, answer) for env, gold in sample for answer in hostile_answers.against(gold)[kind]
              if check_answer(answer, gold)[0] != 0.0]
    assert scored == []


@pytest.mark.parametrize(("gold", "answer"), [
    ("\\text{CBAD}", "\\text{cbad}"),          # a letter sequence: its letters in order, any case
    ("\\text{east}", "east"),
    ("\\text{east}", "\\text{ east }"),
    ("LQSX", "\\text{LQSX}"),
    ("9\\text{ values}", "9"),                 # a gold's unit in words may be left out
    ("9\\text{ values}", "9 \\text{ values}"),
    ("xy", "yx"),                              # two small letters are a product
    ("2xy + 10x + 20y + 100", "2yx+10x+20y+100"),
    ("1.85", "1.8500001"),                     # a decimal gold: a relative 1e-6
    ("0.5", "\\frac{1}{2}"),
    ("1.414214", "\\sqrt{2}"),
    ("809", "809.0"),                          # the same value
    ("2880000", "2,880,000"),
    ("(-\\sqrt{3}, \\sqrt{3})", "\\left(-\\sqrt3,\\sqrt3\\right)"),  # an interval, written as one
    ("(-\\sqrt{3}, \\sqrt{3})", "x \\in (-\\sqrt{3}, \\sqrt{3})"),
    ("[1,5)", "x \\in [1, 5)"),
    ("\\{1, 2\\}", "\\{2, 1\\}"),
])
def test_legitimate_forms_of_words_and_numbers_still_score(gold: str, answer: str) -> None:
    reward, info = check_answer(answer, gold)
    assert reward == 1.0, info


@pytest.mark.parametrize(("gold", "answer"), [
    ("(-\\sqrt{3}, \\sqrt{3})", "\\pm\\sqrt{3}"),     # MATH-500 algebra/1078: the interval, not its endpoints
    ("(-\\sqrt{3}, \\sqrt{3})", "-\\sqrt{3}, \\sqrt{3}"),
    ("(-\\sqrt{3}, \\sqrt{3})", "x = -\\sqrt{3}, \\sqrt{3}"),
    ("(2,\\infty)", "2, \\infty"),
    ("(5,\\infty)", "\\{5, \\infty\\}"),
    ("\\{1, 2\\}", "(1, 2)"),                        # and a set is not the interval between its elements
    ("\\left( \\frac{8}{5}, -\\frac{35}{2} \\right)", "\\{\\frac{8}{5}, -\\frac{35}{2}\\}"),  # a pair is ordered
    ("(20,100)", "20, 100"),                           # a pair, not the number 20,100
    ("20100", "20, 100"),                              # a list, not a number with a thousands separator
])
def test_an_interval_and_the_set_of_its_endpoints_are_not_equal(gold: str, answer: str) -> None:
    reward, info = check_answer(answer, gold)
    assert reward == 0.0, info
