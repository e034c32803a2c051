"""The README's code runs as written: each Python block in a fresh interpreter, and each shell command line in
README order in a scratch copy of the project (configs and the plugin example saved as my_envs.py).

Commands that train at full size are run with test-size settings appended (SHRUNK: the same command, the
same paths, a nano model and a few episodes); a command is left out only when it is in SKIPPED, with the
reason. A README command in neither list runs exactly as written.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)
SHELL = [re.sub(r"\s+#.*$", "", line).strip()
         for block in re.findall(r"```bash\n(.*?)```", README, flags=re.DOTALL) for line in block.splitlines()]
COMMANDS = [c for c in SHELL if c]

# Python blocks that need a server: tests/vllm/test_readme_served.py runs them against a real `vllm serve`.
SERVED = [b for b in BLOCKS if "openai:" in b]

# Settings that make the quickstart's training a test-sized run at the same paths (nano model, 2 steps).
TINY = ("model.init_size=nano sft.episodes=16 sft.steps=3 sft.batch_size=4 steps=2 alloc.roots=4 "
        "alloc.pool_size=4 alloc.group_size=4 alloc.cap=4 rollout.max_new_tokens=12 eval.tasks=2 eval.every=0 "
        "env.kwargs.n_tasks=20 env.eval_kwargs.n_tasks=4 env.workers=1 log.progress=false")
SHRUNK = {
    "trace-gym sft --model models/tiny --env trace/Arithmetic-v0":
        "--episodes 16 --steps 3 --batch-size 4 --eval-episodes 2",
    "trace-gym train --config configs/quickstart.yaml": TINY,
    "trace-gym train --config configs/quickstart.yaml alloc.allocator=grpo run_dir=runs/quickstart/grpo": TINY,
    "trace-gym eval --env trace/Arithmetic-v0 --policy models/tiny --tasks 20 --out results/tiny --trees":
        "--tasks 2 --max-new-tokens 16",
}
SERVED_EVAL = ("trace-gym eval --env trace/Arithmetic-v0 --env-arg max_turns=3 --policy openai:tiny --base-url "
               "http://127.0.0.1:8000/v1 --tasks 8 --max-new-tokens 32 --concurrency 8")
SKIPPED = {
    "make quickstart": "the full quickstart (minutes); its command, trace-gym train --config configs/quickstart.yaml, "
                       "runs here at test size",
    "make test": "this test suite",
    "vllm serve models/tiny --served-model-name tiny --port 8000 --enable-auto-tool-choice --tool-call-parser hermes":
        "needs vLLM: make test-vllm serves the model so",
    SERVED_EVAL: "needs a model server: tests/vllm runs it against a real vllm serve (make test-vllm)",
    ".venv/bin/python benchmarks/allocation.py": "a benchmark (tens of minutes)",
    ".venv/bin/python benchmarks/learning.py": "a benchmark (tens of minutes)",
    "make bench": "the benchmarks (minutes each)",
    "trace-gym model fetch smollm2-135m --out models/smollm2-135m": "downloads and converts a 540 MB model: make "
                                                                    "test-real fetches it and runs tests/real",
    "trace-gym eval --env trace/Arithmetic-v0 --policy models/smollm2-135m --tool-calls native --tasks 20 "
    "--max-new-tokens 64": "needs the fetched model: tests/real evaluates it with native tool calls (make test-real)",
    "trace-gym train --config configs/smollm2_arithmetic.yaml": "minutes a step on 2 cores: tests/real runs two "
                                                                "steps of this config (make test-real)",
}
# What a command must leave behind or print, beyond exit status 0.
CHECKS = {
    "trace-gym model init --out models/tiny --size tiny": lambda p, out: (p / "models/tiny/config.json").is_file(),
    "trace-gym train --resume runs/quickstart/rl": lambda p, out: "is complete" in out,
    "trace-gym eval --checkpoint runs/quickstart/rl": lambda p, out: "success" in out,
    "trace-gym view runs/quickstart/rl/trees.jsonl --out runs/quickstart/rl/trees.html":
        lambda p, out: (p / "runs/quickstart/rl/trees.html").is_file(),
    "trace-gym eval --env trace/Arithmetic-v0 --policy expert:0.2 --tasks 50 --samples 2":
        lambda p, out: "100 (50 tasks x 2 samples)" in out and "95% interval" in out,
    "trace-gym eval --env trace/Arithmetic-v0 --policy models/tiny --tasks 20 --out results/tiny --trees":
        lambda p, out: all((p / "results/tiny" / f).is_file() for f in ("rows.jsonl", "trees.jsonl", "summary.json")),
    "trace-gym view results/tiny/trees.jsonl --out results/tiny/trees.html":
        lambda p, out: (p / "results/tiny/trees.html").is_file(),
    "trace-gym rollout --env trace/HotpotQA-v0 --policy expert:0.3 --tasks 20 --branches 3 --out trees/hotpotqa.jsonl":
        lambda p, out: len((p / "trees/hotpotqa.jsonl").read_text().splitlines()) == 20,
    "trace-gym eval --env trace/HotpotQA-v0 --env-arg split=dev --env-arg max_turns=4 --policy expert --tasks 10 "
    "--json": lambda p, out: '"tasks": 10,' in out and '"split": "dev"' in out,
    "trace-gym plot runs/quickstart/rl": lambda p, out: (p / "runs/quickstart/rl/plots/overview.png").is_file(),
    "trace-gym plot runs/quickstart/rl runs/quickstart/grpo --out runs/quickstart/plots":
        lambda p, out: (p / "runs/quickstart/plots/overview.png").is_file(),
}


def run_fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_python_block_runs(block):
    if block in SERVED:
        pytest.skip("needs a model server: tests/vllm runs it against a real vllm serve (make test-vllm)")
    result = run_fresh(block)
    assert result.returncode == 0, result.stderr[-3000:]


def test_plugin_example_is_under_40_lines():
    plugin = next(b for b in BLOCKS if "class CapitalsEnv" in b)
    assert len([line for line in plugin.splitlines() if line.strip()]) < 40


def test_plugin_example_passes_the_conformance_checker():
    plugin = next(b for b in BLOCKS if "class CapitalsEnv" in b)
    result = run_fresh(plugin + "\nfrom trace_gym.checker import check_trace_env\ncheck_trace_env('my/Capitals-v0')\n")
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_skip_and_shrink_lists_name_only_readme_commands():
    assert set(SKIPPED) <= set(COMMANDS) and set(SHRUNK) <= set(COMMANDS) and set(CHECKS) <= set(COMMANDS)


ACTIVATE = ". .venv/bin/activate"


def test_the_readme_says_how_its_commands_reach_the_venvs_trace_gym():
    # A plain shell has no trace-gym on its PATH: the README activates the venv before its first command.
    first = next(i for i, c in enumerate(COMMANDS) if c.startswith("trace-gym"))
    assert ACTIVATE in COMMANDS[:first] and ".venv/bin/trace-gym" in README


@pytest.fixture(scope="module")
def shell_runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess[str]]:
    """Every README command line, in README order, in one scratch project (the quickstart's training first:
    the commands before it in the README read its run folder), each in a shell whose PATH lacks the venv until
    the README's activation line puts it there, as a new user's shell does."""
    project = tmp_path_factory.mktemp("project")
    shutil.copytree(ROOT / "configs", project / "configs")
    (project / "my_envs.py").write_text(next(b for b in BLOCKS if "class CapitalsEnv" in b))
    (project / ".venv").symlink_to(sys.prefix)  # the venv running the tests, where make venv puts it
    bin_dir = str(Path(sys.executable).parent)
    plain = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if d != bin_dir)
    env = {**{k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}, "PATH": plain, "COLUMNS": "100"}
    first = "trace-gym train --config configs/quickstart.yaml"
    results = {}
    for command in sorted(dict.fromkeys(COMMANDS), key=lambda c: c != first):
        if command in SKIPPED:
            continue
        line = f"{command} {SHRUNK[command]}" if command in SHRUNK else command
        line = line if command == ACTIVATE else f"{ACTIVATE} && {line}"
        results[command] = subprocess.run(["bash", "-c", line], cwd=project, env=env, capture_output=True,
                                          text=True, timeout=900)
        results[command].project = project  # type: ignore[attr-defined]
    return results


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c in dict.fromkeys(COMMANDS)])
def test_readme_shell_command_runs(shell_runs, command):
    if command in SKIPPED:
        pytest.skip(SKIPPED[command])
    result = shell_runs[command]
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "Traceback" not in output
    check = CHECKS.get(command)
    assert check is None or check(result.project, output), output[-3000:]  # type: ignore[attr-defined]
