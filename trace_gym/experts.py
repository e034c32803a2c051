"""The scripted-expert protocol: policies that solve a task from its gold answer, with a noise knob.

They produce warm-start (SFT) data and drive tests of allocation before any model exists. Each env exposes its
expert through ``env.expert(noise, seed)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from trace_gym.tasks import Task


@runtime_checkable
class Expert(Protocol):
    """Returns the next action text for ``task`` given the chat ``messages`` so far (the env's
    ``info["messages"]``). Stochastic through its own seeded generator when ``noise > 0``."""

    def act(self, task: Task, messages: Sequence[Mapping[str, Any]]) -> str: ...
