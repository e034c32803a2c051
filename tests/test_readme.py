"""The README's code runs as written, each block in a fresh interpreter."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def run_fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_python_block_runs(block):
    result = run_fresh(block)
    assert result.returncode == 0, result.stderr[-3000:]


def test_plugin_example_is_under_40_lines():
    plugin = next(b for b in BLOCKS if "class CapitalsEnv" in b)
    assert len([line for line in plugin.splitlines() if line.strip()]) < 40


def test_plugin_example_passes_the_conformance_checker():
    plugin = next(b for b in BLOCKS if "class CapitalsEnv" in b)
    result = run_fresh(plugin + "\nfrom trace_gym.checker import check_trace_env\ncheck_trace_env('my/Capitals-v0')\n")
    assert result.returncode == 0, result.stderr[-3000:]
