"""Docs and tests speak of the project, not of how it was built: no tracker numbers, no work sessions, no
machines lent or not."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TALK = re.compile(r"\bissues? ?#?\d+|\bthe issue('s)?\b|\b(this|earlier|previous) sessions?\b|\bsession \d|"
                  r"\bno GPU was lent\b|\bthe lead's\b", re.IGNORECASE)


def test_docs_and_tests_do_not_refer_to_the_tracker_or_to_sessions():
    files = [*(ROOT / "docs").rglob("*.md"), *(p for p in (ROOT / "tests").rglob("*.py") if p != Path(__file__))]
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:80]}" for p in files
             for i, line in enumerate(p.read_text().splitlines(), 1) if TALK.search(line)]
    assert found == []
