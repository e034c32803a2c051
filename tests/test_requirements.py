"""The published requirements are ranges, and constraints.txt pins one tested version of each inside it."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [r for reqs in project["optional-dependencies"].values() for r in reqs]
    return [Requirement(r) for r in [*project["dependencies"], *extras] if not r.startswith("trace-gym")]


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_every_requirement_is_a_bounded_range() -> None:
    unbounded = [str(r) for r in _requirements() if not any(s.operator in ("<", "<=", "==", "~=") for s in r.specifier)]
    assert unbounded == []


def test_constraints_pin_every_requirement_inside_its_range() -> None:
    pins = _pins()
    missing = [r.name for r in _requirements() if canonicalize_name(r.name) not in pins]
    outside = [f"{r.name} {pins[canonicalize_name(r.name)]} not in {r.specifier}" for r in _requirements()
               if canonicalize_name(r.name) in pins and not r.specifier.contains(pins[canonicalize_name(r.name)],
                                                                                  prereleases=True)]
    assert missing == [] and outside == []
