"""Progress of a counted job (SFT steps, training steps, evaluation and rollout episodes), the one place that
draws it: a rich bar on a terminal, plain lines elsewhere (a log file, a pipe, a cluster job, CI).

A plain line reads ``train 3/10 30% | 0.52 step/s | elapsed 0:05 | eta 0:13 | succ 0.500``. Lines go to
stderr, so that a command's own output on stdout (a table, ``--json``) stays clean: the first update, then at
most one every ``interval`` seconds (``$TRACE_GYM_PROGRESS_INTERVAL``, default 10), and the last one. While
nothing is counted (a long step, a slow first episode) a line still comes every ``interval`` seconds, its
elapsed time growing, so that a log never falls silent while work goes on. No torch, no third-party import but
rich, and that only on a terminal.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from typing import Any, TextIO

__all__ = ["Progress", "format_duration"]

DEFAULT_INTERVAL = 10.0


def format_duration(seconds: float) -> str:
    """``0:05``, ``12:03``, ``1:02:03``; ``?`` when unknown."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


class Progress:
    """``with Progress("sft", total=400, unit="step") as bar: bar.update(advance=1, loss=0.3)``.

    ``console``: a rich Console; the bar is drawn on it when it is a terminal (default: a terminal stderr).
    ``enabled=False`` shows nothing. ``update(done=..., total=..., advance=..., **info)`` is thread-safe; info
    values (floats are shown with 3 decimals, ``loss`` with 4) stay shown until replaced.
    """

    def __init__(self, label: str, total: int | None = None, done: int = 0, unit: str = "step",
                 console: Any = None, enabled: bool = True, interval: float | None = None,
                 transient: bool = False, stream: TextIO | None = None):
        self.label, self.total, self.done, self.unit = label, total, done, unit
        self.enabled, self.transient = enabled, transient
        self.console, self._stream = console, stream
        self.interval = _interval() if interval is None else interval
        self.info: dict[str, Any] = {}
        self.lines = 0  # plain lines printed so far
        self._start_done, self._t0 = done, time.monotonic()
        self._last_line = -math.inf
        self._printed: int | None = None  # the count of the last plain line
        self._lock = threading.Lock()
        self._bar: Any = None
        self._task: Any = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    @property
    def terminal(self) -> bool:
        """Whether the output is a terminal (the bar) rather than a file or a pipe (plain lines)."""
        if self.console is not None:
            return bool(self.console.is_terminal)
        stream = self._stream or sys.stderr
        return bool(getattr(stream, "isatty", lambda: False)())

    def __enter__(self) -> Progress:
        self._t0 = time.monotonic()
        if self.enabled and self.terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            kwargs = {"console": self.console} if self.console is not None else {}
            self._bar = RichProgress(TextColumn(self.label), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                     transient=self.transient, **kwargs)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total, completed=self.done, info="")
        elif self.enabled and self.interval > 0:
            self._beat = threading.Thread(target=self._heartbeat, name=f"progress-{self.label}", daemon=True)
            self._beat.start()
        return self

    def _heartbeat(self) -> None:
        """A plain line every ``interval`` seconds in which no update printed one (module docstring)."""
        def quiet() -> float:  # since the last line, or the start
            return time.monotonic() - max(self._last_line, self._t0)

        while not self._stop.wait(max(self.interval - quiet(), 0.01)):
            with self._lock:
                if quiet() >= self.interval:
                    self._last_line = time.monotonic()
                    self._print(self.line())

    def update(self, done: int | None = None, total: int | None = None, advance: int = 0, **info: Any) -> None:
        """Set the count (``done``) or add to it (``advance``), and the total and shown values."""
        if not self.enabled:
            return
        with self._lock:
            if total is not None:
                self.total = total
            self.done = (done if done is not None else self.done) + advance
            self.info.update({k: v for k, v in info.items() if v is not None})
            if self._bar is not None:
                self._bar.update(self._task, completed=self.done, total=self.total, info=self._info_text())
                return
            now = time.monotonic()
            finished = self.total is not None and self.done >= self.total
            if self.done != self._printed and (finished or now - self._last_line >= self.interval):
                self._last_line, self._printed = now, self.done
                self._print(self.line())

    def line(self) -> str:
        """The plain progress line for the current count (module docstring)."""
        elapsed = time.monotonic() - self._t0
        rate = (self.done - self._start_done) / elapsed if elapsed > 0 else 0.0
        parts = [f"{self.label} {self.done}/{self.total}" + (f" {100 * self.done / self.total:.0f}%"
                                                             if self.total else "") if self.total is not None
                 else f"{self.label} {self.done}"]
        parts.append(f"{rate:.3g} {self.unit}/s" if rate >= 0.1 or rate == 0 else f"{1 / rate:.3g} s/{self.unit}")
        parts.append(f"elapsed {format_duration(elapsed)}")
        if self.total is not None and self.done < self.total:
            parts.append(f"eta {format_duration((self.total - self.done) / rate) if rate > 0 else '?'}")
        if self.info:
            parts.append(self._info_text())
        return " | ".join(parts)

    def _info_text(self) -> str:
        return "  ".join(f"{k} {_fmt(k, v)}" for k, v in self.info.items())

    def _print(self, text: str) -> None:
        stream = self._stream or sys.stderr
        print(text, file=stream, flush=True)
        self.lines += 1

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        if self._bar is not None:
            self._bar.stop()


def _fmt(key: str, value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4f}" if key == "loss" else f"{value:.3f}"
    return str(value)


def _interval() -> float:
    raw = os.environ.get("TRACE_GYM_PROGRESS_INTERVAL")
    try:
        return max(float(raw), 0.0) if raw else DEFAULT_INTERVAL
    except ValueError:
        return DEFAULT_INTERVAL
