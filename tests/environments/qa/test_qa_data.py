"""QA loaders: every bundled sample, and a user file in each official format (written here, tiny)."""

from __future__ import annotations

import csv
import json
import sys

import pytest

from trace_gym.environments.qa.data import (
    BUNDLED,
    bundled_corpus,
    load_2wiki,
    load_bamboogle,
    load_bundled,
    load_hotpotqa,
    load_musique,
    load_qa,
    load_questions,
)
from trace_gym.environments.qa.retrieval import Passage
from trace_gym.errors import ConfigError, DataError, SetupError

EXPECTED = {
    ("hotpotqa", "train"): 100,
    ("hotpotqa", "dev"): 200,
    ("hotpotqa", "dev500"): 500,
    ("2wiki", "train"): 500,
    ("2wiki", "dev500"): 500,
    ("musique", "train"): 100,
    ("musique", "dev500"): 500,
    ("bamboogle", "test"): 125,
}


def test_expected_lists_every_bundled_split() -> None:
    assert set(EXPECTED) == {(d, s) for d, splits in BUNDLED.items() for s in splits}


@pytest.mark.parametrize(("dataset", "split"), sorted(EXPECTED))
def test_bundled_sample_loads(dataset: str, split: str) -> None:
    data = load_bundled(dataset, split)
    assert len(data.tasks) == EXPECTED[dataset, split]
    assert len({t.id for t in data.tasks}) == len(data.tasks)
    for t in data.tasks:
        assert t.prompt.strip() and t.answer and all(isinstance(a, str) and a.strip() for a in t.answer)
        assert t.meta["dataset"] == dataset and t.meta["split"] == split
        json.dumps(t.to_dict())  # tasks travel in replay snapshots and tree files


@pytest.mark.parametrize("dataset", ["hotpotqa", "2wiki", "musique"])
def test_supporting_titles_are_in_the_pooled_corpus(dataset: str) -> None:
    titles = {p.title for p in bundled_corpus(dataset)}
    data = load_bundled(dataset, "train")
    assert all(t.meta["supporting_titles"] for t in data.tasks)
    assert all(title in titles for t in data.tasks for title in t.meta["supporting_titles"])
    assert set(data.passages) <= set(bundled_corpus(dataset))


def test_pooled_corpus_has_no_duplicates_and_all_pools_every_set() -> None:
    pool = bundled_corpus("all")
    assert len(set(pool)) == len(pool)
    assert set(bundled_corpus("hotpotqa")) | set(bundled_corpus("musique")) <= set(pool)


HOTPOT_RECORD = {
    "_id": "h1",
    "question": "Which city is the capital of the country where Porto is?",
    "answer": "Lisbon",
    "type": "bridge",
    "level": "easy",
    "supporting_facts": [["Porto", 0], ["Portugal", 1]],
    "context": [
        ["Porto", ["Porto is a city", " in Portugal."]],
        ["Portugal", ["Portugal is a country.", " Its capital is Lisbon."]],
        ["Madrid", ["Madrid is the capital of Spain."]],
    ],
}


def _write(path, records, jsonl: bool) -> str:
    text = "\n".join(json.dumps(r) for r in records) if jsonl else json.dumps(records)
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("jsonl", [False, True])
def test_user_hotpotqa_file(tmp_path, jsonl: bool) -> None:
    data = load_hotpotqa(_write(tmp_path / "h.json", [HOTPOT_RECORD, {**HOTPOT_RECORD, "_id": "h2"}], jsonl))
    t = data.tasks[0]
    assert (t.id, t.answer, t.meta["supporting_titles"]) == ("h1", ["Lisbon"], ["Porto", "Portugal"])
    assert t.meta["titles"] == ["Porto", "Portugal", "Madrid"]
    assert Passage("Porto", "Porto is a city in Portugal.") in data.passages
    assert len(data.passages) == 3  # two questions, same paragraphs: pooled once


def test_user_hotpotqa_file_in_hub_columnar_layout(tmp_path) -> None:
    record = {
        "id": "c1", "question": "q?", "answer": "yes", "type": "comparison", "level": "hard",
        "supporting_facts": {"title": ["A", "B"], "sent_id": [0, 0]},
        "context": {"title": ["A", "B"], "sentences": [["A is tall."], ["B is", " short."]]},
    }
    data = load_hotpotqa(_write(tmp_path / "c.jsonl", [record], True))
    assert data.tasks[0].meta["supporting_titles"] == ["A", "B"]
    assert data.passages == (Passage("A", "A is tall."), Passage("B", "B is short."))


