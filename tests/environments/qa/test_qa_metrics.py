"""The QA rewards against the ways a policy games them, and the spellings a correct answer takes.

Gaming cases are real: a 2WikiMultihopQA comparison question of the bundled sample answered with both
options, a gold date with the wrong year, a one-token gold padded with words."""

import pytest

from trace_gym.environments.qa.data import load_bundled
from trace_gym.environments.qa.metrics import QA_REWARDS, normalize_answer, qa_reward, score_answer

GAMING = [
    ("Forbidden Ground or Free Guy", ["Free Guy"]),  # hedge: both options of a comparison
    ("Free Guy or Forbidden Ground", ["Free Guy"]),
    ("Free Guy (Forbidden Ground)", ["Free Guy"]),
    ("25 December 1505", ["25 December 1506"]),  # the wrong year
    ("December 25, 1505", ["25 December 1506"]),
    ("Paris, capital city of France", ["Paris"]),  # padding: 4 extra words
    ("it is Paris", ["Paris"]),
    ("Stanley", ["G. Stanley Hall"]),  # a fragment of the gold
]
LEGITIMATE = [
    ("Najera", ["Nájera"]),  # accents stripped
    ("Faro", ["Fårö"]),
    ("Soren Kierkegaard", ["Søren Kierkegaard"]),
    ("1950-1953", ["1950–1953"]),  # hyphen for en dash
    ("1950 - 1953", ["1950—1953"]),
    ("December 25, 1506", ["25 December 1506"]),  # the same date written another way
    ("Dec. 25th, 1506", ["25 December 1506"]),
    ("1506-12-25", ["25 December 1506"]),
    ("the Beatles.", ["Beatles"]),
    ("Crime After Crime", ["Crime After Crime (Film)"]),  # Wikipedia's disambiguator
    ("Stanley Hall", ["G. Stanley Hall", "Stanley Hall"]),  # an alias
    ("Hawaii", ["Hawai\u02bbi"]),  # the okina, a modifier letter
    ("Oahu", ["O\u02bbahu"]),
    ("Hawaiʻi", ["Hawaii"]),
]


@pytest.mark.parametrize(("answer", "golds"), GAMING)
def test_each_gaming_case_scores_0_under_the_default_reward(answer, golds) -> None:
    assert qa_reward("em", score_answer(answer, golds)) == 0.0


@pytest.mark.parametrize(("answer", "golds"), GAMING[:-1])
def test_the_papers_f1_accuracy_lets_those_pass(answer, golds) -> None:
    """Why "f1" is not the default: the same answers pass F1 >= 0.3."""
    assert qa_reward("f1", score_answer(answer, golds)) == 1.0


@pytest.mark.parametrize(("answer", "golds"), LEGITIMATE)
@pytest.mark.parametrize("reward", sorted(QA_REWARDS))
def test_each_legitimate_variant_scores_1_under_every_reward(answer, golds, reward) -> None:
    scores = score_answer(answer, golds)
    assert qa_reward(reward, scores) == 1.0 and scores["em"] == scores["f1"] == 1.0


def test_hedges_on_the_bundled_2wiki_comparisons_all_score_0() -> None:
    """Every comparison question whose gold is one of its two entities, answered with both."""
    tasks = [t for t in load_bundled("2wiki", "train").tasks if t.meta.get("type") == "comparison"]
    hedges = []
    for t in tasks:
        gold = t.answer[0]
        others = [e for e in t.meta["supporting_titles"] if normalize_answer(e) != normalize_answer(gold)]
        if len(others) == 1 and len(others) < len(t.meta["supporting_titles"]):
            hedges.append((f"{others[0]} or {gold}", t.answer))
    assert len(hedges) > 40
    assert sum(qa_reward("em", score_answer(h, g)) for h, g in hedges) == 0


def test_normalisation_folds_letters_nfkd_leaves() -> None:
    assert normalize_answer("Łódź Æsir straße") == "lodz aesir strasse"


def test_modifier_letters_of_other_scripts_stay_letters() -> None:
    """Only U+02B0-U+02FF's modifiers go: the Japanese long-vowel mark and iteration mark are parts of words."""
    assert normalize_answer("ラーメン") != normalize_answer("ラメン")
    assert normalize_answer("時々") != normalize_answer("時")
    assert normalize_answer("Hawai\u02bci ˈstress") == "hawaii stress"


def test_unknown_reward_name_is_a_config_error() -> None:
    from trace_gym.environments.qa.env import MultiHopQAEnv
    from trace_gym.errors import ConfigError

    with pytest.raises(ConfigError, match="expected reward in"):
        MultiHopQAEnv(reward="bleu")
