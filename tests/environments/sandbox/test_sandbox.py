"""The Python sandbox: notebook semantics, persistent state, limits, and the fork/replay snapshot contract."""

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.environments.sandbox.leaks import settled
from trace_gym.environments.sandbox import reaper
from trace_gym.environments.sandbox.host import PythonSandbox, SandboxLimits, sandbox_processes

FAST = SandboxLimits(timeout_s=3.0, cpu_s=6, max_output_chars=200)  # a spinning cell meets the wall clock first


@pytest.fixture
def box():
    sandbox = PythonSandbox(FAST)
    yield sandbox
    sandbox.close()


def test_prints_and_last_expression_value_come_back(box: PythonSandbox) -> None:
    result = box.run("print('hi')\n6 * 7")
    assert result.output == "hi\n42\n" and result.ok


def test_exception_reports_traceback_tail_and_keeps_earlier_effects(box: PythonSandbox) -> None:
    result = box.run("y = 5\nz = 1 / 0")
    assert result.status == "error" and "ZeroDivisionError" in result.output and "sandbox.py" not in result.output
    assert box.run("y").output == "5\n"


def test_long_output_is_truncated_with_a_note(box: PythonSandbox) -> None:
    out = box.run("print('x' * 10_000)").output
    assert out.startswith("x" * 200) and "truncated" in out and len(out) < 400


def test_preloaded_modules_are_ready(box: PythonSandbox) -> None:
    assert box.run("np.int64(2) + sp.Integer(3), math.gcd(12, 18), Fraction(1, 3)").ok


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(-10**6, 10**6), min_size=1, max_size=5))
def test_state_carries_across_cells(values: list[int]) -> None:
    with PythonSandbox(FAST) as box:
        box.run("acc = []")
        for v in values:
            box.run(f"acc.append({v})")
        assert box.run("sum(acc)").output == f"{sum(values)}\n"


@settings(max_examples=6, deadline=None)
@given(st.integers(0, 1000), st.integers(0, 1000))
def test_fork_isolation_both_ways(before: int, after: int) -> None:
    with PythonSandbox(FAST) as box:
        box.run(f"v = {before}")
        snap = box.snapshot()
        box.run(f"v = {after} + 1")  # the original changes after the snapshot: the snapshot must not see it
        branch = PythonSandbox(FAST)
        branch.restore(snap)
        assert branch.run("v").output == f"{before}\n"
        branch.run("v = -1")  # the branch changes: neither the original nor the snapshot may see it
        assert box.run("v").output == f"{after + 1}\n"
        again = PythonSandbox(FAST)
        again.restore(snap)
        assert again.run("v").output == f"{before}\n"
        branch.close(), again.close()
        snap.release()


CELLS = st.sampled_from(["a = 3", "a = a * 2 if 'a' in dir() else 1", "b = [a] * 2 if 'a' in dir() else []",
                         "print(len(b) if 'b' in dir() else 0)", "import random; print(random.random())",
                         "open('f.txt', 'a').write('x'); print(open('f.txt').read())", "1/0"])


@settings(max_examples=6, deadline=None)
@given(st.lists(CELLS, min_size=1, max_size=4), st.lists(CELLS, min_size=1, max_size=3))
def test_replay_equals_native_restore(prefix: list[str], future: list[str]) -> None:
    with PythonSandbox(FAST) as box:
        for code in prefix:
            box.run(code)
        native, portable = box.snapshot(native=True), box.snapshot(native=False)
        outputs = []
        for snap in (native, portable):
            branch = PythonSandbox(FAST)
            branch.restore(snap)
            outputs.append([branch.run(code) for code in future])
            branch.close()
        assert outputs[0] == outputs[1]
        native.release()


def test_working_directory_is_private_and_removed(box: PythonSandbox) -> None:
    box.run("open('data.txt', 'w').write('1')")
    seen = box.host_workdir  # in the lineage's own mount namespace, not on the host's disk
    assert seen and box.workdir and not os.path.exists(box.workdir)
    with open(os.path.join(seen, "data.txt")) as f:
        assert f.read() == "1"
    box.close()
    assert reaper.wait(10.0)  # close() returns with the lineage killed; the reaper sees it gone
    assert not os.path.exists(seen)


def test_release_and_close_end_every_process() -> None:
    box = PythonSandbox(FAST)
    box.run("x = 1")
    snaps = [box.snapshot() for _ in range(3)]
    assert len(sandbox_processes()) >= 4
    for s in snaps:
        s.release()
    box.close()
    assert len(settled()) == 0


def test_garbage_collected_snapshot_ends_its_process() -> None:
    box = PythonSandbox(FAST)
    box.run("x = 1")
    snap = box.snapshot()
    pid = snap._frozen.pid
    del snap
    import gc

    gc.collect()
    box.close()
    assert pid not in sandbox_processes()




def test_finished_workers_are_reaped_not_left_as_zombies() -> None:
    # Each committed cell retires a worker; unreaped, they exhausted RLIMIT_NPROC after ~4000 cells.
    for _ in range(3):
        box = PythonSandbox(FAST)
        for i in range(10):
            box.run(f"x = {i}")
        box.close()
    assert len(settled()) == 0


@pytest.fixture
def high_descriptors():
    """Fill the low descriptor numbers so that every new socket and pidfd is numbered past 1024, as in a
    trainer that holds hundreds of native snapshots (select() cannot wait on those)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_descriptors_past_1024_run_cells_snapshots_and_bounded_calls(high_descriptors) -> None:
    from trace_gym.environments.sandbox.bounded import bounded_call

    with PythonSandbox(FAST) as box:
        box.run("v = 41")
        snap = box.snapshot(native=True)
        branch = PythonSandbox(FAST)
        branch.restore(snap)
        assert branch.run("print(v + 1)").output == "42\n"
        spin = box.run("while True: pass")
        assert spin.status == "timeout", spin.output  # the deadline is waited on, not skipped
        branch.close()
        snap.release()
    assert bounded_call(sum, [1, 2, 3]).value == 6
