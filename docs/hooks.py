"""mkdocs hook: lay out the package as it is installed, for griffe to read.

trace_gym.agents, .environments and .training live in agents/, environments/ and training/ (setuptools
package-dir), not under trace_gym/, so griffe cannot find them by path. Before the build, build/apidocs/trace_gym
gets a symlink to every file of trace_gym/ and one to each of those folders (mkdocs.yml points griffe there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

SUBPACKAGES = {"agents": "agents", "environments": "environments", "training": "training"}


@event_priority(100)  # before mkdocstrings' own on_config, which keeps only search paths that exist
def on_config(config: Any) -> Any:
    root = Path(config["config_file_path"]).resolve().parent
    package = root / "build" / "apidocs" / "trace_gym"
    package.mkdir(parents=True, exist_ok=True)
    links = {p.name: p for p in (root / "trace_gym").iterdir() if p.suffix == ".py"}
    links.update({name: root / folder for name, folder in SUBPACKAGES.items()})
    for name, target in links.items():
        link = package / name
        if link.is_symlink() and link.resolve() == target:
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    return config
