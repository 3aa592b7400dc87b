"""Imports run one way: a module may import only from its own layer or the layers below it.

The table below is the layer order of docs/architecture.md. Every module's imports (top-level and
function-local, parsed with ``ast``, never executed) are checked against it.
"""

from __future__ import annotations

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The parser of modules and imports is tools/house.py's (the drawing of the house reads the same graph).
sys.path.insert(0, str(ROOT / "tools"))
import house  # noqa: E402

ROOT_PACKAGE = "imaginejax"
# (rank, layer, module prefixes). A module belongs to the layer of its longest matching prefix; it may
# import modules of its own rank or lower.
LAYERS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (0, "core", ("imaginejax", "imaginejax.files", "imaginejax.paths", "imaginejax.progress",
                 "imaginejax.runlog", "imaginejax.weights", "imaginejax.data.types", "imaginejax.data.errors")),
    (1, "envs", ("imaginejax.envs",)),
    (2, "lang", ("imaginejax.lang",)),
    (3, "data", ("imaginejax.data",)),
    (4, "algos", ("imaginejax.algos",)),
    (5, "engine", ("imaginejax.engine", "imaginejax.sweep", "imaginejax.checkpoint", "imaginejax.evaluation",
                   "imaginejax.distributed")),
    (6, "imaginer", ("imaginejax.imaginer",)),
    (7, "interop", ("imaginejax.interop",)),
    # The imaginer's quality study is a command-line driver over bench's data cache, like bench itself.
    (8, "application", ("imaginejax.cli", "imaginejax.config", "imaginejax.bench", "imaginejax.report",
                        "imaginejax.figures", "imaginejax.demo", "imaginejax.stats", "imaginejax.results",
                        "imaginejax.presets", "imaginejax.imaginer.study", "imaginejax.api", "imaginejax.policy",
                        "imaginejax.frames")),
)


def layer_of(module: str) -> tuple[int, str]:
    """(rank, layer name) of a dotted module name, by its longest prefix in :data:`LAYERS`."""
    return house.layer_of(module, LAYERS, ROOT_PACKAGE)


def source_modules() -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every module of the installed package (pyproject's package-dir)."""
    return house.source_modules(ROOT)


imported_modules = house.imported_modules


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
    ("imaginejax.envs.clevr.env", "imaginejax.files", True),
    ("imaginejax.envs.clevr.env", "imaginejax.lang", False),
    ("imaginejax.data.io", "imaginejax.envs", True),
    ("imaginejax.data.types", "imaginejax.envs", False),
    ("imaginejax.algos.bc", "imaginejax.engine", False),
    ("imaginejax.imaginer.quality", "imaginejax.bench", False),
    ("imaginejax.cli", "imaginejax.interop.minari", True),
])
def test_layer_order_by_hand(module, target, allowed):
    assert (layer_of(target)[0] <= layer_of(module)[0]) == allowed
