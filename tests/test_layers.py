"""No module imports from a higher layer (ARCHITECTURE.md's table), lazy imports inside functions included.

A grader type that lives beside what it grades (`graders.registry.PLUGIN_BUILTIN`) is in the higher of its
package's layer and the graders', and nothing but the registry, by name, may load it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from agentrft.graders.registry import PLUGIN_BUILTIN

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "agentrft"
# layer 1's leaf helpers, top-level modules beside `agentrft.types` (ARCHITECTURE.md names each)
LEAVES = ("types", "inputs", "arith", "http_retry", "memory", "openai_rows", "pairs", "precision", "step_metrics")


def _layers() -> dict[str, int]:
    """Top-level package or module -> its layer, from ARCHITECTURE.md's table."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    layers = {name: int(n) for n, name in re.findall(r"^\| (\d+) \| `agentrft\.([a-z_]+)`", text, re.M)}
    assert all(f"`{leaf}.py`" in text for leaf in LEAVES), "ARCHITECTURE.md names every leaf helper of layer 1"
    layers.update({leaf: 1 for leaf in LEAVES})
    return layers


def _module(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _imports(path: Path) -> set[str]:
    """Every agentrft module ``path`` imports (statements anywhere in the file)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            out.update(n for n in names if n.startswith("agentrft."))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("agentrft."))
    return out


def _layer(module: str, layers: dict[str, int]) -> int:
    top = module.split(".")[1]
    assert top in layers, f"{module}: package {top!r} has no layer in ARCHITECTURE.md"
    return max(layers[top], layers["graders"]) if module in PLUGIN_BUILTIN.values() else layers[top]


def test_no_module_imports_from_a_higher_layer() -> None:
    layers = _layers()
    known = {_module(p) for p in PACKAGE.rglob("*.py")}
    upward: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        me = _module(path)
        if me == "agentrft":
            continue
        mine = _layer(me, layers)
        for target in sorted(_imports(path)):
            if target not in known:  # `from agentrft.x import name`: the name, not a module
                continue
            if _layer(target, layers) > mine or (target in PLUGIN_BUILTIN.values() and target != me):
                upward.append(f"{me} (layer {mine}) imports {target} (layer {_layer(target, layers)})")
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_the_layers_are_those_of_the_packages_that_exist() -> None:
    layers = _layers()
    tops = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    tops |= {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert tops == set(layers), f"in the package, not in the table: {tops - set(layers)}; gone: {set(layers) - tops}"
    assert layers["types"] < layers["graders"] < layers["train"] < layers["cli"]
