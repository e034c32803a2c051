"""BFCL function docs -> JSON Schema (draft 2020-12) and OpenAI tool format.

BFCL types are Python-flavoured (bfcl_eval/constants/type_mappings.py GORILLA_TO_OPENAPI): `dict` is an
object, `float` a number, `tuple` an array, `any` has no type constraint."""

from __future__ import annotations

from typing import Any

_TYPES = {
    "dict": "object",
    "object": "object",
    "float": "number",
    "number": "number",
    "integer": "integer",
    "string": "string",
    "boolean": "boolean",
    "array": "array",
    "tuple": "array",
    "list": "array",
}
# Keys that describe values, copied as they are; BFCL's own extras (`optional`, `default` on required
# params, `format` free text) are documentation, kept only where JSON Schema gives them the same meaning.
_COPIED = ("description", "enum", "default", "maximum", "minimum", "minItems", "maxItems")


def to_json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """Convert one BFCL parameter node (recursively) to JSON Schema."""
    out: dict[str, Any] = {k: node[k] for k in _COPIED if k in node}
    bfcl_type = node.get("type")
    if bfcl_type is not None and bfcl_type != "any":
        json_type = _TYPES.get(bfcl_type)
        if json_type is None:
            raise ValueError(f"expected a BFCL type in {sorted(_TYPES)} or 'any', got {bfcl_type!r}")
        out["type"] = json_type
    if "properties" in node:
        out["properties"] = {k: to_json_schema(v) for k, v in node["properties"].items()}
    if "required" in node:
        out["required"] = list(node["required"])
    if "items" in node:
        out["items"] = to_json_schema(node["items"])
    if "additionalProperties" in node and isinstance(node["additionalProperties"], dict):
        out["additionalProperties"] = to_json_schema(node["additionalProperties"])
    return out


def parameters_schema(doc: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema of a function's keyword arguments: unknown argument names are rejected."""
    schema = to_json_schema(doc.get("parameters") or {"type": "dict", "properties": {}})
    schema["type"] = "object"
    schema.setdefault("properties", {})
    schema["additionalProperties"] = False
    return schema


def tool_schema(doc: dict[str, Any]) -> dict[str, Any]:
    """OpenAI function-tool format of a BFCL function doc."""
    return {"type": "function", "function": {"name": doc["name"], "description": doc.get("description", ""),
                                             "parameters": parameters_schema(doc)}}
