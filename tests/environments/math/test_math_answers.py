"""The verifier on answer pairs in the formats of the real datasets (GSM8K, MATH-500, AIME, AMC)."""

import threading

import pytest

from trace_gym.environments.math.answers import check_answer, extract_answer, gsm8k_gold, last_boxed

EQUIVALENT = [
    ("18", "18"),                                              # GSM8K
    ("18", "$18"),
    ("18", "18 dollars"),
    ("1,000", "1000"),
    ("70000", "70,000"),
    ("27.0", "27"),                                            # AMC gold is a float
    ("\\frac{1}{2}", "0.5"),                                   # MATH
    ("\\frac{1}{2}", "1/2"),
    ("\\dfrac{3}{4}", "\\frac34"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"),    # MATH-500 tuple
    ("p - q", "-q + p"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("\\sqrt{2}/2", "sqrt(2)/2"),
    ("[2, 5)", "[2,5)"),                                       # intervals
    ("(-\\infty, 3]", "(-\\infty,3]"),
    ("10\\%", "10"),
    ("90^\\circ", "90"),
    ("\\text{(C)}", "(C)"),
    ("x = 5", "5"),
    ("2\\sqrt{3}", "\\sqrt{12}"),
    ("\\$32", "32"),
    ("5 \\text{ cm}", "5"),
    ("033", "33"),                                             # AIME answers are written with 3 digits
]

DIFFERENT = [
    ("18", "19"),
    ("\\frac{1}{2}", "0.51"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi)"),
    ("p - q", "p + q"),
    ("[2, 5)", "[2, 5]"),
    ("(1, 2)", "(2, 1)"),
    ("\\sqrt{2}", "2"),
    ("27", "2.7"),
    ("1000001", "1000000"),                                    # integers are equal or not: no tolerance
    ("\\frac{1}{3}", "0.33"),
    ("x^2", "2x"),
    ("\\text{(C)}", "(D)"),
]


@pytest.mark.parametrize(("gold", "pred"), EQUIVALENT)
def test_equivalent_pairs_get_reward_one(gold: str, pred: str) -> None:
    reward, info = check_answer(pred, gold)
    assert reward == 1.0, info


@pytest.mark.parametrize(("gold", "pred"), DIFFERENT)
def test_different_pairs_get_reward_zero(gold: str, pred: str) -> None:
    reward, info = check_answer(pred, gold)
    assert reward == 0.0, info


def test_info_holds_parsed_forms_and_method() -> None:
    reward, info = check_answer("\\frac{2}{4}", "0.5")
    assert reward == 1.0 and info["method"] in ("numeric", "math_verify") and info["parsed_answer"]


def test_extraction_prefers_answer_tag_then_boxed() -> None:
    assert extract_answer("so \\boxed{3} <answer>\\boxed{\\frac{1}{2}}</answer>") == "\\frac{1}{2}"
    assert extract_answer("<answer> 42 </answer>") == "42"
    assert extract_answer("thus \\boxed{\\frac{a}{b}} done") == "\\frac{a}{b}"
    assert extract_answer("no final answer") is None
    assert last_boxed("\\boxed{unclosed") is None


def test_gsm8k_gold_is_the_number_after_hashes() -> None:
    assert gsm8k_gold("She makes 9 * 2 = $<<9*2=18>>18.\n#### 1,018") == "1018"


def test_garbage_never_raises() -> None:
    for junk in ["", "}}}{{{", "\\frac{", "$" * 1000, "\\boxed{" * 50, "1/0", "(" * 500, None]:
        reward, _ = check_answer(junk, "1")  # type: ignore[arg-type]
        assert reward == 0.0


def test_works_off_the_main_thread() -> None:
    out: list[float] = []
    thread = threading.Thread(target=lambda: out.append(check_answer("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt2}{2}")[0]))
    thread.start()
    thread.join()
    assert out == [1.0]


# --------------------------------------------------------------------------- bounded verification
@pytest.mark.parametrize("answer", ["\\boxed{9^{9^{9^{9}}}}", "\\boxed{(10^{10})!}", "factorial(10**9)"])
def test_a_hostile_answer_gets_a_zero_with_a_note_within_its_deadline(answer: str) -> None:
    import time

    from trace_gym.environments.math.answers import TIMEOUT_S

    check_answer("\\frac{1}{2}", "\\frac{2}{4}")  # the call server is warm: what follows is about the answer
    start = time.monotonic()
    reward, info = check_answer(answer, "3")
    assert reward == 0.0 and info["method"] in ("too_large", "timeout", "error", "mismatch")
    assert info["method"] != "timeout" or "stopped" in info["note"]
    assert time.monotonic() - start < TIMEOUT_S + 25  # a bound only a hang exceeds, even on a loaded machine


def test_the_verifier_is_stopped_rather_than_left_running() -> None:
    # A set is outside the grammar (which would refuse the tower at once): math-verify's parser builds it and
    # comparing it with 3 evaluates the tower, until the bounded call is killed.
    reward, info = check_answer("\\boxed{\\{9^{9^{9^{9}}}\\}}", "\\{3\\}")
    assert (reward, info["method"]) == (0.0, "timeout") and "counts as wrong" in info["note"]
