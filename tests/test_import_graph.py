"""The import graph of the package: no cycle among module-level imports (type-only ones included); the core
(``trace_gym/`` itself) imports neither torch, ``agents`` nor ``training`` anywhere, lazily included, so envs,
trees, snapshots, the checker and the env server run on the base install; ``training/`` is a stack of layers."""

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


def _imports(path: Path, modules: Container[str] = (), lazy: bool = False) -> list[str]:
    """Modules imported by statements of the module body, under ``if`` (``TYPE_CHECKING``) and ``try`` too, and
    with ``lazy`` also those inside functions and classes (a deferred import still makes the two modules depend
    on each other; it only delays the dependency to a call). ``from pkg import sub`` depends on ``pkg.sub``
    alone when that is one of ``modules``."""
    names: list[str] = []
    tree = ast.parse(path.read_text())
    nodes: list[ast.stmt] = [n for n in ast.walk(tree) if isinstance(n, ast.stmt)] if lazy else list(tree.body)
    while nodes:
        node = nodes.pop()
        if not lazy and isinstance(node, ast.If | ast.Try):
            nodes += [*node.body, *node.orelse, *getattr(node, "finalbody", []),
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


def _graph(lazy: bool) -> dict[str, set[str]]:
    modules = _modules()
    return {m: {n for n in _imports(p, modules, lazy) if n in modules and n != m} for m, p in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, str] = {}
    cycles: list[str] = []

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
    return cycles


def test_the_module_graph_has_no_cycle_lazy_imports_included():
    assert _cycles(_graph(lazy=True)) == []


def test_the_lazy_graph_sees_an_import_inside_a_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import json\n\n\ndef f():\n    from trace_gym.integrations import env_server\n"
                      "    if True:\n        import trace_gym.tree\n")
    known = {"trace_gym.integrations.env_server", "trace_gym.tree"}
    assert _imports(module, known) == ["json"]
    assert sorted(_imports(module, known, lazy=True)) == ["json", *sorted(known)]


# training/ as a stack, bottom first: a module imports (at module level or inside a function) only modules of its
# own layer's package or of layers below. Packages in one layer are siblings and never import each other.
# allocation, rollout and update meet only in the step; the viewer reads what the step writes, never the step.
TRAINING_LAYERS: tuple[tuple[str, ...], ...] = (
    ("config", "stats"),
    ("allocation", "rollout", "update"),
    ("step", "viz"),
    ("simulation", "driver", "variants"),
    ("cli", "integrations"),
)


def _all_imports(path: Path) -> list[str]:
    """Every module an import statement anywhere in the file names (lazy imports included)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return names


def _part(module: str) -> str | None:
    """The training package (or top-level module) a module belongs to: ``allocation``, ``config``, ..."""
    prefix = "trace_gym.training."
    return module[len(prefix):].split(".")[0] if module.startswith(prefix) else None


def test_training_is_a_stack_of_layers():
    layer_of = {part: i for i, layer in enumerate(TRAINING_LAYERS) for part in layer}
    modules = {m: p for m, p in _modules().items() if _part(m) is not None}
    assert {_part(m) for m in modules} == set(layer_of), "every training package has a layer"
    wrong = []
    for module, path in sorted(modules.items()):
        here = _part(module)
        for name in _all_imports(path):
            there = _part(name)
            if there is None or there == here or name not in modules:
                continue
            if layer_of[there] >= layer_of[here]:
                wrong.append(f"{module} -> {name}")
    assert wrong == []


def test_the_core_never_imports_torch_agents_or_training():
    heavy = ("torch", "transformers", "trace_gym.training", "trace_gym.agents")
    core = [m for m in _modules() if not m.startswith(("trace_gym.training", "trace_gym.agents",
                                                      "trace_gym.environments"))]
    found = {m: [n for n in _all_imports(_modules()[m]) if n.startswith(heavy)] for m in core}
    assert {m: n for m, n in found.items() if n} == {}
