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
