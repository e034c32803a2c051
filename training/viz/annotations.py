"""The viewer's annotation schema, written in one place from the stages' records (stages.py).

Keys of ``node.meta`` that `viewer.py` reads (and nothing else writes):
- ``predicted``: the success estimate Ṽ(H) the allocation saw for the prefix ending at this node (float in
  [0, 1]); stage 1's at a root, stage 2's at an open prefix; absent when the allocator chose without one.
- ``alloc``: the allocation decision taken at this node, ``{"continuations": k, "utility": u, "stage": s}``:
  ``k`` root rollouts chosen by U_root (``s == "root"``, on every started root) or ``k`` continuations chosen
  by U_pref (``s == "prefix"``, only where k > 0); ``u`` is None when no estimate was used.
- ``root_extra``: on a root, continuations spent there because the prompt had no open prefix.
- ``advantage``: the node's advantage in the policy update (trained nodes only).

Other keys (written by a user's own code) the viewer lists as they are. The collector's token record has typed
fields of its own (``Node.prompt_ids``, ``obs_ids``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping

from trace_gym.training.allocation.stages import ContinuationPlan, RootAllocation, StepSamples
from trace_gym.tree import RolloutTree

SCHEMA_KEYS = ("predicted", "alloc", "root_extra", "advantage")


def annotate(trees: Mapping[str, RolloutTree], roots: RootAllocation | None = None,
             plan: ContinuationPlan | None = None, samples: StepSamples | None = None) -> None:
    """Write the records' decisions into ``trees`` (task id -> tree) under the keys above."""
    for tid, tree in trees.items():
        meta = tree.root.meta
        if roots is not None:
            v = roots.value(tid)
            if v is not None:
                meta["predicted"] = v
            meta["alloc"] = {"continuations": roots.counts.get(tid, 0), "utility": roots.utility(tid),
                             "stage": "root"}
        if plan is not None and plan.root_extra.get(tid):
            meta["root_extra"] = plan.root_extra[tid]
        if samples is not None:
            for node_id, adv in samples.advantages.get(tid, {}).items():
                tree[node_id].meta["advantage"] = adv
    if plan is None:
        return
    for choice in plan.prefixes:
        meta = trees[choice.task_id][choice.node_id].meta
        if choice.value is not None:
            meta["predicted"] = choice.value
        if choice.continuations:
            meta["alloc"] = {"continuations": choice.continuations, "utility": choice.utility, "stage": "prefix"}
