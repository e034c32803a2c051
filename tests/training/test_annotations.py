"""The viewer's annotation schema, written from the stages' records, survives JSON and is what the viewer shows."""

from __future__ import annotations

import json

import pytest

from tests.training.allocation.test_stages import planned_step, record_tokens
from trace_gym.training.step import SCHEMA_KEYS, annotate, build_samples
from trace_gym.training.viz.viewer import load_trees, page_data
from trace_gym.tree import RolloutTree


def annotated():
    trees, roots, plan, _ = planned_step()
    record_tokens(trees, action=(1,), logprob=-1.0)
    samples = build_samples(trees, "tree_grpo")
    annotate(trees, roots, plan, samples)
    return trees, roots, plan, samples


def test_annotations_hold_each_decision_of_the_records():
    trees, roots, plan, samples = annotated()
    choices = {(c.task_id, c.node_id): c for c in plan.prefixes}
    for tid, tree in trees.items():
        root = tree.root.meta
        assert root["predicted"] == roots.value(tid)
        assert root["alloc"] == {"continuations": roots.counts[tid], "utility": roots.utility(tid), "stage": "root"}
        assert root.get("root_extra", 0) == plan.root_extra.get(tid, 0)
        for node in tree.nodes[1:]:
            assert set(node.meta) <= set(SCHEMA_KEYS)
            assert node.meta.get("advantage") == samples.advantages[tid].get(node.id)
            c = choices.get((tid, node.id))
            if c is None:
                assert "predicted" not in node.meta and "alloc" not in node.meta
                continue
            assert node.meta["predicted"] == c.value
            if c.continuations:
                assert node.meta["alloc"] == {"continuations": c.continuations, "utility": c.utility,
                                              "stage": "prefix"}
            else:
                assert "alloc" not in node.meta


def test_annotated_trees_round_trip_through_json_and_the_viewer(tmp_path):
    trees, _, plan, _ = annotated()
    path = tmp_path / "trees.jsonl"
    path.write_text("".join(json.dumps({"step": 1, **t.to_dict()}) + "\n" for t in trees.values()))
    assert [RolloutTree.from_json(t.to_json()).to_dict() for t in trees.values()] == [
        t.to_dict() for t in trees.values()]
    shown = page_data(load_trees([path]))["trees"]
    assert [t["task_id"] for t in shown] == list(trees)
    for data, tree in zip(shown, trees.values()):
        assert [n["predicted"] for n in data["nodes"]] == [n.meta.get("predicted") for n in tree.nodes]
        assert [n["alloc"] for n in data["nodes"]] == [n.meta.get("alloc") for n in tree.nodes]
        assert [n["advantage"] for n in data["nodes"]] == [
            pytest.approx(n.meta["advantage"]) if "advantage" in n.meta else None for n in tree.nodes]
        assert data["nodes"][0]["root_extra"] == tree.root.meta.get("root_extra")
    assert sum(n["alloc"]["continuations"] for t in shown for n in t["nodes"]
               if n["alloc"] and n["alloc"]["stage"] == "prefix") == sum(c.continuations for c in plan.prefixes)
