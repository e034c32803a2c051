"""The multi-hop QA env: answer scoring, conformance, the scripted expert, adversarial actions, shared index."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trace_gym.actions import HermesParser
from trace_gym.checker import check_trace_env
from trace_gym.environments.qa.data import bundled_corpus, load_bundled
from trace_gym.environments.qa.env import MultiHopQAEnv
from trace_gym.environments.qa.expert import QAExpert, issued_queries, search_turn
from trace_gym.environments.qa.metrics import exact_match, normalize_answer, score_answer, token_f1
from trace_gym.errors import ConfigError


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bm25cache")


def make(cache: Path, **kwargs) -> MultiHopQAEnv:
    return MultiHopQAEnv(cache_dir=cache, **kwargs)


def play(env: MultiHopQAEnv, expert: QAExpert, **reset) -> tuple[float, bool, dict]:
    _, info = env.reset(**reset)
    while True:
        assert env.task is not None
        _, reward, terminated, truncated, info = env.step(expert.act(env.task, info["messages"]))
        if terminated or truncated:
            return reward, truncated, info


# ----------------------------------------------------------------- scoring, computed by hand
def test_normalisation_drops_case_punctuation_articles_and_spaces() -> None:
    assert normalize_answer("  The Quick,  brown-fox! ") == "quick brown fox"  # a dash separates words
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words


def test_token_f1_by_hand() -> None:
    assert token_f1("the cat sat", "a cat sat down") == pytest.approx(0.8)  # P = 2/2, R = 2/3
    assert token_f1("Paris France", "Paris") == pytest.approx(2 / 3)  # P = 1/2, R = 1
    assert token_f1("cat cat", "cat") == pytest.approx(2 / 3)  # multiset overlap 1: P = 1/2, R = 1
    assert token_f1("dog", "cat") == 0.0
    assert token_f1("", "cat") == 0.0


def test_yes_no_must_match_exactly() -> None:
    assert token_f1("yes", "no") == 0.0
    assert token_f1("yes it is", "yes") == 0.0  # official rule for yes/no/noanswer
    assert token_f1("Yes.", "yes") == 1.0


def test_exact_match_and_aliases() -> None:
    assert exact_match("The Beatles", "beatles") == 1.0
    scores = score_answer("G. Stanley Hall", ["Stanley Hall", "G. Stanley Hall"])
    assert scores == {"em": 1.0, "f1": 1.0, "accuracy": 1.0}
    assert score_answer("Hall", ["Stanley Hall"])["em"] == 0.0


def test_success_threshold_is_f1_0_3() -> None:
    assert score_answer("w1 w2", "w1 x y z")["accuracy"] == 1.0  # F1 = 1/3
    assert score_answer("w1 w2 w3", "w1 x y z")["accuracy"] == 0.0  # F1 = 2/7


# ----------------------------------------------------------------- conformance
@pytest.mark.parametrize("dataset", ["hotpotqa", "2wiki", "musique"])
@pytest.mark.parametrize("action_format", ["hermes", "tags"])
def test_conformance_checker_passes(cache: Path, dataset: str, action_format: str) -> None:
    check_trace_env(lambda: make(cache, dataset=dataset, action_format=action_format), seed=3)


def test_reset_info_and_prompt(cache: Path) -> None:
    env = make(cache)
    obs, info = env.reset(seed=0)
    assert env.task is not None and obs == env.task.prompt
    assert [m["role"] for m in info["messages"]] == ["system", "user"]
    assert info["tools"][0]["function"]["name"] == "search"
    assert "<tool_call>" in info["messages"][0]["content"]


def test_tag_format_gets_the_compact_prompt_and_its_expert_follows_it(cache: Path) -> None:
    """The tiny model's format: one short line instead of ~500 characters of tool instructions per episode."""
    env = make(cache, action_format="tags")
    _, info = env.reset(options={"index": 0})
    system = info["messages"][0]["content"]
    assert system == env.unwrapped.compact_prompt and len(system) < 120
    assert "<search>" in system and "<answer>" in system
    expert = env.unwrapped.expert()
    reward, done = 0.0, False
    while not done:
        _, reward, terminated, truncated, _ = env.step(expert.act(env.unwrapped.task, env.unwrapped.messages))
        done = terminated or truncated
    assert reward == 1.0


def test_search_observation_lists_numbered_passages(cache: Path) -> None:
    env = make(cache, dataset="musique", top_k=2)
    env.reset(options={"index": 0})
    assert env.task is not None
    title = env.task.meta["supporting_titles"][0]
    obs, reward, terminated, truncated, info = env.step(search_turn(HermesParser(), title))
    assert obs.startswith(f"Doc 1 (Title: {title})") and "\nDoc 2 (Title: " in obs and "Doc 3" not in obs
    assert (reward, terminated, truncated, "error" in info) == (0.0, False, False, False)


