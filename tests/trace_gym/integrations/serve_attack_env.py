"""What an operator's mistake or a hostile spec could name: a function with a side effect and a class that is
not an env. The server must refuse both without calling them (each leaves a marker file if called)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def leave_marker(**kwargs: Any) -> None:
    Path(os.environ["TRACE_GYM_TEST_MARKER"]).write_text("called")


class NotAnEnv:
    def __init__(self, **kwargs: Any):
        Path(os.environ["TRACE_GYM_TEST_MARKER"]).write_text("constructed")
