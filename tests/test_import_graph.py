"""The import graph of the package: no cycle among module-level imports (type-only ones included), and the core
(``trace_gym/`` itself) imports neither ``training`` nor torch at module level, so envs, trees, snapshots, the
checker and the env server load on the base install."""

from __future__ import annotations

import ast
from collections.abc import Container
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# folder -> the package it installs as (pyproject's package-dir)
PACKAGES = {"trace_gym": "trace_gym", "training": "trace_gym.training", "agents": "trace_gym.agents",
            "environments": "trace_gym.environments"}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder)
            parts = [package, *rel.with_suffix("").parts]
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _top_level_imports(path: Path, modules: Container[str] = ()) -> list[str]:
    """Modules imported by statements of the module body, under ``if`` (``TYPE_CHECKING``) and ``try`` too, not
    inside functions or classes (a deferred import is how a module keeps a heavy dependency optional).
    ``from pkg import sub`` depends on ``pkg.sub`` alone when that is one of ``modules``."""
    names: list[str] = []
    body = list(ast.parse(path.read_text()).body)
    while body:
        node = body.pop()
        if isinstance(node, ast.If | ast.Try):
            body += [*node.body, *node.orelse, *getattr(node, "finalbody", []),
                     *(s for h in getattr(node, "handlers", []) for s in h.body)]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            matched = [s for s in subs if s in modules]
            names += matched
            if len(matched) < len(subs):  # names defined in the module itself
                names.append(node.module)
    return names


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: {n for n in _top_level_imports(p, modules) if n in modules and n != m} for m, p in modules.items()}


def test_the_module_graph_has_no_cycle():
    graph, state, cycles = _graph(), {}, []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = "open"
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                cycles.append(" -> ".join([*stack[stack.index(n):], n]))
            elif n not in state:
                visit(n, [*stack, n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_the_core_imports_no_training_and_no_torch_at_module_level():
    heavy = ("torch", "transformers", "trace_gym.training")
    core = [m for m in _modules() if not m.startswith(("trace_gym.training", "trace_gym.agents",
                                                      "trace_gym.environments"))]
    found = {m: [n for n in _top_level_imports(_modules()[m]) if n.startswith(heavy)] for m in core}
    assert {m: n for m, n in found.items() if n} == {}
