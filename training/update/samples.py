"""`Sample`: one trained node of a step, as the policy update takes it (torch-free, so that a step without an
update, as in the simulation, needs no torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Sample:
    """One trained node: its context ids, its action ids, their behaviour logprobs, one advantage."""

    context: list[int]
    action: list[int]
    logprobs: list[float]
    advantage: float
