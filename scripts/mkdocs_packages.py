"""mkdocs hook: lay the installed package out for the API reference.

The reference reads the source statically (griffe), which finds ``trace_gym`` in the checkout but not the
folders the packaging maps into it (``environments/`` -> ``trace_gym.environments``, pyproject's
``package-dir``). This hook assembles that view under ``build/api-source/`` (links to the real files, outside the
source tree) before the reference is collected; mkdocs.yml points the Python handler there.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "build" / "api-source"


def _assemble() -> None:
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    shutil.rmtree(TARGET, ignore_errors=True)
    package = TARGET / "trace_gym"
    package.mkdir(parents=True)
    for entry in (ROOT / "trace_gym").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name, folder in mapping.items():
        (TARGET / Path(*name.split("."))).symlink_to(ROOT / folder)


def on_config(config):
    _assemble()
    return config


_assemble()  # hooks load with the config, before any plugin collects an object
