"""The simulator's modules import each other without a cycle (run-time imports, a function's own
included; ``if TYPE_CHECKING:`` blocks aside): each can be read, and loaded, on its own."""
from __future__ import annotations

import ast
from pathlib import Path

SIM = Path(__file__).resolve().parents[2] / "simulator" / "z9" / "sim"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 1:
            if node.module:
                out.add(node.module.split(".")[0])
            else:
                out.update(a.name for a in node.names)
        elif node.level == 0 and (node.module or "").startswith("z9.sim."):
            out.add(node.module.split(".")[2])
    return out


def test_the_simulator_has_no_import_cycle() -> None:
    graph = {p.stem: _imports(p) & {q.stem for q in SIM.glob("*.py")} for p in SIM.glob("*.py")}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        if state.get(m) == 2:
            return
        if state.get(m) == 1:
            cycles.append(path[path.index(m):] + [m])
            return
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            visit(n, path + [m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])
    assert not cycles, cycles