def test_user_2wiki_file(tmp_path) -> None:
    record = {
        "_id": "w1", "type": "compositional", "question": "Who is the father of the director of Film X?",
        "answer": "John Doe", "supporting_facts": [["Film X", 0], ["Jane Roe", 1]],
        "evidences": [["Film X", "director", "Jane Roe"], ["Jane Roe", "father", "John Doe"]],
        "context": [["Film X", ["Film X is a film.", "It was directed by Jane Roe."]],
                    ["Jane Roe", ["Jane Roe is a director.", "Her father is John Doe."]]],
    }
    data = load_2wiki(_write(tmp_path / "w.jsonl", [record], True))
    t = data.tasks[0]
    assert t.meta["evidences"] == record["evidences"] and t.meta["dataset"] == "2wiki"
    assert data.passages[1] == Passage("Jane Roe", "Jane Roe is a director. Her father is John Doe.")


def test_user_musique_file(tmp_path) -> None:
    para = [{"idx": 0, "title": "A", "paragraph_text": "A text.", "is_supporting": True},
            {"idx": 1, "title": "B", "paragraph_text": "B text.", "is_supporting": False}]
    records = [
        {"id": "m1", "question": "q1?", "answer": "Stanley Hall", "answer_aliases": ["G. Stanley Hall"],
         "answerable": True, "paragraphs": para},
        {"id": "m2", "question": "q2?", "answer": "", "answer_aliases": [], "answerable": False, "paragraphs": para},
    ]
    data = load_musique(_write(tmp_path / "m.json", records, False))
    assert [t.id for t in data.tasks] == ["m1"]
    assert data.tasks[0].answer == ["Stanley Hall", "G. Stanley Hall"]
    assert data.tasks[0].meta["supporting_titles"] == ["A"]
    assert data.support["m1"] == (Passage("A", "A text."),)


MUSIQUE_FULL = [
    {"id": "a1", "question": "q1?", "answer": "x", "answer_aliases": [], "answerable": True,
     "paragraphs": [{"idx": 0, "title": "A", "paragraph_text": "A text.", "is_supporting": True}]},
    {"id": "u1", "question": "q1 twisted?", "answer": "x", "answer_aliases": [], "answerable": False,
     "paragraphs": [{"idx": 0, "title": "U", "paragraph_text": "Only in the unanswerable one.",
                     "is_supporting": False}]},
]


def test_musique_unanswerable_records_are_kept_as_distractors_and_reported(tmp_path, caplog) -> None:
    data = load_musique(_write(tmp_path / "full.json", MUSIQUE_FULL, False))
    assert [t.id for t in data.tasks] == ["a1"] and [t.id for t in data.unanswerable] == ["u1"]
    assert Passage("U", "Only in the unanswerable one.") in data.passages
    assert "1 unanswerable MuSiQue questions are not tasks" in caplog.text


def test_musique_unanswerable_questions_become_tasks_by_option(tmp_path) -> None:
    data = load_musique(_write(tmp_path / "full.json", MUSIQUE_FULL, False), include_unanswerable=True)
    task = data.tasks[1]
    assert (task.id, task.answer, task.meta["answerable"], task.meta["paired_answer"]) == (
        "u1", ["unanswerable"], False, "x")


def test_env_with_unanswerable_questions_says_how_to_answer_them(tmp_path) -> None:
    from trace_gym.environments.qa.env import MultiHopQAEnv

    env = MultiHopQAEnv("musique", data_path=_write(tmp_path / "full.json", MUSIQUE_FULL, False),
                        include_unanswerable=True, cache_dir=tmp_path)
    _, info = env.reset(options={"task_id": "u1"})
    assert "answer unanswerable" in info["messages"][0]["content"]
    assert env.step("<answer>Unanswerable</answer>")[1] == 1.0


def test_user_question_list_file(tmp_path) -> None:
    rows = [{"idx": 1, "question": "q1?", "answer": "a1", "gen_text_store": ""},
            {"idx": 1, "question": "q2?", "answer": "a2", "gen_text_store": ""}]
    data = load_questions(_write(tmp_path / "r.jsonl", rows, True), "hotpotqa")
    assert [t.id for t in data.tasks] == ["1", "1#2"]  # ids stay unique
    assert data.passages == () and data.tasks[1].answer == ["a2"]


def test_user_bamboogle_file(tmp_path) -> None:
    rows = [{"Question": "Who was president of the U.S. when superconductivity was discovered?",
             "Answer": "William Howard Taft"}]
    data = load_bamboogle(_write(tmp_path / "b.json", rows, False))
    assert data.tasks[0].answer == ["William Howard Taft"] and data.tasks[0].meta["dataset"] == "bamboogle"


