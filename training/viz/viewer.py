"""Rollout trees as one self-contained HTML page (``trace-gym view trees.jsonl --out trees.html``).

Input: JSONL files, one tree per line: ``RolloutTree.to_dict()``, ``{"step": N, "tree": {...}, ...}`` or the
dict with extra top-level keys beside ``task_id``/``nodes`` (``{"step": N, **tree.to_dict()}``); extra keys
other than ``step`` are shown as the tree's metadata. A directory stands for the ``*.jsonl`` tree files under it.

The page has no network dependency: the data, script and style are inlined, the tree is drawn as SVG by the
page's own script, and every string is inserted as text (never as markup).

Node annotations: the schema of `annotations.py` (``predicted``, ``alloc``, ``root_extra``, ``advantage`` in
``node.meta``), which the trainer, the simulation and the benchmarks all write from the stages' records; any
other ``meta`` keys are listed in the side panel as they are. V̂ (the mean leaf reward under a node) is
computed from the tree itself (`trace_gym.tree_stats.tree_values`).

A leaf counts as a success when its reward is at least 0.5 (rewards are binary by default). A node is coloured
success / failure / mixed by the finished leaves under it, grey when none has finished.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_gym.errors import ConfigError
from trace_gym.tree import RolloutTree
from trace_gym.tree_stats import tree_values

__all__ = ["TreeRecord", "load_trees", "page_data", "render_html", "split_action", "write_viewer"]

SUCCESS_THRESHOLD = 0.5
_TEMPLATE = Path(__file__).with_name("viewer_template.html")
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)
_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL)


@dataclass
class TreeRecord:
    """One tree of a JSONL file, with the wrapper's step and extra keys, and where it came from."""

    tree: RolloutTree
    step: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    source: str = ""


def _holds_trees(path: Path) -> bool:
    """Whether the first line of a JSONL file is a tree (a run folder also holds metrics.jsonl)."""
    with path.open(encoding="utf-8") as fh:
        first = next((line for line in fh if line.strip()), "")
    try:
        obj = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(obj, dict) and ("nodes" in obj or isinstance(obj.get("tree"), dict))


