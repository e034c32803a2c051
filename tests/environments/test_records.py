"""The one reader of task records: file layouts, in-memory datasets, column mapping, errors that name the file."""

import json

import pytest

from trace_gym.environments.records import check_fields, find_column, read_json, read_records
from trace_gym.errors import DataError

ROWS = [{"q": "a?", "a": "1"}, {"q": "b?", "a": "2"}]


@pytest.mark.parametrize("layout", ["array", "jsonl", "csv", "tsv"])
def test_every_file_layout_gives_the_same_records(tmp_path, layout) -> None:
    path = tmp_path / f"data.{ {'array': 'json', 'jsonl': 'jsonl'}.get(layout, layout)}"
    if layout == "array":
        path.write_text(json.dumps(ROWS))
    elif layout == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    else:
        sep = "," if layout == "csv" else "\t"
        path.write_text(f"q{sep}a\n" + "".join(f"{r['q']}{sep}{r['a']}\n" for r in ROWS))
    assert read_records(path) == ROWS


def test_a_single_object_file_is_one_record(tmp_path) -> None:
    (tmp_path / "one.json").write_text(json.dumps(ROWS[0]))
    assert read_records(tmp_path / "one.json") == [ROWS[0]]


def test_fields_copy_columns_under_the_loader_names() -> None:
    assert read_records(ROWS, {"question": "q"})[0] == {"q": "a?", "a": "1", "question": "a?"}


def test_a_mapped_column_that_is_missing_names_the_record() -> None:
    with pytest.raises(DataError, match=r"columns \['query'\].*record 0.*fix:"):
        read_records(ROWS, {"question": "query"})


def test_unknown_field_names_are_rejected_with_the_known_ones() -> None:
    with pytest.raises(DataError, match=r"\['questoin'\].*fix:"):
        check_fields({"questoin": "q"}, ("question", "answer"), "QA data")


def test_missing_file_names_the_path_and_the_fix(tmp_path) -> None:
    with pytest.raises(DataError, match=r"absent\.jsonl, got no such file; fix:"):
        read_records(tmp_path / "absent.jsonl")


def test_malformed_jsonl_names_the_file_and_line(tmp_path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(DataError, match=r"bad\.jsonl, got a parse error on line 2.*fix:"):
        read_json(tmp_path / "bad.jsonl")


def test_non_object_records_are_data_errors(tmp_path) -> None:
    (tmp_path / "nums.json").write_text("[1, 2]")
    with pytest.raises(DataError, match=r"JSON object per record.*int at record 0"):
        read_records(tmp_path / "nums.json")


def test_a_datasets_dataset_reads_like_a_list_of_records() -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(ROWS)
    assert read_records(ds, {"answer": "a"}) == [{**r, "answer": r["a"]} for r in ROWS]


def test_a_single_mapping_is_not_taken_for_records() -> None:
    with pytest.raises(DataError, match="single dict"):
        read_records({"q": "a?"})


def test_find_column_ignores_case_spaces_and_underscores() -> None:
    assert find_column({"Accepted Answers": 1}, ("accepted_answers",)) == "Accepted Answers"
    assert find_column({"x": 1}, ("question",)) is None
