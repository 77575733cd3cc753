"""The import graph of raftkv's packages and the layers it must respect (docs/architecture.md's
"Layout" table): what `tests/test_layers.py` checks and `scripts/architecture.py` draws."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("raftkv", "learners", "spark_connector")
# lowest first: a module may import its own layer and the ones before it
LAYERS = ("raftkv.core", "raftkv.failpoints", "raftkv.powerloss", "raftkv.storage", "raftkv.security", "raftkv.backup", "raftkv.raft", "raftkv.api", "raftkv.meta", "raftkv.console", "raftkv.node", "raftkv.client",
          "learners", "raftkv.dev", "raftkv.chaos", "raftkv.cli", "spark_connector", "raftkv")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports_of(path: Path, known: dict[str, Path]) -> set[str]:
    """Our modules that `path` imports, anywhere in it (functions included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        out |= {name for name in names if name in known and name.split(".")[0] in PACKAGES}
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    edges = {name: imports_of(path, known) for name, path in known.items()}
    for name, targets in edges.items():  # `from pkg import module` names the module, not also pkg
        edges[name] = {t for t in targets if not any(o.startswith(t + ".") for o in targets)} - {name}
    return edges


def layer(module: str) -> int:
    """The layer of the longest prefix that names the module's package."""
    matches = [prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")]
    return LAYERS.index(max(matches, key=len))


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {t}" for m, targets in edges.items() for t in targets
                  if layer(t) > layer(m) and m not in ("raftkv", "raftkv.__main__"))


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found
