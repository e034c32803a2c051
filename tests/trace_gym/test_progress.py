"""The one progress helper: plain lines (count, rate, elapsed, ETA, shown values) when the output is not a
terminal, a rich bar when it is, and an import that needs no torch."""

from __future__ import annotations

import io
import subprocess
import sys

from rich.console import Console

from trace_gym.progress import Progress, format_duration


def test_plain_lines_give_the_count_rate_elapsed_and_eta():
    out = io.StringIO()
    with Progress("sft", total=4, unit="step", interval=0, stream=out) as bar:
        for loss in (0.9, 0.5, 0.25, 0.125):
            bar.update(advance=1, loss=loss)
    lines = out.getvalue().splitlines()
    assert len(lines) == 4 and lines[0].startswith("sft 1/4 25% | ") and "step/s" in lines[0]
    assert "eta " in lines[0] and "loss 0.9000" in lines[0]
    assert lines[-1].startswith("sft 4/4 100% | ") and "eta" not in lines[-1] and "loss 0.1250" in lines[-1]


def test_a_long_interval_prints_the_first_and_the_last_update_only():
    out = io.StringIO()
    with Progress("train", total=50, interval=3600, stream=out) as bar:
        for _ in range(50):
            bar.update(advance=1, succ=0.5)
    lines = out.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["train 1/50 2%", "train 50/50 100%"]


def test_counts_set_from_outside_and_a_late_total():
    out = io.StringIO()
    with Progress("eval episodes", unit="episode", interval=0, stream=out) as bar:
        bar.update(done=3, total=10)
        bar.update(done=10, total=10)
    assert out.getvalue().splitlines()[-1].startswith("eval episodes 10/10 100%")


def test_a_terminal_gets_the_bar_and_no_plain_lines():
    screen, log = io.StringIO(), io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    with Progress("train", total=3, console=console, interval=0, stream=log) as bar:
        for _ in range(3):
            bar.update(advance=1, succ=0.25)
    assert log.getvalue() == "" and "3/3" in screen.getvalue() and bar.lines == 0


def test_disabled_progress_shows_nothing():
    out = io.StringIO()
    with Progress("sft", total=2, enabled=False, interval=0, stream=out) as bar:
        bar.update(advance=2)
    assert out.getvalue() == ""


def test_durations_read_as_clock_times():
    assert [format_duration(s) for s in (5, 725, 3723, float("inf"))] == ["0:05", "12:05", "1:02:03", "?"]


def test_the_helper_imports_without_torch():
    code = "import sys, trace_gym.progress; assert 'torch' not in sys.modules, 'torch imported'"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode == 0


def test_the_finished_count_is_printed_once():
    out = io.StringIO()
    with Progress("eval episodes", total=3, interval=0, stream=out) as bar:
        bar.update(done=3)
        bar.update(done=3)
    assert len(out.getvalue().splitlines()) == 1


def test_a_quiet_stretch_still_gets_a_line_every_interval():
    """Work that counts nothing for a while (a long step, a slow first episode) is not silence in a log."""
    import threading

    out, seen = io.StringIO(), threading.Event()

    class Stream(io.StringIO):
        def write(self, text: str) -> int:
            out.write(text)
            if out.getvalue().count("\n") >= 2:
                seen.set()
            return len(text)

    with Progress("sft held-out", total=5, unit="episode", interval=0.01, stream=Stream()) as bar:
        assert seen.wait(60)  # no update yet: the lines are the heartbeat's
        bar.update(done=5)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("sft held-out 0/5 0% | ") and "elapsed " in lines[0]
    assert lines[-1].startswith("sft held-out 5/5 100%")