def test_tag_format_search_and_alias_answer(cache: Path) -> None:
    env = make(cache, dataset="musique", action_format="tags")
    task = next(t for t in load_bundled("musique", "train").tasks if len(t.answer) > 1)
    env.reset(options={"task_id": task.id})
    obs, *_ = env.step("<search>" + task.meta["supporting_titles"][0] + "</search>")
    assert obs.startswith("Doc 1 (Title: ")
    _, reward, terminated, _, info = env.step(f"<answer>{task.answer[1]}</answer>")
    assert (reward, terminated, info["em"], info["f1"], info["stop_reason"]) == (1.0, True, 1.0, 1.0, "answer")


def test_wrong_answer_reports_scores_and_zero_reward(cache: Path) -> None:
    env = make(cache)
    env.reset(options={"index": 0})
    _, reward, terminated, _, info = env.step("<answer>certainly not this</answer>")
    assert (reward, terminated, info["em"], info["f1"]) == (0.0, True, 0.0, 0.0)


# ----------------------------------------------------------------- scripted expert
@pytest.mark.parametrize(("dataset", "split"), [("hotpotqa", "train"), ("hotpotqa", "dev"), ("musique", "train"),
                                                ("2wiki", "train"), ("musique", "dev500")])
def test_expert_without_noise_solves_every_task(cache: Path, dataset: str, split: str) -> None:
    env = make(cache, dataset=dataset, split=split)
    expert = env.expert(noise=0.0)
    for i, task in enumerate(env.tasks):
        reward, truncated, info = play(env, expert, options={"index": i})
        assert (reward, truncated) == (1.0, False), (task.id, info)
        assert env.turn_count == len(expert.plan(task)) + 1


def test_expert_tag_format_solves_every_task(cache: Path) -> None:
    env = make(cache, dataset="hotpotqa", action_format="tags")
    expert = env.expert(noise=0.0)
    assert all(play(env, expert, options={"index": i})[0] == 1.0 for i in range(len(env.tasks)))


def test_noisy_expert_gives_mixed_outcomes(cache: Path) -> None:
    env = make(cache, max_turns=4)
    expert = env.expert(noise=0.5, seed=1)
    outcomes = [play(env, expert, options={"index": i % 20}) for i in range(60)]
    rewards = [r for r, _, _ in outcomes]
    assert 0 < sum(rewards) < len(rewards)
    assert any(truncated for _, truncated, _ in outcomes)  # wasted searches also run out of turns
    per_task: dict[int, set[float]] = {}
    for i, r in enumerate(rewards):
        per_task.setdefault(i % 20, set()).add(r)
    assert any(len(v) == 2 for v in per_task.values())  # the same task both succeeds and fails


def test_expert_resumes_from_a_restored_snapshot(cache: Path) -> None:
    env = make(cache)
    expert = env.expert(noise=0.0)
    _, info = env.reset(options={"index": 5})
    assert env.task is not None
    _, _, _, _, info = env.step(expert.act(env.task, info["messages"]))
    snap = env.snapshot("native")
    env.step("<search>something else entirely</search>")  # a branch that diverges
    _, info = env.restore(snap)
    while True:
        _, reward, terminated, truncated, info = env.step(expert.act(env.task, info["messages"]))
        if terminated or truncated:
            break
    assert reward == 1.0 and env.turn_count == len(expert.plan(env.task)) + 1


def test_issued_queries_reads_both_formats() -> None:
    messages = [
        {"role": "user", "content": "<search>not mine</search>"},
        {"role": "assistant", "content": search_turn(HermesParser(), "Lisbon")},
        {"role": "assistant", "content": "<search> Porto </search> <tool_call>{bad json</tool_call>"},
    ]
    assert issued_queries(messages) == ["Lisbon", "Porto"]


def test_expert_noise_is_validated() -> None:
    with pytest.raises(ConfigError):
        QAExpert(noise=1.5)


