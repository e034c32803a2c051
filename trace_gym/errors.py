"""Programmer errors. Model mistakes never raise: they become error observations with ``info["error"]``."""

from __future__ import annotations


class TraceGymError(Exception):
    """Base class; messages say what was expected, what was given, and how to fix it."""


class ConfigError(TraceGymError, ValueError):
    """A setting or argument that cannot work."""


class SnapshotError(TraceGymError):
    """A snapshot that cannot be taken or restored into this environment."""


class DataError(TraceGymError):
    """A dataset file that is missing or does not have the expected layout."""
