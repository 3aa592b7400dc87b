"""Imports run one way: a module may import only from its own layer or the layers below it.

The table below is the layer order of docs/architecture.md. Every module's imports (top-level and
function-local, parsed with ``ast``, never executed) are checked against it.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Source folder -> the package it installs as (pyproject.toml, package-dir).
PACKAGE_DIRS = {"imaginejax": "imaginejax", "envs": "imaginejax.envs", "data": "imaginejax.data",
                "algos": "imaginejax.algos"}

ROOT_PACKAGE = "imaginejax"
# (rank, layer, module prefixes). A module belongs to the layer of its longest matching prefix; it may
# import modules of its own rank or lower.
LAYERS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    # One rule per folder: imaginejax/core, envs/, lang/, data/, algos/, imaginejax/training,
    # imaginejax/imaginer and imaginejax/interop are each one layer.
    (0, "core", ("imaginejax", "imaginejax.core", "imaginejax.data.types", "imaginejax.data.errors")),
    (1, "envs", ("imaginejax.envs",)),
    (2, "lang", ("imaginejax.lang",)),
    (3, "data", ("imaginejax.data",)),
    (4, "algos", ("imaginejax.algos",)),
    (5, "training", ("imaginejax.training",)),
    (6, "imaginer", ("imaginejax.imaginer",)),
    (7, "interop", ("imaginejax.interop",)),
    # imaginejax/bench: one rank per module, in the order of the protocol, so that no two of its modules
    # can import each other.
    (8, "bench.config", ("imaginejax.bench", "imaginejax.bench.config", "imaginejax.presets")),
    (9, "bench.stats", ("imaginejax.bench.stats",)),
    (10, "bench.results", ("imaginejax.bench.results",)),
    (11, "bench.workspace", ("imaginejax.bench.workspace",)),
    (12, "bench.report", ("imaginejax.bench.report",)),
    (13, "bench.figures", ("imaginejax.bench.figures",)),
    (14, "bench.datasets", ("imaginejax.bench.datasets",)),
    (15, "bench.sweeps", ("imaginejax.bench.sweeps",)),
    (16, "bench.policy", ("imaginejax.bench.policy",)),
    (17, "bench.frames", ("imaginejax.bench.frames",)),
    (18, "bench.protocol", ("imaginejax.bench.protocol",)),
    # The entry points at the top of imaginejax/: Python's fit(), the demo, the command line.
    (19, "api", ("imaginejax.api",)),
    (20, "demo", ("imaginejax.demo",)),
    (21, "cli", ("imaginejax.cli", "imaginejax.__main__")),
)


def layer_of(module: str) -> tuple[int, str]:
    """(rank, layer name) of a dotted module name, by its longest prefix in :data:`LAYERS`."""
    best: tuple[int, int, str] = (-1, -1, "")
    for rank, name, prefixes in LAYERS:
        for prefix in prefixes:
            # The root package names only its own __init__: a new top-level module needs its own entry.
            covers = module == prefix or (prefix != ROOT_PACKAGE and module.startswith(prefix + "."))
            if covers and len(prefix) > best[0]:
                best = (len(prefix), rank, name)
    if best[0] < 0:
        raise LookupError(f"{module} is in no layer of tests/test_layers.py LAYERS; add its prefix there")
    return best[1], best[2]


def source_modules() -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every module of the installed package."""
    modules = {}
    for folder, package in PACKAGE_DIRS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *parts))
            modules[name.removesuffix(".__init__")] = path
    return modules


def imported_modules(module: str, path: pathlib.Path, known: set[str]) -> list[tuple[int, str]]:
    """(line, dotted target) of every ``imaginejax`` import in a file, function-local ones included;
    ``from package import name`` counts as importing ``package.name`` when that is a module."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                found.append((node.lineno, f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base))
    return sorted({(line, target) for line, target in found if target.split(".")[0] == "imaginejax"})


def violations() -> list[str]:
    """Every import against the layer order, as 'file:line: module (layer) imports target (layer)'."""
    modules = source_modules()
    found = []
    for module, path in modules.items():
        rank, layer = layer_of(module)
        for line, target in imported_modules(module, path, set(modules)):
            target_rank, target_layer = layer_of(target)
            if target_rank > rank:
                found.append(f"{path.relative_to(ROOT)}:{line}: {module} ({layer}) imports {target} "
                             f"({target_layer})")
    return found


def test_every_module_has_a_layer():
    for module in source_modules():
        layer_of(module)
    with pytest.raises(LookupError, match="imaginejax.newmodule is in no layer"):
        layer_of("imaginejax.newmodule")


def test_imports_run_one_way():
    found = violations()
    assert not found, f"{len(found)} imports against the layer order:\n" + "\n".join(found)


@pytest.mark.parametrize("module,target,allowed", [
    ("imaginejax.envs.clevr.env", "imaginejax.envs.base", True),
    ("imaginejax.envs.clevr.env", "imaginejax.core.files", True),
    ("imaginejax.envs.clevr.env", "imaginejax.lang", False),
    ("imaginejax.data.io", "imaginejax.envs", True),
    ("imaginejax.data.types", "imaginejax.envs", False),
    ("imaginejax.algos.bc", "imaginejax.training.loop", False),
    ("imaginejax.bench.results", "imaginejax.bench.policy", False),
    ("imaginejax.bench.policy", "imaginejax.bench.protocol", False),
    ("imaginejax.imaginer.study", "imaginejax.bench.datasets", False),
    ("imaginejax.demo", "imaginejax.cli", False),
    ("imaginejax.imaginer.quality", "imaginejax.bench.protocol", False),
    ("imaginejax.cli", "imaginejax.interop.minari", True),
])
def test_layer_order_by_hand(module, target, allowed):
    assert (layer_of(target)[0] <= layer_of(module)[0]) == allowed
