"""Environments and their registry.

``env, params = make(name, level, embed=True)`` returns a stateless environment object and the pytree of
the level's task table (see ARCHITECTURE.md, "Contracts: Environment").
"""

from __future__ import annotations

from typing import Any, Callable

ENV_LEVELS: dict[str, tuple[str, ...]] = {
    "clevr": ("train", "rephrase", "easy", "hard"),
    "babyai": ("train", "rephrase", "easy", "hard"),
    "cheetah": ("train", "rephrase", "easy", "hard"),
    "metaworld": ("train", "rephrase", "easy", "hard"),
}


def _make_clevr(level: str, embed: bool, **options: Any) -> tuple[Any, Any]:
    from imaginejax.envs.clevr.env import CLEVRRobot, make_params

    return CLEVRRobot(**options), make_params(level, embed=embed)


def _make_babyai(level: str, embed: bool, **options: Any) -> tuple[Any, Any]:
    from imaginejax.envs.babyai.env import BabyAI, make_params

    return BabyAI(**options), make_params(level, embed=embed)


def _make_cheetah(level: str, embed: bool, **options: Any) -> tuple[Any, Any]:
    from imaginejax.envs.cheetah.env import HalfCheetah, make_params

    return HalfCheetah(**options), make_params(level, embed=embed)


def _make_metaworld(level: str, embed: bool, **options: Any) -> tuple[Any, Any]:
    from imaginejax.envs.metaworld.env import MetaWorld, make_params

    return MetaWorld(**options), make_params(level, embed=embed)


_FACTORIES: dict[str, Callable[..., tuple[Any, Any]]] = {
    "clevr": _make_clevr, "babyai": _make_babyai, "cheetah": _make_cheetah, "metaworld": _make_metaworld}


def registered() -> tuple[str, ...]:
    """Names accepted by :func:`make`."""
    return tuple(sorted(_FACTORIES))


def make(name: str, level: str, *, embed: bool = True, **options: Any) -> tuple[Any, Any]:
    """Builds an environment and the parameters of one task level.

    Args:
      name: registry key, e.g. ``"clevr"``.
      level: ``"train"``, ``"rephrase"``, ``"easy"`` or ``"hard"``.
      embed: embed the instruction table with the sentence encoder (E = 384); with False, E = 0 and the
        observation is the bare state.
      **options: passed to the environment's constructor, e.g. ``backend="mujoco"`` or ``"mjx"`` for
        MuJoCo-based environments (default ``"auto"``: MJX on an accelerator, MuJoCo C on a CPU).
    Returns: ``(env, params)``.
    Raises: ValueError naming the valid choices for an unknown name or level.
    """
    if name not in _FACTORIES:
        raise ValueError(f"unknown environment {name!r}; valid names: {', '.join(registered())}")
    levels = ENV_LEVELS[name]
    if level not in levels:
        raise ValueError(f"unknown level {level!r} for environment {name!r}; valid levels: {', '.join(levels)}")
    return _FACTORIES[name](level, embed, **options)


__all__ = ["ENV_LEVELS", "make", "registered"]
