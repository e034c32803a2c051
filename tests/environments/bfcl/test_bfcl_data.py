"""BFCL data layer: bundled files, function docs -> JSON Schema, the seeded 80/20 split, backends."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from trace_gym.environments.bfcl import backends
from trace_gym.environments.bfcl.calls import Call, parse_ground_truth_call
from trace_gym.environments.bfcl.data import (
    FUNC_DOC_FILES,
    MULTI_TURN_CATEGORIES,
    SINGLE_TURN_CATEGORIES,
    entry_functions,
    func_docs,
    load_entries,
    split_ids,
)
from trace_gym.environments.bfcl.schema import parameters_schema, to_json_schema, tool_schema


def test_bundled_counts_match_source_md():
    counts = {c: len(load_entries(c)) for c in MULTI_TURN_CATEGORIES + SINGLE_TURN_CATEGORIES}
    assert counts == {"multi_turn_base": 200, "multi_turn_miss_func": 200, "multi_turn_miss_param": 200,
                      "multi_turn_long_context": 200, "simple_python": 400, "multiple": 200, "parallel": 200,
                      "parallel_multiple": 200, "irrelevance": 240}


def test_type_mapping_follows_bfcl():
    node = {"type": "dict", "properties": {
        "a": {"type": "float"}, "b": {"type": "tuple", "items": {"type": "integer"}}, "c": {"type": "any"},
        "d": {"type": "dict", "properties": {"e": {"type": "string", "enum": ["x"]}}}}, "required": ["a"]}
    assert to_json_schema(node) == {"type": "object", "required": ["a"], "properties": {
        "a": {"type": "number"}, "b": {"type": "array", "items": {"type": "integer"}}, "c": {},
        "d": {"type": "object", "properties": {"e": {"type": "string", "enum": ["x"]}}}}}


def test_every_function_doc_converts_to_a_valid_json_schema():
    docs = [d for c in FUNC_DOC_FILES for d in func_docs(c)]
    docs += [f for c in SINGLE_TURN_CATEGORIES for e in load_entries(c) for f in e["function"]]
    for doc in docs:
        jsonschema.Draft202012Validator.check_schema(parameters_schema(doc))
        json.dumps(tool_schema(doc))


def test_split_is_deterministic_disjoint_and_80_20():
    for category in MULTI_TURN_CATEGORIES:
        ids = [e["id"] for e in load_entries(category)]
        train, test = split_ids(ids, "train"), split_ids(ids, "test")
        assert (len(train), len(test)) == (160, 40)
        assert not set(train) & set(test) and set(train) | set(test) == set(ids)
        assert split_ids(list(reversed(ids)), "train") == list(reversed(train))  # order-free membership
        assert split_ids(ids, "train", seed="other") != train


def test_miss_func_holds_functions_out_until_their_turn():
    entry = next(e for e in load_entries("multi_turn_miss_func") if e["id"] == "multi_turn_miss_func_0")
    visible, held = entry_functions(entry)
    names = {d["name"] for d in visible}
    assert held and all(entry["question"][turn] == [] for turn in held)
    assert all(d["name"] not in names for docs in held.values() for d in docs)


def test_ground_truth_calls_pass_validation_and_strict_types_catch_a_wrong_type():
    entry = load_entries("multi_turn_base")[0]
    instances = backends.make_instances(entry, long_context=False)
    owners = backends.method_owners(instances)
    docs = {d["name"]: d for d in entry_functions(entry)[0]}
    lenient, strict = backends.Validators(), backends.Validators(strict_types=True)
    for source in entry["ground_truth"][0]:
        call = parse_ground_truth_call(source)
        assert lenient.validate(docs[call.name], backends.keyword_call(entry["involved_classes"], call)
                                .arguments) is None
    assert strict.validate(docs["cd"], {"folder": 3}) is not None
    assert lenient.validate(docs["cd"], {"folder": 3}) is None
    assert lenient.validate(docs["cd"], {"folderx": "a"}) is not None  # unknown names always refused
    text, ok = backends.execute(instances, owners, docs, lenient, Call("cd", {}))
    assert not ok and "folder" in text


def test_backend_instances_deep_copy_independently():
    entry = load_entries("multi_turn_base")[0]
    instances = backends.make_instances(entry, long_context=False)
    owners = backends.method_owners(instances)
    docs = {d["name"]: d for d in entry_functions(entry)[0]}
    before = copy.deepcopy(instances)
    backends.execute(instances, owners, docs, backends.Validators(), Call("mkdir", {"dir_name": "new_dir"}))
    fs = "GorillaFileSystem"
    assert vars(before[fs]) != vars(instances[fs])
    assert vars(before[fs]) == vars(backends.make_instances(entry, long_context=False)[fs])


def test_unknown_backend_class_is_a_clear_error():
    with pytest.raises(ValueError, match="expected a BFCL backend class"):
        backends.backend_class("MemoryAPI_vector")