# ----------------------------------------------------------------- adversarial actions
_NEAR_MISSES = st.sampled_from([
    "", " ", "<tool_call>", "</tool_call>", "<tool_call>{}</tool_call>", "<tool_call>[1, 2]</tool_call>",
    '<tool_call>{"name": "search"}</tool_call>', '<tool_call>{"name": "search", "arguments": {"query": 7}}</tool_call>',
    '<tool_call>{"name": "search", "arguments": {"query": "x", "k": 3}}</tool_call>',
    '<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>',
    '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"Lisbon\\"}"}</tool_call>',
    '<tool_call>{"name": "search", "arguments": {"query": ""}}</tool_call>',
    "<search></search>", "<search>Lisbon", "<answer>", "<answer></answer>", "<answer>x</answer><answer>y</answer>",
    "<search>a</search><answer>b</answer>", "\x00\ud800", "[" * 5000,
])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    actions=st.lists(st.one_of(st.text(max_size=200), _NEAR_MISSES, st.builds("".join, st.lists(_NEAR_MISSES))),
                     min_size=1, max_size=10),
    action_format=st.sampled_from(["hermes", "tags"]),
)
def test_adversarial_actions_never_raise(cache: Path, actions: list[str], action_format: str) -> None:
    env = make(cache, action_format=action_format, max_turns=6)
    env.reset(seed=0)
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        assert isinstance(obs, str) and reward in (0.0, 1.0)
        if terminated or truncated:
            assert info["stop_reason"] in ("answer", "max_turns")
            break
        # Each call gets its own tool message (its result or "Error: ..."); a turn that makes no call, one error.
        messages = info["messages"]
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        replies = [m["content"] for m in messages[last + 1:]]
        shown = [r for r in replies if r.startswith("Error: ")]
        assert ("error" in info) == bool(shown), (info.get("error"), replies)
        assert all(r[len("Error: "):] in info["error"] for r in shown)
        assert obs == "\n\n".join(replies)


def test_a_valid_call_and_a_bad_one_are_each_answered(cache: Path) -> None:
    env = make(cache, max_turns=6)
    env.reset(seed=0)
    obs, *_, info = env.step('<tool_call>{"name": "search", "arguments": {"query": "Lisbon"}}</tool_call>'
                             '<tool_call>{"name": "", "arguments": {}}</tool_call>')
    result, error = (m["content"] for m in info["messages"][-2:])
    assert result.startswith("Doc 1") and error == "Error: unknown tool ''; available tools: search"
    assert obs == result + "\n\n" + error and info["error"] == error[len("Error: "):]


# ----------------------------------------------------------------- shared index, snapshots, data sources
def test_index_is_shared_and_not_episode_state(cache: Path) -> None:
    a, b = make(cache), make(cache, split="dev")
    a.reset(seed=0)
    b.reset(seed=0)
    assert a.engine.index is b.engine.index  # one pooled corpus per dataset, built once per process
    assert a.state_dict() == {}
    snap = a.snapshot("native")
    a.restore(snap)
    assert a.engine.index is b.engine.index


def test_construction_is_lazy(cache: Path) -> None:
    env = make(cache, dataset="2wiki")
    assert env._engine is None and "tasks" not in vars(env)


def test_bamboogle_with_a_user_file_searches_the_pooled_corpus(cache: Path, tmp_path: Path) -> None:
    path = tmp_path / "bamboogle.json"
    path.write_text(json.dumps([{"Question": "What is the capital of Portugal?", "Answer": "Lisbon"}]))
    env = make(cache, dataset="bamboogle", data_path=path)
    env.reset(seed=0)
    assert len(env.engine.index) == len(make(cache, dataset="hotpotqa", corpus="all").corpus_passages())
    obs, *_ = env.step(search_turn(HermesParser(), "Lisbon capital Portugal"))
    assert obs.startswith("Doc 1 (Title: ")
    reward, _, _ = play(env, env.expert(), seed=0)
    assert reward == 1.0


def test_bamboogle_searches_the_pooled_corpus_of_the_bundled_sets(cache: Path) -> None:
    env = make(cache, dataset="bamboogle")
    env.reset(seed=0)
    assert set(env.corpus_passages()) == set(bundled_corpus("all"))


def test_user_corpus_replaces_the_bundled_one(cache: Path, tmp_path: Path) -> None:
    rows = [{"title": "Zorblax", "text": "Zorblax is a made-up moon of Neptune."},
            *({"title": f"Filler {i}", "text": f"Filler passage {i}."} for i in range(5))]
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    env = make(cache, corpus_path=path)
    env.reset(seed=0)
    obs, *_ = env.step(search_turn(HermesParser(), "zorblax moon"))
    assert obs == "Doc 1 (Title: Zorblax) Zorblax is a made-up moon of Neptune."


def test_user_data_file_indexes_its_own_paragraphs(cache: Path, tmp_path: Path) -> None:
    record = {"_id": "u1", "question": "Where is Zorblax?", "answer": "Neptune",
              "supporting_facts": [["Zorblax", 0]],
              "context": [["Zorblax", ["Zorblax orbits Neptune."]],
                          *([f"Other {i}", [f"Other text {i}."]] for i in range(5))]}
    path = tmp_path / "hotpot.jsonl"
    path.write_text(json.dumps(record))
    env = make(cache, data_path=path)
    env.reset(seed=0)
    assert len(env.engine.index) == 6
    assert play(env, env.expert(), seed=0)[0] == 1.0
