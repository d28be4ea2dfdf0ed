"""The package's import graph: no cycles, and the layers' direction (docs/design.md).

Every ``import`` and ``from ... import`` in ``src/gpufrac`` counts, also those under
``TYPE_CHECKING`` and inside functions: a cycle hidden there is still a cycle for a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parents[2] / "src"
# a layer may import its own and those listed after it (lower layers), never one listed before it
LAYERS = (
    ("cli", "api"),
    ("runtime", "serving", "sdk"),
    ("planning",),
    ("devices",),
    ("model",),
    ("config", "errors"),
)


def graph() -> dict[str, set[str]]:
    mods: dict[str, Path] = {}
    for f in SRC.rglob("*.py"):
        name = ".".join(f.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        mods[name] = f
    out: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names]
                targets = [t for t in subs if t in mods] or [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            out[m] |= {t for t in targets if t in mods and t != m}
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None
    for i, names in enumerate(LAYERS):
        if parts[1] in names:
            return i
    return None


def test_there_is_no_import_cycle() -> None:
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_layers_import_only_downwards() -> None:
    wrong = []
    for m, targets in graph().items():
        mine = layer(m)
        for t in targets:
            theirs = layer(t)
            if mine is not None and theirs is not None and theirs < mine:
                wrong.append(f"{m} -> {t}")
    assert wrong == []
