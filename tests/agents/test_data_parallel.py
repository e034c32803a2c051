"""SFT split over processes (agents/data_parallel.py): the same model as one process, and no rank outlives a failure.

Every test runs real spawned ranks on the nano model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from tests.agents.calc_env import CalcEnv
from trace_gym import processes, threads
from trace_gym.agents import data_parallel
from trace_gym.agents.sft import MAX_PROCESSES, SFTSettings, masked_lm_loss, sft
from trace_gym.training.driver.warm_start import collect_expert_episodes

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def calc_data():
    return collect_expert_episodes(lambda: CalcEnv("train", digits=1), 40)


def _ranks() -> list[int]:
    """This process's spawned data-parallel ranks."""
    return [pid for pid in processes.children(os.getpid(), live=True)
            if b"trace_gym.agents.data_parallel" in _cmdline(pid)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _gone(pids: list[int], within_s: float = 30.0) -> bool:
    """The pids ended (a zombie left to an init that does not reap counts as ended) within ``within_s``."""
    deadline = time.monotonic() + within_s
    while not all(processes.state(pid) in (None, "Z") for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _teams() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("trace-gym-dp-*")} if Path("/dev/shm").is_dir() else set()


@pytest.mark.parametrize("lora_r", [0, 4])
def test_two_processes_train_the_model_one_process_trains(nano_dir, calc_data, tmp_path, lora_r):
    from transformers import AutoModelForCausalLM

    results, models = [], []
    for n in (1, 2):
        torch.manual_seed(0)  # LoRA's adapter starts random: the same start in both runs
        settings = SFTSettings(steps=4, batch_size=6, warmup_steps=1, lora_r=lora_r, lora_alpha=8, processes=n)
        results.append(sft(nano_dir, calc_data, tmp_path / str(n), settings, progress=False))
        models.append(AutoModelForCausalLM.from_pretrained(tmp_path / str(n)).state_dict())
    torch.testing.assert_close(results[1].losses, results[0].losses, rtol=1e-5, atol=1e-6)
    assert results[0].losses[-1] < results[0].losses[0]
    for key, value in models[0].items():
        torch.testing.assert_close(models[1][key], value, rtol=1e-4, atol=1e-5)


def test_the_default_is_one_process_per_core_for_a_small_model_only(monkeypatch):
    for name in threads.ENV_OVERRIDE:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "_state", {**threads._state, "configured": False})
    cores = threads.usable_cores()
    assert SFTSettings().resolved(800_000).processes == min(cores, 32)
    assert SFTSettings(batch_size=1).resolved(800_000).processes == 1  # a process per sequence at most
    assert SFTSettings().resolved(135_000_000).processes == 1  # a copy per process would double its memory
    assert SFTSettings(processes=3).resolved(135_000_000).processes == 3
    monkeypatch.setattr(threads, "usable_cores", lambda: 64)
    assert SFTSettings().resolved(800_000).processes == MAX_PROCESSES  # an interpreter each: a few, not 64
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user's thread count rules
    assert SFTSettings().resolved(800_000).processes == 1


def test_a_rank_that_dies_stops_training_with_its_exit_code(nano_dir, calc_data, tmp_path):
    seen: list[int] = []
    before = _teams()
    unlinked: list[bool] = []

    def kill_rank(step, loss, model):
        if step == 1:
            unlinked.append(_teams() == before)  # every rank has mapped the memory: its name is gone
            seen.extend(_ranks())
            os.kill(seen[0], signal.SIGKILL)

    with pytest.raises(data_parallel.RankFailed, match="rank 1 exited with code -9"):
        sft(nano_dir, calc_data, tmp_path / "out", SFTSettings(steps=50, batch_size=4, processes=2),
            progress=False, on_step=kill_rank)
    assert unlinked == [True] and len(seen) == 1 and _gone(seen) and _teams() == before
    assert not (tmp_path / "out").exists()  # nothing saved from a failed run


def test_an_error_on_rank_0_ends_the_other_ranks(nano_dir, calc_data, tmp_path):
    seen: list[int] = []
    before = _teams()

    def fail(step, loss, model):
        if step == 2:
            seen.extend(_ranks())
            raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        sft(nano_dir, calc_data, tmp_path / "out", SFTSettings(steps=50, batch_size=4, processes=3),
            progress=False, on_step=fail)
    assert len(seen) == 2 and _gone(seen, within_s=0.0) and _teams() == before  # reaped before sft returned


def test_ranks_exit_and_clean_up_when_rank_0_is_killed(nano_dir, tmp_path):
    script = textwrap.dedent(f"""
        import os, signal, sys
        from tests.agents.calc_env import CalcEnv
        from tests.agents.test_data_parallel import _ranks
        from trace_gym.agents.sft import MAX_PROCESSES, SFTSettings, masked_lm_loss, sft
        from trace_gym.training.driver.warm_start import collect_expert_episodes

        data = collect_expert_episodes(lambda: CalcEnv("train", digits=1), 20)

        def die(step, loss, model):
            if step == 1:
                print(" ".join(map(str, _ranks())), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

        sft({str(nano_dir)!r}, data, {str(tmp_path / "out")!r}, SFTSettings(steps=50, batch_size=4, processes=2),
            progress=False, on_step=die)
        """)
    before = _teams()
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    ranks = [int(pid) for pid in out.stdout.split()]
    assert len(ranks) == 1 and _gone(ranks)
    deadline = time.monotonic() + 10.0
    while _teams() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _teams() == before  # the orphaned rank removed the shared memory


def test_the_shared_memory_leaves_dev_shm_for_the_disk_when_it_has_no_room():
    assert data_parallel._memory_dir(10**18) is None  # tempfile's directory: a full tmpfs would kill with SIGBUS
    if Path("/dev/shm").is_dir():
        assert data_parallel._memory_dir(1) == "/dev/shm"


def test_rows_without_trained_tokens_give_a_zero_loss_that_backpropagates(nano_dir):
    """A rank's share of a batch may hold no trained token; its loss must still take part in the backward pass."""
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[5, 6, 7, 8]])
    model = AutoModelForCausalLM.from_pretrained(nano_dir)
    loss = masked_lm_loss(model, ids, torch.zeros_like(ids, dtype=torch.bool), torch.ones_like(ids), chunk=1024)
    loss.backward()
    assert float(loss.detach()) == 0.0


def test_a_team_takes_only_functions_a_fresh_interpreter_can_import():
    def local(rank, shared):
        pass

    with data_parallel.Team(2, [torch.zeros(3)]) as team, pytest.raises(TypeError, match="module-level"):
        team.start(local)
    assert not team.dir.exists()
