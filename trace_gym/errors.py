"""The project's exceptions. Model mistakes never raise out of ``step``: they become error observations with
``info["error"]``. A tool says that a call was the model's mistake by raising ``ToolError``; any other exception
from a tool is a setup failure or a bug and propagates.

``UserError`` and its subclasses are mistakes a user can fix (a setting, a file, a server, a missing package or
sandbox layer): the ``trace-gym`` command prints them as one line, ``error: ...; fix: ...``, and exits with status
2. A caller that breaks a contract (a policy returning no text, an action that is not a string) gets a
``TypeError``; everything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class TraceGymError(Exception):
    """Base class; messages say what was expected, what was given, and how to fix it."""


class UserError(TraceGymError):
    """A mistake the user can fix without touching the code; the CLI reports it in one line."""


class ConfigError(UserError, ValueError):
    """A setting or argument that cannot work."""


class SetupError(UserError):
    """This machine lacks something a run needs: an optional package, a layer of the sandbox's jail, a user the
    sandbox runs as. The message names what to install or set (as gymnasium's ``DependencyNotInstalled``)."""


class DataError(UserError):
    """A dataset file that is missing or does not have the expected layout."""


class ServerError(UserError):
    """A model server that kept failing (or refused the request) after all retries."""


class InfraError(TraceGymError):
    """Shared infrastructure failed a turn for reasons of neither the model nor the user (no answer checker free
    in time). ``TextEnv.step`` reports it and does not score the turn: reward 0.0, ``truncated=True``,
    ``info["stop_reason"] = "infra_error"`` and the reason in ``info["error"]``; a trainer leaves such an
    episode out of its update and an evaluation counts it apart."""


class ToolError(TraceGymError):
    """Raised by a tool for a mistake in the model's call (a value out of range, a missing file): the env answers
    the call with ``Error: <message>``. Write the message for the model: what was wrong and what would work."""


class SnapshotError(TraceGymError):
    """A snapshot that cannot be taken or restored into this environment."""


def nearest(name: str, choices: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The choice closest to ``name`` (difflib's ratio, at least ``cutoff``), or None."""
    found = difflib.get_close_matches(name, list(choices), n=1, cutoff=cutoff)
    return found[0] if found else None


def did_you_mean(name: str, choices: Iterable[str], cutoff: float = 0.6) -> str:
    """``"did you mean 'x'? "`` for the nearest choice, or ``""`` when none is close: a prefix for a fix."""
    found = nearest(name, choices, cutoff)
    return f"did you mean {found!r}? " if found is not None else ""
