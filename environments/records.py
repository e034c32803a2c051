"""Task records from files or in-memory datasets: one reader and one column mapping for every env's loader.

- ``read_json(path)``: a JSON document or JSON Lines, whichever the file holds; a missing or malformed file
  raises ``DataError`` naming it, with a fix.
- ``read_records(source, fields)``: the records of a file (a JSON array, one JSON object, JSON Lines, or a
  ``.csv``/``.tsv`` table with a header row, as spreadsheets export), of a Hugging Face ``datasets.Dataset``,
  or of any iterable of mappings, with columns renamed by ``fields``.
- ``fields`` maps the loader's own field names to the user's columns, e.g. ``{"question": "query",
  "answer": "target"}``; the mapped column is copied under the loader's name and the record keeps the rest.
  ``check_fields`` rejects names the loader does not read, so a typo fails at once.

``datasets`` is never imported here: a ``Dataset`` is iterated like any other sequence of mappings.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trace_gym.errors import DataError

__all__ = ["Fields", "Source", "apply_fields", "check_fields", "find_column", "read_json", "read_records"]

Fields = Mapping[str, str]
Source = str | os.PathLike[str] | Iterable[Mapping[str, Any]]


def read_json(path: str | os.PathLike[str]) -> Any:
    """The parsed content of a JSON file, or the list of values of a JSON Lines file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"expected a data file at {path}, got no such file; fix: check the path (a relative path "
                        f"is read from {Path.cwd()})")
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"expected a UTF-8 text file at {path}, got {type(e).__name__}: {e}; fix: save it as "
                        "UTF-8 JSON or JSON Lines") from e
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        pass
    values = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            values.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise DataError(f"expected a JSON array or JSON Lines in {path}, got a parse error on line {n}: {e}; "
                            "fix: one JSON object per line, or a single JSON array") from e
    return values


def read_records(source: Source, fields: Fields | None = None, where: str | None = None) -> list[dict[str, Any]]:
    """Records of ``source`` (a path, a ``datasets.Dataset`` or an iterable of mappings), renamed by ``fields``."""
    if isinstance(source, str | os.PathLike):
        where = where or str(source)
        data = _read_table(Path(source)) if Path(source).suffix.lower() in (".csv", ".tsv") else read_json(source)
        if isinstance(data, dict):
            data = [data]  # a one-record file
        if not isinstance(data, list):
            raise DataError(f"expected a list of JSON objects in {where}, got {type(data).__name__}; fix: a JSON "
                            "array of records or one record per line")
    else:
        where = where or type(source).__name__
        if isinstance(source, Mapping):
            raise DataError(f"expected records (a datasets.Dataset or a list of mappings), got a single "
                            f"{type(source).__name__}; fix: pass [record] or the dataset's split (ds['train'])")
        data = list(source)
    records = []
    for i, record in enumerate(data):
        if not isinstance(record, Mapping):
            raise DataError(f"expected a JSON object per record in {where}, got {type(record).__name__} at record "
                            f"{i}; fix: each record is an object of fields")
        records.append(dict(record))
    return apply_fields(records, fields, where) if fields else records


def _read_table(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise DataError(f"expected a data file at {path}, got no such file; fix: check the path")
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            return list(csv.DictReader(f, delimiter="\t" if path.suffix.lower() == ".tsv" else ","))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"expected a UTF-8 table with a header row in {path}, got {type(e).__name__}: {e}; "
                        "fix: export the sheet as UTF-8 CSV") from e


def check_fields(fields: Fields | None, known: Sequence[str], what: str) -> None:
    """Raise ``DataError`` for a mapping of a field name the loader does not read."""
    unknown = sorted(set(fields or ()) - set(known))
    if unknown:
        raise DataError(f"expected fields= keys among {sorted(known)} for {what}, got {unknown}; fix: map the "
                        "loader's field name to your column, e.g. fields={'question': 'my_column'}")


def apply_fields(records: Sequence[Mapping[str, Any]], fields: Fields, where: str) -> list[dict[str, Any]]:
    """Copy each mapped column under the loader's name; a missing column raises ``DataError``."""
    out = []
    for i, record in enumerate(records):
        missing = [column for column in fields.values() if column not in record]
        if missing:
            raise DataError(f"expected columns {missing} (from fields=) in {where} record {i}, got {sorted(record)}; "
                            "fix: correct fields= to name existing columns")
        out.append({**record, **{name: record[column] for name, column in fields.items()}})
    return out


def find_column(record: Mapping[str, Any], names: Sequence[str]) -> str | None:
    """The first of ``names`` the record has, compared without case, spaces or underscores (``Question``,
    ``question``; ``answer_aliases``, ``Answer Aliases``); None if it has none."""
    def key(name: str) -> str:
        return name.lower().replace("_", "").replace(" ", "")

    present = {key(k): k for k in record if isinstance(k, str)}
    for name in names:
        if key(name) in present:
            return present[key(name)]
    return None
