"""The jail works wherever the interpreter, its venv and the project live, the system's temporary folder
included: each lineage covers /tmp with its own, and what the jail binds from there must stay visible below it.

A venv and a copy of the sandbox's host side are made under /tmp (not under a TMPDIR that may point elsewhere),
and a cell imports a module from each that the template never imported, so only the lineage's view can serve
it. Without the jail's layers the same holds trivially; the test runs the jailed levels."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.environments.sandbox.hostcopy import copy_host_side

SCRIPT = r'''
import sys
from trace_gym.environments.sandbox.host import PythonSandbox, SandboxLimits
box = PythonSandbox(SandboxLimits(timeout_s=20, cpu_s=20), isolation=sys.argv[1])
print("venv", box.run("import probe_in_venv\nprint(probe_in_venv.VALUE)").output.strip())
print("project", box.run("import probe_in_project\nprint(probe_in_project.VALUE)").output.strip())
print("tmp", box.run("import os\nprint(sorted(os.listdir('/tmp')))").output.strip())
print("write", box.run("import sys\nsys.modules['__main__']._Guard.untrusted = False\n"
                       "open('/tmp/mine', 'w').write('x')\nprint(open('/tmp/mine').read())").output.strip())
SWAP = ("import os, sys\nsys.modules['__main__']._Guard.untrusted = False\ntop = {top!r}\nfor probe in ("
        "lambda: os.rename(top, '/tmp/moved'), lambda: open(os.path.join(top, 'planted.py'), 'w'), "
        "lambda: os.mkdir(os.path.join(top, 'venv2'))):\n    try:\n        probe()\n        print('done')\n"
        "    except OSError as e:\n        print(e.errno)")
print("swap", " ".join(box.run(SWAP.format(top=sys.argv[2])).output.split()))
box.close()
'''


@pytest.fixture(scope="module")
def under_tmp() -> Path:
    place = Path(tempfile.mkdtemp(prefix="trace-jail-in-tmp-", dir="/tmp"))
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(place / "venv")], check=True, timeout=120)
        site = next((place / "venv" / "lib").glob("python*/site-packages"))
        (site / "probe_in_venv.py").write_text("VALUE = 'from the venv'\n")
        copy_host_side(place / "project")
        sandbox = place / "project" / "trace_gym" / "environments" / "sandbox"
        (sandbox / "probe_in_project.py").write_text("VALUE = 'from the project'\n")
        yield place
    finally:
        shutil.rmtree(place, ignore_errors=True)


@pytest.mark.parametrize("isolation", ["jail", "namespaces"])
def test_a_cell_imports_from_a_venv_and_a_project_under_tmp(under_tmp: Path, isolation: str) -> None:
    python = under_tmp / "venv" / "bin" / "python"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(under_tmp / "project")}
    proc = subprocess.run([str(python), "-c", SCRIPT, isolation, str(under_tmp)], env=env, cwd=under_tmp,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
    assert out["venv"] == "from the venv"
    assert out["project"] == "from the project"
    assert out["write"] == "x"  # the lineage's own /tmp is still writable around what is bound there
    assert under_tmp.name in out["tmp"]
    assert out["swap"] == "16 30 30"  # what is bound there cannot be moved aside (EBUSY) or added to (EROFS)


KILLED = r'''
import os, signal, sys
from trace_gym.environments.sandbox.host import PythonSandbox
box = PythonSandbox(isolation=sys.argv[1])
assert box.run("print(6*7)").output == "42\n"
print(os.getpid(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no exit handler runs
'''


def _made_by(pid: str) -> list[str]:
    return [name for name in os.listdir(tempfile.gettempdir()) if name.startswith(f"trace-sandbox-{pid}.")]


def test_a_host_killed_mid_run_leaves_nothing_in_the_temporary_folder() -> None:
    # The jailed levels make nothing there; isolation "none" makes a root for its lineages' folders, which the
    # next start removes once the process it was named for is gone.
    jailed = subprocess.run([sys.executable, "-c", KILLED, "jail"], capture_output=True, text=True, timeout=300)
    assert jailed.stdout.strip() and _made_by(jailed.stdout.strip()) == []
    unjailed = subprocess.run([sys.executable, "-c", KILLED, "none"], capture_output=True, text=True, timeout=300)
    pid = unjailed.stdout.strip()
    assert pid and len(_made_by(pid)) == 1  # what SIGKILL leaves ...
    again = subprocess.run([sys.executable, "-c", KILLED, "none"], capture_output=True, text=True, timeout=300)
    assert _made_by(pid) == []  # ... the next start removes
    for name in _made_by(again.stdout.strip()):
        shutil.rmtree(os.path.join(tempfile.gettempdir(), name), ignore_errors=True)


CLONE_SCRIPT = r'''
import sys, tomllib
from importlib.util import spec_from_file_location
from pathlib import Path

root = Path(sys.argv[1])
# The clone's packages as its pyproject lays them out (what an install of the clone would map), ahead of the
# running venv's own install of the project.
layout = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
places = {"trace_gym": root / "trace_gym", **{name: root / folder for name, folder in layout.items()}}


class CloneFinder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in places:
            return None
        return spec_from_file_location(name, places[name] / "__init__.py",
                                       submodule_search_locations=[str(places[name])])


sys.meta_path.insert(0, CloneFinder)
from trace_gym.environments.math import answers, jailed
from trace_gym.environments.sandbox import host

print("files", all(Path(m.__file__).resolve().is_relative_to(root) for m in (answers, jailed, host)))
score, info = answers.check_answer("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}")
print("right", score, info["method"])
score, info = answers.check_answer("\\frac{1}{\\sqrt{3}}", "\\frac{\\sqrt{2}}{2}")
print("wrong", score, info["method"])
box = host.PythonSandbox(host.SandboxLimits(timeout_s=20, cpu_s=20))
print("cell", box.run("import probe_in_clone\nprint(probe_in_clone.VALUE)").output.strip())
box.close()
'''


def test_a_clone_in_the_temporary_folder_checks_math_through_the_jail() -> None:
    """The project cloned into the system's temporary folder and run from there (with this venv): the symbolic
    answer check, which runs in the jail the clone's sandbox package starts, scores a right answer 1 and a wrong
    one 0, and a cell imports a module that exists only in the clone. What is tested is the project's last
    commit, as a fresh clone has it."""
    root = Path(__file__).resolve().parents[3]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("the project is not a git checkout here: nothing to clone")
    place = Path(tempfile.mkdtemp(prefix="trace-clone-in-tmp-", dir="/tmp"))
    try:
        clone = place / "trace-gym"
        subprocess.run(["git", "clone", "--quiet", str(root), str(clone)], check=True, capture_output=True,
                       timeout=300)
        (clone / "environments" / "sandbox" / "probe_in_clone.py").write_text("VALUE = 'from the clone'\n")
        env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        proc = subprocess.run([sys.executable, "-c", CLONE_SCRIPT, str(clone)], env=env, cwd=place,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
        assert out["files"] == "True"  # the clone's code ran, not this checkout's
        assert out["right"] in ("1.0 sympy", "1.0 math_verify")  # decided in the jail, not by the host's parser
        assert out["wrong"] == "0.0 mismatch"
        assert out["cell"] == "from the clone"
    finally:
        shutil.rmtree(place, ignore_errors=True)
