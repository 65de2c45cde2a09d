"""The package's import direction, as docs/ARCHITECTURE.md writes it: every import of a glm53_flash
module (at the top of a file or inside a function) goes to the same folder or to one lower in
LAYERS, and no two modules import each other in a circle."""

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "glm53_flash"
ARCHITECTURE = PACKAGE.parent / "docs" / "ARCHITECTURE.md"

# Lowest first. "(root)" is glm53_flash/__init__.py, the public API over everything.
LAYERS = ("core", "tasks", "data", "model", "verifier", "evaluation", "train", "report", "vision", "experiments",
          "benchmarks", "web", "hf", "commands", "cli", "(root)")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: Path, known: set[str]) -> set[str]:
    """The glm53_flash modules `path` imports (a name imported from a package counts as its submodule
    when there is one)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("glm53_flash"):
            assert node.level == 0, f"{path}: relative import (the package imports absolutely)"
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in known else node.module)
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}:{node.lineno}: relative import (the package imports absolutely)")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("glm53_flash"))
    return found


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(root)"


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, set(known)) for name, path in known.items()}


def test_every_folder_has_a_layer():
    assert {layer(m) for m in modules()} == set(LAYERS)


@pytest.mark.slow
def test_imports_go_down_the_layers_or_stay_in_their_folder():
    rank = {name: index for index, name in enumerate(LAYERS)}
    upward = sorted(f"{a} -> {b}" for a, targets in graph().items() for b in targets
                    if rank[layer(b)] > rank[layer(a)])
    assert upward == []


@pytest.mark.slow
def test_no_module_imports_itself_through_others():
    edges = graph()
    state: dict[str, int] = defaultdict(int)  # 0 new, 1 on the path, 2 done
    circles = []

    def visit(node, path):
        state[node] = 1
        for target in sorted(edges.get(node, ())):
            if target == node or target not in edges:
                continue
            if state[target] == 1:
                circles.append(path[path.index(target):] + [target])
            elif state[target] == 0:
                visit(target, path + [target])
        state[node] = 2

    for node in sorted(edges):
        if state[node] == 0:
            visit(node, [node])
    assert circles == []


def test_the_architecture_page_states_the_same_order():
    text = ARCHITECTURE.read_text()
    match = re.search(r"<!-- layers: (.*?) -->", text)
    assert match, "docs/ARCHITECTURE.md names the layer order in a <!-- layers: ... --> line"
    assert tuple(name.strip() for name in match.group(1).split("<")) == LAYERS


@pytest.mark.slow
@pytest.mark.parametrize("lower,higher", [("tasks", "verifier"), ("report", "experiments"), ("core", "model"),
                                          ("evaluation", "web")])
def test_the_named_rules_hold(lower, higher):
    """The rules the layers exist for: the tasks know nothing of the verifier, reports nothing of the
    pipeline that writes their data, the receipts nothing of the model, the CLI's rules nothing of the
    server."""
    offenders = sorted(f"{a} -> {b}" for a, targets in graph().items() for b in targets
                       if layer(a) == lower and layer(b) == higher)
    assert offenders == []