def test_bamboogle_accepted_answer_lists_are_aliases(tmp_path) -> None:
    """The decomposed release lists the answers it accepts; as a table cell that is a list literal."""
    path = tmp_path / "decomposed.csv"
    path.write_text('Question,Answer,Accepted answers\n"Who was president of the United States in the year '
                    'that Citibank was founded?",james madison,"[\'James Madison\', \'Madison\']"\n')
    task = load_bamboogle(path).tasks[0]
    assert task.answer == ["james madison", "James Madison", "Madison"]
    listed = load_bamboogle([{"question": "q?", "answer": ["Titan IIIE", "Titan 3E"]}]).tasks[0]
    assert listed.answer == ["Titan IIIE", "Titan 3E"]


def test_bamboogle_releases_give_the_same_ids_to_the_same_questions(tmp_path) -> None:
    """The bundled R1-Searcher list numbers from 1; the original sheet and its HF copy have no ids (rows from 0)."""
    bundled = load_bundled("bamboogle", "test").tasks
    sheet = [{"Question": t.prompt, "Answer": t.answer[0]} for t in bundled]
    path = tmp_path / "Bamboogle Prerelease - Sheet1.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, ["Question", "Answer"])
        writer.writeheader()
        writer.writerows(sheet)
    released = load_bamboogle(path).tasks
    assert [t.id for t in released] == [t.id for t in bundled]
    assert len({t.id for t in bundled}) == 125 and bundled[0].id.startswith("bamboogle-")


def test_fields_map_a_user_question_list(tmp_path) -> None:
    rows = [{"query": "q?", "target": "a", "alt": ["b"]}]
    task = load_qa("hotpotqa", data_path=_write(tmp_path / "r.jsonl", rows, True),
                   fields={"question": "query", "answer": "target", "aliases": "alt"}).tasks[0]
    assert (task.prompt, task.answer) == ("q?", ["a", "b"])
    with pytest.raises(DataError, match="expected fields= keys among"):
        load_qa("hotpotqa", data_path=_write(tmp_path / "s.jsonl", rows, True), fields={"questoin": "query"})


def test_env_takes_a_datasets_dataset_with_a_column_mapping(tmp_path) -> None:
    datasets = pytest.importorskip("datasets")
    from trace_gym.environments.qa.env import MultiHopQAEnv

    columnar = {  # the hub's layout: Arrow holds no lists that mix titles and sentence lists
        "id": "h1", "query": HOTPOT_RECORD["question"], "answer": HOTPOT_RECORD["answer"],
        "supporting_facts": {"title": [t for t, _ in HOTPOT_RECORD["supporting_facts"]],
                             "sent_id": [i for _, i in HOTPOT_RECORD["supporting_facts"]]},
        "context": {"title": [t for t, _ in HOTPOT_RECORD["context"]],
                    "sentences": [s for _, s in HOTPOT_RECORD["context"]]},
    }
    env = MultiHopQAEnv("hotpotqa", data_path=datasets.Dataset.from_list([columnar]), fields={"question": "query"},
                        cache_dir=tmp_path)
    env.reset(seed=0)
    assert env.task.prompt == HOTPOT_RECORD["question"] and env.corpus_passages()


def test_load_qa_detects_the_layout_of_a_user_file(tmp_path) -> None:
    path = _write(tmp_path / "h.jsonl", [HOTPOT_RECORD], True)
    assert load_qa("hotpotqa", data_path=path).passages
    rows = [{"question": "q?", "answer": "a"}]
    assert load_qa("musique", data_path=_write(tmp_path / "q.json", rows, False)).passages == ()


def test_bamboogle_defaults_to_its_bundled_125_questions() -> None:
    data = load_qa("bamboogle")
    assert len(data.tasks) == 125 and data.passages == ()


def test_unknown_dataset_and_split_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        load_qa("squad")
    with pytest.raises(ConfigError, match="bundled split"):
        load_bundled("hotpotqa", "test")


def test_malformed_files_are_data_errors(tmp_path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DataError):
        load_hotpotqa(tmp_path / "bad.json")
    with pytest.raises(DataError, match="context"):
        load_hotpotqa(_write(tmp_path / "q.json", [{"question": "q", "answer": "a"}], False))
    with pytest.raises(DataError, match=r"no such file.*fix:"):
        load_hotpotqa(tmp_path / "absent.json")


def test_from_hub_without_datasets_says_how_to_fix(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError, no network touched
    with pytest.raises(SetupError, match="pip install datasets"):
        load_qa("bamboogle", from_hub=True)