def _input_files(paths: Iterable[str | Path]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = [f for f in sorted(p.rglob("*.jsonl")) if _holds_trees(f)]
            if not found:
                raise ConfigError(f"expected *.jsonl tree files under {p}, got none; fix: pass the files")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise ConfigError(f"expected a tree JSONL file or a directory, got missing path {p}; fix: a run saves "
                              "RUN_DIR/trees.jsonl when log.save_trees is set (all, first_last or N)")
    return files


def load_trees(paths: Iterable[str | Path]) -> list[TreeRecord]:
    """Every tree in the given JSONL files (or directories of them), in file and line order."""
    records: list[TreeRecord] = []
    for path in _input_files(paths):
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    obj = json.loads(line)
                    if not isinstance(obj, dict):
                        raise TypeError(f"a JSON {type(obj).__name__}")
                    inner = obj["tree"] if isinstance(obj.get("tree"), dict) else obj
                    extra = {k: v for k, v in obj.items() if k not in ("tree", "step", "task_id", "nodes")}
                    step = obj.get("step")
                    tree = RolloutTree.from_dict(inner)
                except (ValueError, TypeError, KeyError) as e:
                    raise ConfigError(
                        f"expected a RolloutTree.to_dict() object (or {{'step': N, 'tree': {{...}}}}) on {where}, "
                        f"got {type(e).__name__}: {e}"
                    ) from e
                records.append(TreeRecord(tree, int(step) if isinstance(step, int | float) else None, extra, where))
    return records


def _tool_names(tree: RolloutTree) -> list[str]:
    names = []
    for schema in tree.root.info.get("tools", []) or []:
        fn = schema.get("function", schema) if isinstance(schema, dict) else {}
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names


def split_action(action: str, tool_names: Sequence[str] = ()) -> dict[str, Any]:
    """An action's parts for display: free-text thought, tool calls (pretty JSON or ``tag: body``), answer.

    Display only: the env's own parser decides what the action did; ``info["error"]`` says if it failed.
    """
    calls: list[str] = []
    for body in _TOOL_CALL.findall(action):
        try:
            calls.append(json.dumps(json.loads(body), indent=2, ensure_ascii=False))
        except json.JSONDecodeError:
            calls.append(body.strip())
    rest = _TOOL_CALL.sub("", action)
    for name in tool_names:
        tag = re.compile(rf"<{re.escape(name)}>(.*?)</{re.escape(name)}>", re.DOTALL)
        calls.extend(f"{name}: {body.strip()}" for body in tag.findall(rest))
        rest = tag.sub("", rest)
    answers = [a.strip() for a in _ANSWER.findall(rest)]
    rest = _ANSWER.sub("", rest)
    thoughts = [t.strip() for t in _THINK.findall(rest)]
    rest = _THINK.sub("", rest).strip()
    thought = "\n\n".join(t for t in [*thoughts, rest] if t)
    return {"thought": thought, "calls": calls, "answer": answers[-1] if answers else None}


def _short(value: Any) -> Any:
    """Long lists of ints (token ids) summarised: they are large and unreadable on the page."""
    if isinstance(value, list) and len(value) > 16 and all(isinstance(v, int) for v in value):
        return f"[{len(value)} ints]"
    return value


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else None


def _tree_data(record: TreeRecord, systems: dict[str, int]) -> dict[str, Any]:
    tree = record.tree
    n = len(tree.nodes)
    values, _ = tree_values(tree)
    wins, losses = [0] * n, [0] * n
    # Children always have larger ids than their parent (RolloutTree.add appends), so one reverse pass suffices.
    for node in reversed(tree.nodes):
        if node.is_terminal:
            win = node.reward >= SUCCESS_THRESHOLD
            wins[node.id] += win
            losses[node.id] += not win
        if node.parent is not None:
            wins[node.parent] += wins[node.id]
            losses[node.parent] += losses[node.id]
    tools = _tool_names(tree)
    nodes: list[dict[str, Any]] = []
    for node in tree.nodes:
        info = {k: v for k, v in node.info.items() if k not in ("messages", "tools")}
        meta = dict(node.meta)
        if node.finish_reason is not None:  # the generation's own record, shown beside the annotations
            meta.update(finish_reason=node.finish_reason, prompt_tokens=node.prompt_tokens)
        predicted, alloc = meta.pop("predicted", None), meta.pop("alloc", None)
        advantage, root_extra = meta.pop("advantage", None), meta.pop("root_extra", None)
        nodes.append({
            "id": node.id, "parent": node.parent, "depth": node.depth, "children": node.children,
            "action": node.action, "parts": split_action(node.action, tools) if node.action else None,
            "observation": node.observation, "reward": node.reward,
            "terminated": node.terminated, "truncated": node.truncated,
            "wins": wins[node.id], "losses": losses[node.id],
            "value": _finite(values[node.id]),
            "predicted": _finite(predicted),
            "alloc": alloc if isinstance(alloc, dict) else None,
            "advantage": _finite(advantage), "root_extra": root_extra if isinstance(root_extra, int) else None,
            "tokens": len(node.token_ids) if node.token_ids is not None else info.get("tokens"),
            "info": info, "meta": {k: _short(v) for k, v in meta.items()},
        })
    system = next((m.get("content", "") for m in tree.root.info.get("messages", []) or []
                   if isinstance(m, dict) and m.get("role") == "system"), None)
    root = nodes[0]
    return {
        "task_id": tree.task_id, "step": record.step, "extra": record.extra, "source": record.source,
        "system": systems.setdefault(system, len(systems)) if isinstance(system, str) else None,
        "tools": tools, "nodes": nodes, "leaves": root["wins"] + root["losses"], "wins": root["wins"],
        "mixed": root["wins"] > 0 and root["losses"] > 0,
        "failed": root["losses"] > 0 and root["wins"] == 0,
        "depth": max(nd["depth"] for nd in nodes),
    }


def page_data(records: Sequence[TreeRecord]) -> dict[str, Any]:
    """The JSON the page's script reads: trees with per-node outcome counts, V̂, Ṽ and split actions."""
    systems: dict[str, int] = {}
    trees = [_tree_data(r, systems) for r in records]
    return {"trees": trees, "systems": list(systems), "success_threshold": SUCCESS_THRESHOLD}


def _script_json(data: Any) -> str:
    # Inside <script> only "<" can end the block early ("</script", "<!--"); escaping it (and > &) inside
    # JSON strings is lossless. allow_nan=False: the page parses strict JSON.
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _clean(x: Any) -> Any:
    """NaN/inf (which strict JSON lacks) become null, recursively."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Mapping):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def render_html(records: Sequence[TreeRecord], title: str = "trace-gym rollout trees") -> str:
    """The whole page as a string."""
    head, tail = _TEMPLATE.read_text(encoding="utf-8").split("__DATA__")
    # Substitute the title in the template parts only, so tree text containing "__TITLE__" stays as it is.
    title = html.escape(title)
    data = _script_json(_clean(page_data(records)))
    return head.replace("__TITLE__", title) + data + tail.replace("__TITLE__", title)


def write_viewer(paths: Iterable[str | Path], out: str | Path, title: str | None = None) -> Path:
    """Read tree JSONL files and write the HTML page to ``out``; returns ``out``."""
    paths = list(paths)
    records = load_trees(paths)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(records, title or f"trees: {', '.join(Path(p).name for p in paths)}"),
                   encoding="utf-8")
    return out
