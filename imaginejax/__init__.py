"""ImagineJAX: offline RL from real and imaginary rollouts, natively in JAX.

``imaginejax.fit`` (:mod:`imaginejax.api`) trains from Python; ``imaginejax.Policy``
(:mod:`imaginejax.policy`) loads and runs a trained policy.
"""

from typing import Any

__version__ = "0.1.0"

# Resolved on first use, so importing a lower layer never loads the application (tests/test_layers.py).
_ENTRY_POINTS = {"fit": "imaginejax.api", "Policy": "imaginejax.policy"}


def __getattr__(name: str) -> Any:
    if name in _ENTRY_POINTS:
        import importlib

        return getattr(importlib.import_module(_ENTRY_POINTS[name]), name)
    raise AttributeError(f"module 'imaginejax' has no attribute {name!r}")


__all__ = ["Policy", "__version__", "fit"]
