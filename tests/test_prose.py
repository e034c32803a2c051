"""The project speaks of itself, not of how it was built: no tracker numbers, no work sessions, no machines lent
or not, in its docs, tests, code, scripts, configs and benchmarks."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TALK = re.compile(r"\bissues? ?#?\d+|\bthe issue('s)?\b|\b(this|earlier|previous) sessions?\b|\bsession \d|"
                  r"\bno GPU was lent\b|\bthe lead's\b", re.IGNORECASE)


FOLDERS = ("docs", "tests", "trace_gym", "agents", "environments", "training", "benchmarks", "scripts", "configs",
           "trace_gym_verifiers", ".ci")
SUFFIXES = {".md", ".py", ".sh", ".yaml", ".yml", ".toml", ".txt", ".html", ""}


def _project_files() -> list[Path]:
    """Text files of the project (its data folders hold third-party text, not the project's words)."""
    files = [ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml", ROOT / "mkdocs.yml"]
    for folder in FOLDERS:
        for p in (ROOT / folder).rglob("*"):
            if p.is_file() and p.suffix in SUFFIXES and "data" not in p.relative_to(ROOT).parts \
                    and "__pycache__" not in p.parts and p != Path(__file__):
                files.append(p)
    return files


def test_the_project_does_not_refer_to_the_tracker_or_to_sessions():
    files = _project_files()
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:80]}" for p in files
             for i, line in enumerate(p.read_text().splitlines(), 1) if TALK.search(line)]
    assert found == []
