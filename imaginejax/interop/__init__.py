"""Interop with the world outside: the Gymnasium adapter (:mod:`.gym_adapter`), gymnax and brax
environments (:func:`as_gymnax`, :func:`as_brax`), Minari datasets
(:mod:`.minari_io`) and the reference benchmark's files (:mod:`.reference`).

These readers and writers sit above the environments, the data layer and the sentence encoder: they
ask the registry for an environment's state width and predicates and embed instruction strings.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    """``as_gymnax`` (:mod:`.gymnax_env`) and ``as_brax`` (:mod:`.brax_env`), imported on first use: gymnax
    and brax are optional packages (without gymnax, ``as_gymnax`` raises
    :class:`~imaginejax.training.progress.MissingDependency` naming its install command)."""
    if name == "as_gymnax":
        from imaginejax.interop.gymnax_env import as_gymnax

        return as_gymnax
    if name == "as_brax":
        from imaginejax.interop.brax_env import as_brax

        return as_brax
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
