"""scripts/gpu_check.sh: valid bash, refuses cleanly without a GPU, and its dry run (transformers backend on the
CPU) completes two steps with every check passing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh"


def test_script_is_valid_bash():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine runs the real check")
def test_script_refuses_without_a_gpu():
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 2
    assert "nvidia-smi not found" in done.stderr


@pytest.mark.slow
def test_dry_run_passes_every_check(tmp_path):
    pytest.importorskip("transformers")
    args = ["--backend", "hf", "--device", "cpu", "--roots", "2", "--sft-steps", "0", "--max-new-tokens", "8",
            "--out", str(tmp_path)]
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["failed"] == [] and len(report["steps"]) == 2
    assert {c["name"] for c in report["checks"]} >= {"step 1 sync", "step 2 sync",
                                                     "generation follows the synced weights"}
