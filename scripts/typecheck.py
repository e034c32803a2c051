"""Type-check the package as it installs (``make typecheck``).

The source layout is not the import layout: pyproject's ``package-dir`` maps the top-level folders
``environments/``, ``agents/`` and ``training/`` to ``trace_gym.environments``, ``trace_gym.agents`` and
``trace_gym.training``, so a checker run on the checkout cannot resolve ``trace_gym.training.step``. This script
copies the Python files into ``build/typecheck/src/`` as a non-editable install lays them out, runs mypy there (its
configuration is pyproject's ``[tool.mypy]``), and prints each finding under the checkout path of its file.
Fails when mypy reports an error or checks fewer files than the layout holds.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "typecheck"
SOURCE = BUILD / "src"
PATH_AT_START = re.compile(r"^([^:\s]+\.pyi?)(?=:)")
CHECKED = re.compile(r"(?:checked|in) (\d+) source files?")


def assemble(target: Path = SOURCE) -> dict[str, str]:
    """Lay the packages' ``.py`` files out under ``target`` by module name; returns {layout path: checkout path}."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped: dict[str, str] = setuptools["package-dir"]
    shutil.rmtree(target, ignore_errors=True)
    origin: dict[str, str] = {}
    for name in setuptools["packages"]:
        parts = name.split(".")
        folder = Path(*parts)  # a package's folder is its name unless it or a parent is mapped
        for cut in range(len(parts), 0, -1):
            if (head := ".".join(parts[:cut])) in mapped:
                folder = Path(mapped[head], *parts[cut:])
                break
        for source in sorted((ROOT / folder).glob("*.py")):
            placed = target / name.replace(".", "/") / source.name
            placed.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, placed)
            origin[placed.relative_to(target).as_posix()] = source.relative_to(ROOT).as_posix()
    return origin


def to_checkout(line: str, origin: dict[str, str]) -> str:
    """A line of mypy's output with the file it names given by its checkout path."""
    return PATH_AT_START.sub(lambda match: origin.get(match[1], match[1]), line)


def main() -> int:
    origin = assemble()
    tops = sorted({path.split("/", 1)[0] for path in origin})
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--no-color-output",
               "--cache-dir", str(BUILD / "cache")]
    for top in tops:
        command += ["-p", top]
    done = subprocess.run(command, cwd=SOURCE, capture_output=True, text=True)
    checked = 0
    for line in (done.stdout + done.stderr).splitlines():
        print(to_checkout(line, origin))
        if found := CHECKED.search(line):
            checked = int(found[1])
    if done.returncode == 0 and checked < len(origin):
        print(f"typecheck: mypy checked {checked} files of the {len(origin)} laid out in {SOURCE}; "
              "is a package missing from pyproject's packages list?")
        return 1
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
