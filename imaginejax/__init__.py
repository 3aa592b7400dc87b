"""ImagineJAX: offline RL from real and imaginary rollouts, natively in JAX.

``imaginejax.fit`` trains from Python and returns the results; ``imaginejax.table`` and ``imaginejax.curves``
summarise them; ``imaginejax.Policy.from_results`` / ``Policy.load`` give a trained policy;
``imaginejax.load_results`` reads a workspace.
"""

from typing import Any

from imaginejax.core import __version__

# Resolved on first use, so importing a lower layer never loads the application (tests/test_layers.py).
_ENTRY_POINTS = {"fit": "imaginejax.api:fit", "Policy": "imaginejax.bench.policy:Policy",
                 "table": "imaginejax.bench.report:table", "curves": "imaginejax.bench.figures:curves",
                 "load_results": "imaginejax.bench.results:load_sweep"}


def __getattr__(name: str) -> Any:
    if name in _ENTRY_POINTS:
        import importlib

        module, attribute = _ENTRY_POINTS[name].split(":")
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'imaginejax' has no attribute {name!r}")


__all__ = ["Policy", "__version__", "curves", "fit", "load_results", "table"]
