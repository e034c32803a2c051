"""The packaging maps each source folder to its package: one real path per module, every package listed."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _settings() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _folder(package: str, package_dir: dict[str, str]) -> Path:
    parts = package.split(".")
    for i in range(len(parts), 0, -1):
        head = ".".join(parts[:i])
        if head in package_dir:
            return ROOT / package_dir[head] / Path(*parts[i:])
    return ROOT / Path(*parts)


def test_no_folder_of_the_package_is_a_symlink():
    links = [p.relative_to(ROOT).as_posix() for folder in ("trace_gym", "environments", "agents", "training")
             for p in [ROOT / folder, *(ROOT / folder).rglob("*")] if p.is_symlink()]
    assert links == []


def test_the_listed_packages_are_exactly_the_folders_with_an_init():
    settings = _settings()
    listed = {_folder(p, settings["package-dir"]) for p in settings["packages"]}
    found = {init.parent for folder in ("trace_gym", "trace_gym_verifiers", "environments", "agents", "training")
             for init in (ROOT / folder).rglob("__init__.py") if "__pycache__" not in init.parts}
    # data folders whose names are identifiers: setuptools warns unless they are listed
    found |= {d for d in [ROOT / "environments" / "data", *(ROOT / "environments" / "data").rglob("*")]
              if d.is_dir() and d.name.isidentifier()}
    assert sorted(p.relative_to(ROOT).as_posix() for p in listed ^ found) == []
