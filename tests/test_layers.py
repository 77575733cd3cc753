"""The import graph: layers only import downward, no module cycles, pysyncobj only behind the Raft adapter.

The layer order is docs/architecture.md's "Layout" table (`raftkv.dev.import_graph.LAYERS`).
"""

from __future__ import annotations

import pytest

from raftkv.dev.import_graph import ROOT, cycles, graph, modules, upward_imports


def test_no_module_imports_a_higher_layer():
    assert upward_imports(graph()) == []


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_only_the_raft_adapter_touches_pysyncobj():
    touching = sorted(str(path.relative_to(ROOT)) for path in modules().values()
                      if "pysyncobj" in path.read_text() or "_SyncObj__" in path.read_text())
    assert touching and all(p.startswith("raftkv/raft/") for p in touching), touching


@pytest.mark.parametrize("edges, expected", [
    ({"raftkv.core.a": {"raftkv.node.b"}, "raftkv.node.b": set()}, ["raftkv.core.a -> raftkv.node.b"]),
    ({"raftkv.node.b": {"raftkv.core.a"}, "raftkv.core.a": set()}, []),
])
def test_the_layer_check_sees_an_upward_import(edges, expected):
    assert upward_imports(edges) == expected


def test_the_cycle_check_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
